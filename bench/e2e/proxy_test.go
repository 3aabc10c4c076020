//go:build e2e && netns

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"k8s.io/apimachinery/pkg/watch"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dsproxy/dsproxy/pkg/proxier/nftables"
	"github.com/dsproxy/dsproxy/test/e2e/framework"
	"github.com/dsproxy/dsproxy/test/netns"
)

type binaries struct{ dsproxy, kubeProxy string }

const clusterCIDRs = "10.64.0.0/16,fd00:64::/56"

// serviceCIDRs (hack/controlplane) are unreachable in the node: before a
// proxy programs a ClusterIP, a connection to it fails at once (ICMP
// unreachable) instead of leaving the node.
var serviceCIDRs = []string{"10.96.0.0/16", "fd00:96::/112"}

// proc is one proxy process, started with `ip netns exec`, which execs: the
// pid is the proxy's.
type proc struct {
	cmd    *exec.Cmd
	log    string
	done   chan struct{}
	err    error
	ctx    context.Context // cancelled when the process exits
	cancel context.CancelCauseFunc
	spec   proxySpec
}

// changes and pairs are the W2 / W3 sample counts for p: kube-proxy's may be
// capped (-kube-proxy-changes, -kube-proxy-pairs), its changes taking seconds each
// at 10k Services and more.
func (p *proc) changes() int { return capped(p.spec, *flagChanges, *flagKPChanges) }
func (p *proc) pairs() int   { return capped(p.spec, *flagPairs, *flagKPPairs) }

func capped(spec proxySpec, n, kpCap int) int {
	if spec.Name == "kube-proxy" && kpCap > 0 {
		return min(n, kpCap)
	}
	return n
}

func startProxy(dir string, node *netns.NS, nodeName, kubeconfig string, bins binaries, spec proxySpec) (*proc, error) {
	var args, env []string
	switch spec.Name {
	case "dsproxy":
		args = []string{bins.dsproxy,
			"--kubeconfig", kubeconfig,
			"--hostname-override", nodeName,
			"--cluster-cidr", clusterCIDRs,
			"--metrics-bind-address", "127.0.0.1:10249",
			"--proxy-mode", spec.Mode,
		}
		args = append(args, strings.Fields(*flagDSArgs)...)
		if kv := strings.Fields(*flagDSEnv); len(kv) > 0 {
			for _, e := range kv {
				if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
					return nil, fmt.Errorf("-dsproxy-env: %q is not KEY=VALUE", e)
				}
			}
			env = append(os.Environ(), kv...)
		}
		if *flagProfiles != "" {
			args = append(args, "--profiling")
		}
	case "kube-proxy":
		mode := spec.Mode
		if mode == "iptables-legacy" {
			mode = "iptables"
			bin, err := legacyIptables(dir)
			if err != nil {
				return nil, err
			}
			env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		}
		cfg := filepath.Join(dir, "kube-proxy.yaml")
		y := framework.KubeProxyConfig(kubeconfig, nodeName, mode, clusterCIDRs, "127.0.0.1:10249", "127.0.0.1:10256")
		if err := os.WriteFile(cfg, []byte(y), 0o644); err != nil {
			return nil, err
		}
		args = []string{bins.kubeProxy, "--config", cfg}
	default:
		return nil, fmt.Errorf("unknown proxy %v", spec)
	}
	logPath := filepath.Join(dir, spec.Name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command("ip", append([]string{"netns", "exec", node.NetnsName}, args...)...)
	cmd.Stdout, cmd.Stderr, cmd.Env = f, f, env
	// No Pdeathsig: it fires when the forking OS thread exits, and Go
	// destroys the threads netns.RunIn used.
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, log: logPath, done: make(chan struct{}), spec: spec}
	p.ctx, p.cancel = context.WithCancelCause(context.Background())
	go func() {
		p.err = cmd.Wait()
		p.cancel(fmt.Errorf("%s exited: %v", spec.Name, p.err))
		close(p.done)
	}()
	return p, nil
}

// legacyIptables makes a directory in dir whose iptables, ip6tables and their
// -save and -restore commands are the iptables-legacy ones, for the front of
// kube-proxy's PATH (kube-proxy runs them by these names).
func legacyIptables(dir string) (string, error) {
	bin := filepath.Join(dir, "iptables-legacy-bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", err
	}
	for _, fam := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			target, err := exec.LookPath(fam + "-legacy" + suffix)
			if err != nil {
				return "", fmt.Errorf("kube-proxy/iptables-legacy needs %s-legacy%s (Debian: package iptables): %w", fam, suffix, err)
			}
			if err := os.Symlink(target, filepath.Join(bin, fam+suffix)); err != nil && !errors.Is(err, fs.ErrExist) {
				return "", err
			}
		}
	}
	return bin, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// stop sends SIGTERM and waits (SIGKILL after 15s).
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// stats reads the process's CPU time (user+system, including its children such
// as kube-proxy's nft and iptables-restore, waited for or still running), peak
// RSS (VmHWM) and RSS (VmRSS) from /proc.
func (p *proc) stats() (cpu float64, rssMiB float64, nowMiB *float64, err error) {
	pid := p.pid()
	ticks, err := treeCPUTicks(pid)
	if err != nil {
		return 0, 0, nil, err
	}
	cpu = float64(ticks) / 100 // USER_HZ
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return cpu, 0, nil, err
	}
	for _, l := range strings.Split(string(st), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				return cpu, 0, nil, err
			}
			mib := kb / 1024
			nowMiB = &mib
		}
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				return cpu, 0, nil, err
			}
			rssMiB = kb / 1024
		}
	}
	return cpu, rssMiB, nowMiB, nil
}

