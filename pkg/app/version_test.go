package app

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsproxy/dsproxy/pkg/config"
)

// --version as kube-proxy's: true values print the version, false ones and
// none print nothing, "raw" prints the build details, "vX.Y.Z" prints nothing
// and sets the version dsproxy reports, anything else is an error.
func TestPrintVersion(t *testing.T) {
	t.Cleanup(func() { reportedVersion = "" })
	for flag, want := range map[string]string{
		"": "", "false": "", "0": "", "v1.36.3": "",
		"true": "dsproxy " + Version() + "\n", "1": "dsproxy " + Version() + "\n",
		"raw": "dsproxy.Info{Version:",
	} {
		var out bytes.Buffer
		done, err := PrintVersion(&out, flag)
		if err != nil || done != (want != "") || !strings.HasPrefix(out.String(), want) || (want == "" && out.Len() > 0) {
			t.Errorf("--version=%q: printed %q, done %v, err %v; want %q", flag, out.String(), done, err, want)
		}
	}
	if got := Version(); got != "v1.36.3" {
		t.Errorf("after --version=v1.36.3 the reported version is %q", got)
	}
	if got := buildInfoMetric().GitVersion; got != "v1.36.3" {
		t.Errorf("after --version=v1.36.3 kubernetes_build_info's git_version is %q", got)
	}
	for _, bad := range []string{"yes please", "v1.36", "vnext"} {
		if done, err := PrintVersion(&bytes.Buffer{}, bad); err == nil || done {
			t.Errorf("--version=%q accepted", bad)
		}
	}
}

// --write-config-to writes the effective configuration, which --config reads
// back to the same settings.
func TestWriteConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	cfg, err := config.Parse([]string{"--proxy-mode=iptables", "--cluster-cidr=10.64.0.0/16,fd00:64::/48",
		"--iptables-masquerade-bit=12", "--write-config-to=" + path})
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteConfig(cfg); err != nil {
		t.Fatal(err)
	}
	back, err := config.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if back.ProxyMode != config.ModeIPTables || back.IPTables.MasqueradeBit != 12 ||
		strings.Join(back.ClusterCIDRs, ",") != "10.64.0.0/16,fd00:64::/48" || back.OOMScoreAdj != -999 {
		t.Errorf("read back mode %s, masquerade bit %d, cluster CIDRs %v, oomScoreAdj %d",
			back.ProxyMode, back.IPTables.MasqueradeBit, back.ClusterCIDRs, back.OOMScoreAdj)
	}
	cfg.WriteConfigTo = filepath.Join(t.TempDir(), "missing", "config.yaml")
	if err := WriteConfig(cfg); err == nil || !strings.Contains(err.Error(), "--write-config-to") {
		t.Errorf("unwritable path: %v", err)
	}
}

func TestApplyOOMScoreAdj(t *testing.T) {
	path := filepath.Join(t.TempDir(), "oom_score_adj")
	if err := applyOOMScoreAdj(path, -999); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "-999" {
		t.Errorf("wrote %q", b)
	}
	if err := applyOOMScoreAdj(path, 1001); err == nil {
		t.Error("1001 accepted")
	}
}

// With --bind-address-hard-fail a server that cannot listen reports the error
// and stops; without, it keeps retrying until the context ends.
func TestServeHTTPHardFail(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := l.Addr().String()
	failed := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		serveHTTP(context.Background(), "metrics", addr, nil, func(err error) { failed <- err })
		close(done)
	}()
	select {
	case err := <-failed:
		if !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), "metrics server on "+addr) {
			t.Errorf("hard failure: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no hard failure")
	}
	<-done

	ctx, cancel := context.WithCancel(context.Background())
	soft := make(chan struct{})
	go func() {
		serveHTTP(ctx, "healthz", addr, nil, nil)
		close(soft)
	}()
	select {
	case <-soft:
		t.Fatal("without --bind-address-hard-fail the server gave up")
	case <-time.After(200 * time.Millisecond):
	}
	cancel()
	<-soft
}
