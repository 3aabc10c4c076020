// Command dsproxy is a dual-stack Kubernetes service proxy that replaces kube-proxy.
// It takes kube-proxy's flags and KubeProxyConfiguration file.
package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/component-base/logs"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/app"
	"github.com/dsproxy/dsproxy/pkg/config"
	"github.com/dsproxy/dsproxy/pkg/hugeheap"
	"github.com/dsproxy/dsproxy/pkg/kubeclient"
)

// loggingApplied is set once the configured log format is in place.
var loggingApplied bool

func main() {
	// As kube-proxy: what libraries write with the standard log package goes
	// through klog, in the configured format once it is applied.
	logs.InitLogs()
	err := run(os.Args[1:])
	if err != nil && loggingApplied && !errors.Is(err, pflag.ErrHelp) {
		// Once the log format is applied, the reason to exit is a log entry in
		// it, with kube-proxy's message; before, it is printed as is.
		klog.ErrorS(err, "command failed")
	}
	// Buffered log output (--log-*-info-buffer-size) is written before exit.
	klog.Flush()
	if err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintf(os.Stdout, "Usage of dsproxy (kube-proxy compatible flags):\n%s", config.FlagUsages())
			os.Exit(0)
		}
		if !loggingApplied {
			fmt.Fprintln(os.Stderr, "dsproxy:", err)
		}
		os.Exit(1)
	}
}

func run(args []string) error {
	cfg, err := config.Parse(args)
	if err != nil {
		return err
	}
	if done, err := app.PrintVersion(os.Stdout, cfg.Version); done || err != nil {
		return err
	}
	// As kube-proxy: the feature gates set first (before the logging options,
	// which they gate), the log format next, then the flags logged, then the
	// configuration validated (its errors are log entries in that format).
	if _, err := cfg.FeatureGate(); err != nil {
		return fmt.Errorf("invalid configuration: featureGates (--feature-gates): %w", err)
	}
	if err := app.ApplyLogging(cfg); err != nil {
		return fmt.Errorf("logging configuration: %w", err)
	}
	loggingApplied = true
	cfg.LogFeatureGateWarnings(klog.Background())
	if v := klog.V(1); v.Enabled() { // as kube-proxy's cliflag.PrintFlags
		for _, name := range slices.Sorted(maps.Keys(cfg.Flags)) {
			v.Infof("FLAG: --%s=%q", name, cfg.Flags[name])
		}
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid configuration:\n%w", err)
	}
	for _, w := range cfg.Warnings {
		klog.InfoS("Configuration warning", "warning", w)
	}
	// SIGTERM stops the daemon without touching the rules, so traffic keeps flowing
	// until the next dsproxy (or anything else) takes over.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if cfg.WriteConfigTo != "" {
		return app.WriteConfig(cfg)
	}
	if cfg.Cleanup {
		return app.Cleanup(ctx, cfg.CleanupKubeProxy, cfg.IPVS.ExcludeCIDRs)
	}
	if cfg.InitOnly {
		return app.InitOnly(cfg)
	}
	if cfg.ConfigFile != "" {
		// As kube-proxy: a write to the file (or its rename) ends the daemon, and
		// its DaemonSet starts it again with the new configuration.
		var stopWatch func()
		if ctx, stopWatch, err = app.WatchConfigFile(ctx, cfg.ConfigFile); err != nil {
			return err
		}
		defer stopWatch()
	}
	adviseHugeHeap()
	rc, err := app.RESTConfig(cfg)
	if err != nil {
		return err
	}
	client, err := kubeclient.New(rc)
	if err != nil {
		return fmt.Errorf("API client: %w", err)
	}
	d, err := app.New(ctx, cfg, client)
	if err != nil {
		if cause := app.StopCause(ctx); cause != nil {
			return cause // the configuration file changed while it started
		}
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			klog.InfoS("dsproxy stopped while starting")
			return nil
		}
		return err
	}
	defer d.Close()
	app.ApplyOOMScoreAdj(cfg.OOMScoreAdj)
	klog.InfoS("dsproxy starting", "version", app.Version(), "families", fmt.Sprint(d.Families()))
	err = d.Run(ctx)
	klog.InfoS("dsproxy stopped; rules left in place")
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return app.StopCause(ctx)
}

// hugeHeapRegion is how much heap address space the daemon advises for huge
// pages before its cold start: more than the heap's peak at 30k Services (about
// 360 MiB). By default it does so only where a page fault is costly
// (hugeheap.AdviseIfFaultsCostly); DSPROXY_HEAP_HUGE_PAGES=true advises without
// timing faults, =false leaves the heap as Go maps it.
const hugeHeapRegion = 1 << 30

func adviseHugeHeap() {
	advise := hugeheap.AdviseIfFaultsCostly
	if v := os.Getenv("DSPROXY_HEAP_HUGE_PAGES"); v != "" {
		on, err := strconv.ParseBool(v)
		if err != nil {
			klog.InfoS("Ignoring DSPROXY_HEAP_HUGE_PAGES: not a boolean; heap left without huge pages", "value", v)
			return
		}
		if !on {
			klog.V(2).InfoS("Heap left without huge pages", "DSPROXY_HEAP_HUGE_PAGES", v)
			return
		}
		advise = hugeheap.Advise
	}
	r := advise(hugeHeapRegion)
	if r.Advised == 0 {
		klog.V(2).InfoS("Heap left without huge pages", "reason", r.Skipped)
		return
	}
	klog.V(2).InfoS("Heap advised for huge pages", "bytes", r.Advised, "pageFault", r.FaultCost)
}