// treeCPUTicks returns the CPU time (user + system, in USER_HZ ticks) of pid, of
// its children it has waited for, and of its descendants still running: a
// kube-proxy whose nft or iptables-restore runs for minutes has spent that CPU
// before it waits for the child.
func treeCPUTicks(pid int) (int64, error) {
	self, _, err := statTicks(pid)
	if err != nil {
		return 0, err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	type proc struct {
		ppid  int
		ticks int64
	}
	procs := map[int]proc{}
	children := map[int][]int{}
	for _, e := range ents {
		id, err := strconv.Atoi(e.Name())
		if err != nil || id == pid {
			continue
		}
		t, ppid, err := statTicks(id)
		if err != nil {
			continue // exited meanwhile
		}
		procs[id] = proc{ppid, t}
		children[ppid] = append(children[ppid], id)
	}
	total := self
	for queue := children[pid]; len(queue) > 0; queue = queue[1:] {
		c := queue[0]
		total += procs[c].ticks
		queue = append(queue, children[c]...)
	}
	return total, nil
}

// statTicks reads /proc/<pid>/stat: utime + stime + cutime + cstime, and the
// parent's pid.
func statTicks(pid int) (ticks int64, ppid int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	return parseStatTicks(string(b))
}

func parseStatTicks(s string) (ticks int64, ppid int, err error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("malformed stat %q", s)
	}
	// Fields after the command: state ppid pgrp … utime(11) stime cutime cstime.
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return 0, 0, fmt.Errorf("short stat %q", s)
	}
	if ppid, err = strconv.Atoi(f[1]); err != nil {
		return 0, 0, fmt.Errorf("stat ppid: %w", err)
	}
	for _, k := range []int{11, 12, 13, 14} {
		v, err := strconv.ParseInt(f[k], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("stat field %d: %w", k, err)
		}
		ticks += v
	}
	return ticks, ppid, nil
}

// apiserverCPU is kube-apiserver's CPU time so far (user + system, seconds), or
// -1 when it cannot be read: what serving a proxy's start costs the control plane.
func apiserverCPU(cp *framework.ControlPlane) float64 {
	b, err := os.ReadFile(filepath.Join(cp.RunDir, "kube-apiserver.pid"))
	if err != nil {
		return -1
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	ticks, err := treeCPUTicks(pid)
	if err != nil {
		return -1
	}
	return float64(ticks) / 100 // USER_HZ
}

// informersSynced returns when, after t0, the proxy's log says its informers had
// listed Services and EndpointSlices: dsproxy's "Informer caches synced", the
// later of kube-proxy's "Caches are synced" for its service and endpoint slice
// configs. klog's timestamps carry no year and are in local time.
func informersSynced(log string, t0 time.Time) (time.Duration, bool) {
	var last time.Time
	for l := range strings.Lines(log) {
		if !strings.Contains(l, `] "Informer caches synced"`) && !strings.Contains(l, `] "Caches are synced" controller="service config"`) &&
			!strings.Contains(l, `] "Caches are synced" controller="endpoint slice config"`) {
			continue
		}
		f := strings.Fields(l)
		if len(f) < 2 || len(f[0]) != 5 {
			continue
		}
		at, err := time.ParseInLocation("0102 15:04:05.000000", f[0][1:]+" "+f[1], time.Local)
		if err != nil {
			continue
		}
		at = at.AddDate(t0.Year(), 0, 0)
		if at.After(last) {
			last = at
		}
	}
	if last.IsZero() {
		return 0, false
	}
	return last.Sub(t0), true
}

func (p *proc) logTail() string {
	b, _ := os.ReadFile(p.log)
	return framework.Tail(string(b), 30)
}

// node is one fresh node namespace with its pods, linked to the control plane.
type node struct {
	c      *netns.Cluster
	name   string // Node object
	client *netns.NS
	pods   []*netns.NS
}

// newNode makes a node linked to the control plane, with a client pod and
// server pods p0 … p(pods-1) serving TCP.
func newNode(t *testing.T, cp *framework.ControlPlane, pods int) *node {
	t.Helper()
	var nodeNS string
	t.Cleanup(func() { // runs after the cluster's Close (registered later)
		if nodeNS != "" {
			if err := cp.Unlink(nodeNS); err != nil {
				t.Logf("unlink %s: %v", nodeNS, err)
			}
		}
	})
	c := netns.New(t)
	nodeNS = c.Node.NetnsName
	if err := cp.Link(nodeNS); err != nil {
		t.Fatal(err)
	}
	for _, r := range [][]string{
		{"route", "replace", "default", "via", "172.31.255.1", "dev", "cplink"},
		{"-6", "route", "replace", "default", "via", "fd00:ffff::1", "dev", "cplink"},
		{"route", "replace", "unreachable", serviceCIDRs[0]},
		{"-6", "route", "replace", "unreachable", serviceCIDRs[1]},
	} {
		if out, err := netns.Exec(c.Node, "ip", r...); err != nil {
			t.Fatalf("ip %v: %v %s", r, err, out)
		}
	}
	n := &node{c: c, name: "bench-" + c.Prefix()}
	n.client = c.AddPod("client")
	for k := range pods {
		p := c.AddPod(fmt.Sprintf("p%d", k))
		if a := podAddrs(k); p.IPv4 != a[0] || p.IPv6 != a[1] {
			t.Fatalf("pod p%d has %v %v, want %v", k, p.IPv4, p.IPv6, a)
		}
		p.Serve(netns.TCP, podPort)
		n.pods = append(n.pods, p)
	}
	if _, err := cp.CreateNode(n.name, netns.NodeIPv4.String(), netns.NodeIPv6.String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.Client.CoreV1().Nodes().Delete(context.Background(), n.name, metav1.DeleteOptions{})
	})
	return n
}

// runProxy measures one proxy at size n in a fresh node: W4's no-proxy
// baseline, then W1 (cold start), W2, W3, W4.
func runProxy(t *testing.T, cp *framework.ControlPlane, ld *load, bins binaries, spec proxySpec, n int) []Row {
	nd := newNode(t, cp, ld.pods())
	settle(t, "the no-proxy baseline")
	row := func(workload string) Row {
		return Row{Proxy: spec.Name, Mode: spec.Mode, Workload: workload, Services: n, CPU: -1, RSSMiB: -1, Status: "ok", LoadAvg: loadavg()}
	}
	var rows []Row

	// W4 baseline: the same node before any proxy rule exists.
	base, err := connectRows(nd, nil, n, ld.count(ld.sample(n)[0]), nil, nil, Row{Proxy: "no proxy", Mode: "-", Services: n, CPU: -1, RSSMiB: -1, Status: "ok"})
	if err != nil {
		t.Fatalf("no-proxy baseline: %v", err)
	}
	if !ld.baselineDone {
		rows = append(rows, base...)
		ld.baselineDone = true
	}

	dir := t.TempDir()
	api0 := apiserverCPU(cp)
	p, err := startProxy(dir, nd.c.Node, nd.name, cp.LinkKubeconfig, bins, spec)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if *flagProfiles != "" && spec.Name == "dsproxy" {
		// A CPU profile of the cold start: the first seconds after the metrics
		// server answers (it starts before the informers).
		go func() {
			file := filepath.Join(*flagProfiles, fmt.Sprintf("dsproxy-cpu-%d.pprof", n))
			for time.Since(t0) < 10*time.Second {
				if _, err := netns.Exec(nd.c.Node, "curl", "-sSf", "-o", file, "http://127.0.0.1:10249/debug/pprof/profile?seconds=8"); err == nil {
					t.Logf("CPU profile of the cold start: %s", file)
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	defer func() {
		p.stop()
		if t.Failed() || os.Getenv("DSPROXY_BENCH_KEEP_LOGS") == "1" {
			keep := filepath.Join(os.TempDir(), fmt.Sprintf("dsproxy-bench-%s-%d.log", spec.Name+"-"+spec.Mode, n))
			if b, err := os.ReadFile(p.log); err == nil {
				_ = os.WriteFile(keep, b, 0o644)
				t.Logf("%s log kept in %s", spec, keep)
			}
		}
	}()

	// W1: process start → every sampled Service answers on both families; with
	// -w1-starts K, K cold starts, each after the proxy's --cleanup removed the
	// previous one's rules. CPU and RSS are the first start's.
	w1 := row("W1 cold start")
	var starts []time.Duration
	for k := range max(*flagW1Starts, 1) {
		if k > 0 {
			p.stop()
			if err := cleanRules(p, nd); err != nil {
				t.Errorf("%s: W1 start %d: %v", spec, k+1, err)
				w1.setLatencies(starts)
				w1.Status = "error: " + err.Error()
				return append(rows, w1)
			}
			sub := filepath.Join(dir, fmt.Sprintf("start-%d", k+1))
			if err := os.Mkdir(sub, 0o755); err != nil {
				t.Fatal(err)
			}
			api0 = apiserverCPU(cp)
			if p, err = startProxy(sub, nd.c.Node, nd.name, cp.LinkKubeconfig, bins, spec); err != nil {
				t.Fatal(err)
			}
			t0 = time.Now()
		}
		ready, detail, err := coldStart(p, nd, ld, n, t0)
		if k == 0 {
			if cpu, rss, now, serr := p.stats(); serr == nil {
				w1.CPU, w1.RSSMiB, w1.EndRSSMiB = cpu, rss, now
			}
		}
		switch {
		case err == nil:
			starts = append(starts, ready)
			cpu, rss, _, _ := p.stats()
			if b, err := os.ReadFile(p.log); err == nil {
				if d, ok := informersSynced(string(b), t0); ok {
					detail += fmt.Sprintf("; informers synced %v after start", d.Round(time.Millisecond))
				}
			}
			if api0 >= 0 {
				detail += fmt.Sprintf("; kube-apiserver CPU %.2f s", apiserverCPU(cp)-api0)
			}
			t.Logf("%s: W1 %v (%s), CPU %.2f s, peak RSS %.0f MiB (start %d)", spec, ready.Round(time.Millisecond), detail, cpu, rss, k+1)
			continue
		case errors.Is(err, context.DeadlineExceeded):
			w1.Status = fmt.Sprintf("not finished after %v", *flagTimeout)
			t.Logf("%s: W1 %s (%s, start %d)\n%s", spec, w1.Status, detail, k+1, p.logTail())
		default:
			t.Errorf("%s: W1 (start %d): %v\n%s", spec, k+1, err, p.logTail())
			w1.Status = "error: " + err.Error()
		}
		// The starts that finished are in the row; this proxy is not measured further.
		w1.setLatencies(starts)
		return append(rows, w1)
	}
	w1.setLatencies(starts)
	if len(starts) > 1 {
		t.Logf("%s: W1 over %d starts: p50 %.2f s, max %.2f s", spec, len(starts), w1.P50, w1.Max)
	}
	rows = append(rows, w1)
	if *flagRulesets != "" {
		file := filepath.Join(*flagRulesets, fmt.Sprintf("ruleset-%s-%s-%d.nft", spec.Name, spec.Mode, n))
		if out, err := netns.Exec(nd.c.Node, "nft", "list", "ruleset"); err != nil {
			t.Errorf("ruleset: %v: %s", err, out)
		} else if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
			t.Errorf("ruleset: %v", err)
		} else {
			t.Logf("ruleset of the programmed node: %s", file)
		}
	}
	if *flagProfiles != "" && spec.Name == "dsproxy" {
		// The live heap once programmed (after a GC), with what was allocated
		// on the way (-sample_index=alloc_space).
		file := filepath.Join(*flagProfiles, fmt.Sprintf("dsproxy-heap-%d.pprof", n))
		if out, err := netns.Exec(nd.c.Node, "curl", "-sSf", "-o", file, "http://127.0.0.1:10249/debug/pprof/heap?gc=1"); err != nil {
			t.Errorf("heap profile: %v: %s", err, out)
		} else {
			t.Logf("heap profile of the programmed proxy: %s", file)
		}
	}

	settle(t, "W2")
	rows = append(rows, endpointChanges(t, p, nd, ld, row("W2 endpoint change")))
	api0, pairs0, w3 := apiserverCPU(cp), ld.w3, time.Now()
	rows = append(rows, serviceAddDelete(t, p, nd, ld, row("W3 service add"), row("W3 service delete"))...)
	// Its idle background (leases, controllers' watches, ...) is in it too:
	// 3–5 % of a core on this machine.
	if api1, pairs, wall := apiserverCPU(cp), ld.w3-pairs0, time.Since(w3); api0 >= 0 && api1 >= 0 && pairs > 0 {
		t.Logf("%s: kube-apiserver CPU over W3: %.2f s in %.1f s (%.1f %% of a core), %d Services added and deleted",
			p.spec, api1-api0, wall.Seconds(), 100*(api1-api0)/wall.Seconds(), pairs)
	}

	// After W3 the API server is still releasing the last Service's ClusterIPs
	// (its allocator's lists, see bench/apialloc), and a slow proxy may still be
	// syncing: W4's connects should not share the CPUs with that.
	settle(t, "W4")
	probe := ld.sample(n)[0]
	targets := []netip.Addr{ld.ips[probe][0], ld.ips[probe][1]}
	// The W2 probe Service has one endpoint per family (a server pod): with
	// the workload's 10 (or K) it shows what a proxy's dispatch costs between
	// endpoint counts, measured side by side.
	pods := ld.count(probe)
	w4, err := connectRows(nd, newBareNode(t, pods), n, pods, targets, ld.probe[:], row(""))
	if err != nil {
		t.Errorf("%s: W4: %v", spec, err)
	}
	rows = append(rows, w4...)
	return rows
}

// cleanRules runs the stopped proxy's own --cleanup in its node (with the same
// binary and environment) and checks that neither dsproxy's nor kube-proxy's
// rules are left, so that the next start is a cold one, not a takeover.
func cleanRules(p *proc, nd *node) error {
	bin := p.cmd.Args[4] // ip netns exec NS bin …
	cmd := exec.Command("ip", "netns", "exec", nd.c.Node.NetnsName, bin, "--cleanup")
	cmd.Env = p.cmd.Env
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s --cleanup: %v\n%s", bin, err, out)
	}
	dump := [][]string{{"nft", "list", "ruleset"}}
	if p.spec.Mode == "iptables-legacy" {
		dump = append(dump, []string{"iptables-legacy-save"}, []string{"ip6tables-legacy-save"})
	}
	for _, d := range dump {
		out, err := netns.Exec(nd.c.Node, d[0], d[1:]...)
		if err != nil {
			return fmt.Errorf("%v: %v\n%s", d, err, out)
		}
		// kube-proxy's per-Service chains; its --cleanup leaves KUBE-FIREWALL
		// (also the kubelet's), which holds no Service.
		for _, left := range append([]string{"KUBE-SERVICES", "KUBE-SVC-", "KUBE-SEP-", "table ip kube-proxy", "table ip6 kube-proxy"}, dsproxyTables()...) {
			if strings.Contains(string(out), left) {
				return fmt.Errorf("%q left after --cleanup (%v):\n%s", left, d, out)
			}
		}
	}
	return nil
}

func dsproxyTables() []string {
	var out []string
	for _, fam := range []string{"ip", "ip6"} {
		for _, t := range nftables.TableNames {
			out = append(out, fmt.Sprintf("table %s %s {", fam, t))
		}
	}
	return out
}

// coldStart waits until every sampled Service answers on both families and
// returns the time since t0 of the last one to answer.
func coldStart(p *proc, nd *node, ld *load, n int, t0 time.Time) (time.Duration, string, error) {
	ctx, cancel := context.WithTimeout(p.ctx, *flagTimeout)
	defer cancel()
	sample := ld.sample(n)
	type res struct {
		i, fi int
		at    time.Time
		err   error
	}
	ch := make(chan res)
	for _, i := range sample {
		for fi := range fams {
			go func() {
				at, err := poll{
					dst: netip.AddrPortFrom(ld.ips[i][fi], svcPort),
					// 20 ms: fine enough for seconds, and 34 pollers cost the
					// proxy little CPU.
					timeout: 100 * time.Millisecond, interval: 20 * time.Millisecond,
					done: answers,
				}.run(ctx, nd.client)
				ch <- res{i, fi, at, err}
			}()
		}
	}
	var (
		last     time.Time
		firstErr error
		lastSvc  [2]time.Duration
		got      int
	)
	for range 2 * len(sample) {
		r := <-ch
		if r.err != nil {
			if firstErr == nil {
				firstErr = r.err
			}
			continue
		}
		got++
		if r.at.After(last) {
			last = r.at
		}
		if r.i == n-1 {
			lastSvc[r.fi] = r.at.Sub(t0).Round(time.Millisecond)
		}
	}
	detail := fmt.Sprintf("%d/%d sampled ClusterIPs answered; last Service IPv4 %v IPv6 %v", got, 2*len(sample), lastSvc[0], lastSvc[1])
	if firstErr != nil {
		if ctx.Err() == context.DeadlineExceeded {
			return 0, detail, context.DeadlineExceeded
		}
		return 0, detail, firstErr
	}
	return last.Sub(t0), detail, nil
}

// endpointChanges: W2. The probe Service has one endpoint per family; each
// change replaces it (p0 ↔ p1) in one family's EndpointSlice and waits for
// the first connection that reaches the new pod (poll.first: a new connection
// every millisecond).
func endpointChanges(t *testing.T, p *proc, nd *node, ld *load, r Row) Row {
	// The probe may point at p1 after an earlier proxy's run.
	for fi := range fams {
		ctx, cancel := context.WithTimeout(p.ctx, *flagChangeTO)
		_, err := poll{dst: netip.AddrPortFrom(ld.probe[fi], svcPort), timeout: 100 * time.Millisecond,
			interval: 10 * time.Millisecond, done: reaches(fmt.Sprintf("p%d", ld.probeAt[fi]))}.run(ctx, nd.client)
		cancel()
		if err != nil {
			return failed(t, p, r, err, "probe not ready")
		}
	}
	cpu0, _, _, _ := p.stats()
	// The watch reads the control plane's accounting as each event arrives:
	// an event right behind another on the same watch is timed that much late.
	readStart := time.Now()
	if _, ok := ld.controlPlaneSched(); !ok {
		t.Logf("%s: %s: etcd's and kube-apiserver's scheduler accounting cannot be read", p.spec, r.Workload)
	} else {
		t.Logf("%s: %s: etcd's and kube-apiserver's scheduler accounting read in %v", p.spec, r.Workload, time.Since(readStart).Round(time.Microsecond))
	}
	defer ld.events.arm(ld.controlPlaneSched)()
	var lat, proxyLat, apiLat []time.Duration
	var slow []slowChange
	for c := range p.changes() {
		fi := c % 2
		k := 1 - ld.probeAt[fi]
		ctx, cancel := context.WithTimeout(p.ctx, *flagChangeTO)
		// The probe runs from before the update: the proxy may program the
		// change before the API call returns.
		type res struct {
			at  time.Time
			err error
		}
		ch := make(chan res, 1)
		go func() {
			at, err := poll{dst: netip.AddrPortFrom(ld.probe[fi], svcPort), timeout: 100 * time.Millisecond,
				interval: time.Millisecond, done: reaches(fmt.Sprintf("p%d", k))}.first(ctx, nd.client)
			ch <- res{at, err}
		}()
		s0 := takeSched(p, ld)
		t0 := time.Now()
		if err := ld.setProbe(ctx, fi, k); err != nil {
			cancel()
			<-ch
			return failed(t, p, r, err, "update slice")
		}
		ld.probeAt[fi] = k
		pr := <-ch
		cancel()
		s1, ok1 := p.procSched()
		at, err := pr.at, pr.err
		if err != nil {
			return partial(t, p, r, lat, cpu0, err, p.changes())
		}
		lat = append(lat, at.Sub(t0))
		ev, err := ld.events.first("EndpointSlice", sliceName("probe", fams[fi]), watch.Modified, t0)
		if err != nil {
			return partial(t, p, r, lat, cpu0, err, p.changes())
		}
		proxyLat = append(proxyLat, max(at.Sub(ev.at), 0))
		apiLat = append(apiLat, ev.at.Sub(t0))
		sc := slowChange{proxy: max(at.Sub(ev.at), 0), sched: s1.sub(s0.proxy), ok: s0.proxyOK && ok1}
		sc.setAPI(t0, s0, ev)
		slow = append(slow, sc)
		recordSample(p, r.Services, r.Workload, fams[fi].Name, t0, ev.at, at, sc)
		time.Sleep(*flagGap)
	}
	t.Logf("%s: %s, slowest event → kernel: %s", p.spec, r.Workload, slowest(slow, 5))
	t.Logf("%s: %s, slowest call → event (what etcd and kube-apiserver ran and waited for a CPU meanwhile): %s", p.spec, r.Workload, slowestAPI(slow, 5))
	r.ProxyP50, r.ProxyP99 = p50p99(proxyLat)
	r.APIP50, r.APIP99 = p50p99(apiLat)
	return finish(p, r, lat, cpu0)
}

// serviceAddDelete: W3. A ClusterIP Service with 10 real endpoints per
// family is created (Service, then its two slices) until both ClusterIPs
// answer, then deleted until both stop answering (two connections in a row
// failed, so that one lost SYN is not taken for the deletion). The probes
// (poll.first: a new connection every millisecond) start before the API
// calls that make the change (for an add: once the Service exists, so its
// ClusterIPs are known, before its slices are created), since a proxy may
// program the change before the last call returns. Each
// change is also measured from the watch event it needs (the later of the
// Service's and the family's slice's for an add, the Service's deletion for
// a delete).
func serviceAddDelete(t *testing.T, p *proc, nd *node, ld *load, add, del Row) []Row {
	cpu0, _, _, _ := p.stats()
	defer ld.events.arm(ld.controlPlaneSched)()
	api0, api0Err := readAPIW3Metrics(p.ctx, ld.client, true)
	var addLat, delLat, addProxy, delProxy, addAPI, delAPI []time.Duration
	var addSlow, delSlow []slowChange
	// change starts wait for both families, runs act, and collects: wait
	// returns when family fi saw the change, needed the watch event it
	// depends on. s0 is the scheduler's accounting at t0.
	change := func(ctx context.Context, row Row, t0 time.Time, s0 schedSnap, act func() error, wait func(ctx context.Context, fi int) (time.Time, error),
		needed func(fi int) (event, error), lat, proxy, api *[]time.Duration, slow *[]slowChange) (actErr, err error) {
		type res struct {
			at  time.Time
			err error
		}
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		var ch [2]chan res
		for fi := range fams {
			ch[fi] = make(chan res, 1)
			go func() {
				at, err := wait(ctx, fi)
				ch[fi] <- res{at, err}
			}()
		}
		if actErr = act(); actErr != nil {
			cancel(actErr)
			for fi := range fams {
				<-ch[fi]
			}
			return actErr, nil
		}
		var rs [2]res
		for fi := range fams {
			rs[fi] = <-ch[fi]
		}
		s1, ok1 := p.procSched()
		sc := slowChange{sched: s1.sub(s0.proxy), ok: s0.proxyOK && ok1}
		var errs []error
		for fi := range fams {
			r := rs[fi]
			if r.err == nil {
				var ev event
				if ev, r.err = needed(fi); r.err == nil {
					*lat = append(*lat, r.at.Sub(t0))
					*proxy = append(*proxy, max(r.at.Sub(ev.at), 0))
					*api = append(*api, ev.at.Sub(t0))
					sc.proxy = max(sc.proxy, r.at.Sub(ev.at))
					// The sample has this family's control-plane window,
					// the change the slower family's.
					fsc := sc
					fsc.setAPI(t0, s0, ev)
					if fsc.api > sc.api {
						sc.api, sc.cp, sc.cpOK = fsc.api, fsc.cp, fsc.cpOK
					}
					recordSample(p, row.Services, row.Workload, fams[fi].Name, t0, ev.at, r.at, fsc)
				}
			}
			errs = append(errs, r.err)
		}
		*slow = append(*slow, sc)
		return nil, errors.Join(errs...)
	}
	rows := func(errAdd, errDel error) []Row {
		a, d := finish(p, add, addLat, cpu0), finish(p, del, delLat, cpu0)
		if errAdd != nil {
			a = partial(t, p, add, addLat, cpu0, errAdd, 2*p.pairs())
		}
		if errDel != nil {
			d = partial(t, p, del, delLat, cpu0, errDel, 2*p.pairs())
		}
		a.ProxyP50, a.ProxyP99 = p50p99(addProxy)
		d.ProxyP50, d.ProxyP99 = p50p99(delProxy)
		a.APIP50, a.APIP99 = p50p99(addAPI)
		d.APIP50, d.APIP99 = p50p99(delAPI)
		if api1, err := readAPIW3Metrics(p.ctx, ld.client, false); api0Err != nil || err != nil {
			t.Logf("%s: %s: %v", p.spec, add.Workload, errors.Join(api0Err, err))
		} else {
			post, alloc, del := api0.post.mean(api1.post), api0.alloc.mean(api1.alloc), api0.del.mean(api1.del)
			ps, as, ds := post.Seconds(), alloc.Seconds(), del.Seconds()
			a.APIRequestMean, a.APIAllocMean, d.APIRequestMean = &ps, &as, &ds
			t.Logf("%s: %s: the API server's Service POST took %v on average (%.0f), its ClusterIP allocations %v each (%.0f, one per family); Service DELETE %v (%.0f)",
				p.spec, add.Workload, post.Round(10*time.Microsecond), api1.post.count-api0.post.count, alloc.Round(10*time.Microsecond), api1.alloc.count-api0.alloc.count,
				del.Round(10*time.Microsecond), api1.del.count-api0.del.count)
		}
		t.Logf("%s: %s, slowest event → kernel: %s", p.spec, add.Workload, slowest(addSlow, 5))
		t.Logf("%s: %s, slowest event → kernel: %s", p.spec, del.Workload, slowest(delSlow, 5))
		t.Logf("%s: %s, slowest call → event (what etcd and kube-apiserver ran and waited for a CPU meanwhile): %s", p.spec, add.Workload, slowestAPI(addSlow, 5))
		t.Logf("%s: %s, slowest call → event (what etcd and kube-apiserver ran and waited for a CPU meanwhile): %s", p.spec, del.Workload, slowestAPI(delSlow, 5))
		d.CPU = -1 // the CPU column of W3 covers adds and deletes together
		return []Row{a, d}
	}
	for range p.pairs() {
		ctx, cancel := context.WithTimeout(p.ctx, *flagChangeTO)
		name := fmt.Sprintf("w3-%d", ld.nextW3())
		s0 := takeSched(p, ld)
		t0 := time.Now()
		ips, err := ld.createService(ctx, name, "ClusterIP")
		if err != nil {
			cancel()
			return []Row{failed(t, p, add, err, "create"), skipped(del)}
		}
		actErr, err := change(ctx, add, t0, s0, func() error { return ld.createSlices(ctx, name) }, func(ctx context.Context, fi int) (time.Time, error) {
			return poll{dst: netip.AddrPortFrom(ips[fi], svcPort), timeout: 100 * time.Millisecond, interval: time.Millisecond,
				done: answers}.first(ctx, nd.client)
		}, func(fi int) (event, error) {
			s, err := ld.events.first("Service", name, watch.Added, t0)
			if err != nil {
				return s, err
			}
			es, err := ld.events.first("EndpointSlice", sliceName(name, fams[fi]), watch.Added, t0)
			return latest(s, es), err
		}, &addLat, &addProxy, &addAPI, &addSlow)
		cancel()
		if actErr != nil {
			return []Row{failed(t, p, add, actErr, "create"), skipped(del)}
		}
		if err != nil {
			return rows(err, err)
		}
		time.Sleep(*flagGap)
		ctx, cancel = context.WithTimeout(p.ctx, *flagChangeTO)
		s0 = takeSched(p, ld)
		t0 = time.Now()
		actErr, err = change(ctx, del, t0, s0, func() error { return ld.deleteService(ctx, name) }, func(ctx context.Context, fi int) (time.Time, error) {
			return poll{dst: netip.AddrPortFrom(ips[fi], svcPort), timeout: 200 * time.Millisecond, interval: time.Millisecond,
				done: fails, confirm: 2}.first(ctx, nd.client)
		}, func(int) (event, error) {
			return ld.events.first("Service", name, watch.Deleted, t0)
		}, &delLat, &delProxy, &delAPI, &delSlow)
		cancel()
		if actErr != nil {
			return []Row{failed(t, p, add, actErr, "delete"), skipped(del)}
		}
		if err != nil {
			return rows(nil, err)
		}
		time.Sleep(*flagGap)
	}
	return rows(nil, nil)
}

// connectRows: W4, first-packet latency from nd's client pod. With clusterIPs
// nil: direct to pod p0 only (the no-proxy baseline); otherwise direct to p0,
// the ClusterIPs, the one-endpoint Service's ClusterIPs oneEP (if any) and,
// with bare, from bare's client pod direct to its pod p0 (rows "no proxy",
// mode "beside <proxy>"), all interleaved: a no-proxy baseline measured under
// the same load at the same time as the proxy. With pods > 1 (the ClusterIPs'
// endpoints are pods p0 … p(pods-1)) every client also connects direct to
// those pods in turn (rows "... spread"): the no-proxy counterpart of a
// Service whose connects go to many pods, each a namespace of its own.
func connectRows(nd *node, bare *bareNode, n, pods int, clusterIPs, oneEP []netip.Addr, r Row) ([]Row, error) {
	type target struct {
		row Row
		nsTarget
	}
	named := func(base Row, workload string) Row {
		base.Workload, base.Services = workload, n
		return base
	}
	direct := func(base Row, name string, client *netns.NS) []target {
		var ts []target
		for fi, f := range fams {
			p0 := netip.AddrPortFrom(podAddrs(0)[fi], podPort)
			ts = append(ts, target{named(base, name+" "+f.Name), nsTarget{ns: client, dst: p0}})
			if pods > 1 {
				tg := nsTarget{ns: client, dst: p0}
				for k := range pods {
					tg.spread = append(tg.spread, netip.AddrPortFrom(podAddrs(k)[fi], podPort))
				}
				ts = append(ts, target{named(base, name+" spread "+f.Name), tg})
			}
		}
		return ts
	}
	name := "W4 connect direct"
	if r.Proxy == "no proxy" {
		name = "W4 connect no-proxy"
	}
	ts := direct(r, name, nd.client)
	for fi, a := range clusterIPs {
		ts = append(ts, target{named(r, "W4 connect ClusterIP "+fams[fi].Name), nsTarget{ns: nd.client, dst: netip.AddrPortFrom(a, svcPort)}})
	}
	for fi, a := range oneEP {
		ts = append(ts, target{named(r, "W4 connect ClusterIP 1-endpoint "+fams[fi].Name), nsTarget{ns: nd.client, dst: netip.AddrPortFrom(a, svcPort)}})
	}
	if bare != nil && clusterIPs != nil {
		beside := Row{Proxy: "no proxy", Mode: "beside " + r.Proxy + "/" + r.Mode, CPU: -1, RSSMiB: -1, Status: "ok"}
		ts = append(ts, direct(beside, "W4 connect no-proxy", bare.client)...)
	}
	nts := make([]nsTarget, len(ts))
	for i := range ts {
		nts[i] = ts[i].nsTarget
	}
	times, err := connectTimes(nts, *flagConnects, 50)
	if err != nil {
		return nil, err
	}
	var rows []Row
	for i, tg := range ts {
		x := tg.row
		x.LoadAvg = loadavg()
		x.setLatencies(times[i])
		rows = append(rows, x)
	}
	return rows, nil
}

// bareNode is a node without a proxy, the control plane or a Node object: a
// client pod and pods p0 … p(pods-1) (serving), for W4's no-proxy baseline
// beside a proxy.
type bareNode struct {
	client *netns.NS
}

func newBareNode(t *testing.T, pods int) *bareNode {
	t.Helper()
	c := netns.New(t)
	b := &bareNode{client: c.AddPod("client")}
	for k := range pods {
		p := c.AddPod(fmt.Sprintf("p%d", k))
		if a := podAddrs(k); p.IPv4 != a[0] || p.IPv6 != a[1] {
			t.Fatalf("bare node: pod p%d has %v %v, want %v", k, p.IPv4, p.IPv6, a)
		}
		p.Serve(netns.TCP, podPort)
	}
	return b
}

func finish(p *proc, r Row, lat []time.Duration, cpu0 float64) Row {
	r.setLatencies(lat)
	if cpu, rss, now, err := p.stats(); err == nil {
		r.CPU, r.RSSMiB, r.EndRSSMiB = cpu-cpu0, rss, now
	}
	return r
}

func partial(t *testing.T, p *proc, r Row, lat []time.Duration, cpu0 float64, err error, want int) Row {
	r = finish(p, r, lat, cpu0)
	if errors.Is(err, context.DeadlineExceeded) {
		r.Status = fmt.Sprintf("not finished: a change took > %v (%d of %d samples done)", *flagChangeTO, len(lat), want)
		return r
	}
	return failed(t, p, r, err, "")
}

func failed(t *testing.T, p *proc, r Row, err error, what string) Row {
	t.Helper()
	if what != "" {
		err = fmt.Errorf("%s: %w", what, err)
	}
	t.Errorf("%s/%s %s: %v\n%s", r.Proxy, r.Mode, r.Workload, err, p.logTail())
	r.Status = "error: " + err.Error()
	return r
}

func skipped(r Row) Row {
	r.Status = "skipped"
	return r
}
