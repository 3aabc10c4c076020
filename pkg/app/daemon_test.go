package app

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/dsproxy/dsproxy/pkg/config"
	"github.com/dsproxy/dsproxy/pkg/conntrack"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/proxier"
	"github.com/dsproxy/dsproxy/pkg/runner"
)

// kube-proxy's sync settings map onto the runner as kube-proxy v1.36 uses them:
// syncPeriod is no longer the full-sync period.
func TestRunnerOptions(t *testing.T) {
	got := runnerOptions(&config.Config{SyncPeriod: 30 * time.Second, MinSyncPeriod: 2 * time.Second})
	want := runner.Options{MinInterval: 2 * time.Second, FullResyncPeriod: time.Hour, CheckPeriod: 30 * time.Second, RetryMax: 30 * time.Second}
	if got != want {
		t.Errorf("runnerOptions = %+v, want %+v", got, want)
	}
	// kube-proxy's health server times out a queued change after twice syncPeriod.
	if got := healthTimeout(&config.Config{SyncPeriod: 45 * time.Second}); got != 90*time.Second {
		t.Errorf("healthTimeout(syncPeriod 45s) = %v, want 1m30s", got)
	}
}

// The INVALID drop rule goes when nf_conntrack_tcp_be_liberal is set, or will be
// set by --conntrack-tcp-be-liberal; an unreadable or bad value counts as unset.
func TestTCPBeLiberal(t *testing.T) {
	dir := t.TempDir()
	if tcpBeLiberal(dir, false) {
		t.Error("no sysctl file: liberal")
	}
	if !tcpBeLiberal(dir, true) {
		t.Error("--conntrack-tcp-be-liberal: not liberal")
	}
	path := filepath.Join(dir, "net/netfilter/nf_conntrack_tcp_be_liberal")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	for v, want := range map[string]bool{"0\n": false, "1\n": true, "2": true, "x\n": false} {
		if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := tcpBeLiberal(dir, false); got != want {
			t.Errorf("sysctl %q: liberal = %v, want %v", v, got, want)
		}
	}
}

// In a network namespace other than the machine's initial one (a kind node,
// where a pod's /proc/1 shares it) nf_conntrack_max is read-only: the daemon and
// --init-only then take only the per-namespace settings, rather than fail on
// nf_conntrack_max as kube-proxy does unless maxPerCore is 0.
func TestConntrackSysctlsOutsideInitialNetns(t *testing.T) {
	dir := t.TempDir()
	fs := conntrack.SysFS{ProcSys: filepath.Join(dir, "proc"), Sys: filepath.Join(dir, "sys")}
	max := filepath.Join(fs.ProcSys, "net/netfilter/nf_conntrack_max")
	if err := os.MkdirAll(filepath.Dir(max), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(max, []byte("65536\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]string{"--conntrack-max-per-core=32768", "--conntrack-tcp-timeout-established=2h"})
	if err != nil {
		t.Fatal(err)
	}
	if s := conntrackSysctls(cfg, fs); s.Max(2) != 131072 || s.TCPEstablishedTimeout != 2*time.Hour {
		t.Errorf("initial namespace: %+v, want nf_conntrack_max and the timeout", s)
	}
	if err := os.Chmod(max, 0o444); err != nil {
		t.Fatal(err)
	}
	if s := conntrackSysctls(cfg, fs); s.Max(2) != 0 || s.TCPEstablishedTimeout != 2*time.Hour {
		t.Errorf("other namespace: %+v, want the timeout only", s)
	}
}

// kube-proxy's feature gates as dsproxy reads them: set, or kube-proxy v1.36's
// default, AllAlpha and AllBeta applied.
func TestGateEnabled(t *testing.T) {
	for _, tc := range []struct {
		gates map[string]bool
		name  string
		want  bool
	}{
		{map[string]bool{"AllowServiceExternalIPs": false}, "AllowServiceExternalIPs", false},
		{nil, "AllowServiceExternalIPs", true},
		{nil, "ComponentFlagz", true}, // beta, on by default in v1.36
		{nil, "ComponentStatusz", true},
		{map[string]bool{"AllBeta": false}, "ComponentFlagz", false},
		{map[string]bool{"AllBeta": false, "ComponentStatusz": true}, "ComponentStatusz", true},
		{map[string]bool{"ComponentFlagz": false}, "ComponentFlagz", false},
	} {
		cfg := &config.Config{FeatureGates: tc.gates}
		if got := gateEnabled(cfg, tc.name); got != tc.want {
			t.Errorf("%v: %s enabled = %v, want %v", tc.gates, tc.name, got, tc.want)
		}
	}
}

// --cluster-cidr is read as kube-proxy reads it (and as the validation accepts
// it): an IPv4 CIDR with leading zeros still detects local traffic.
func TestLocalDetectorClusterCIDR(t *testing.T) {
	cfg := &config.Config{DetectLocalMode: config.LocalModeClusterCIDR, ClusterCIDRs: []string{"010.244.0.0/16", "fd00:10:244::/56"}}
	for f, want := range map[*family.Family]string{family.IPv4: "10.244.0.0/16", family.IPv6: "fd00:10:244::/56"} {
		d := localDetector(cfg, f, nil)
		if d.Mode != proxier.LocalModeClusterCIDR || len(d.CIDRs) != 1 || d.CIDRs[0].String() != want {
			t.Errorf("%s: detector %+v, want ClusterCIDR %s", f, d, want)
		}
	}
}

// Outside IPVS mode the configuration's ipvs.excludeCIDRs are not validated (as
// in kube-proxy), so an entry that is no CIDR reaches the daemon: it is left
// out, and the valid ones still keep kube-proxy's virtual servers in them
// (--cleanup-kube-proxy). Before, the daemon refused to start.
func TestExcludeCIDRs(t *testing.T) {
	got := excludeCIDRs([]string{"10.0.0.0/8", "bogus", " fd00::/64 ", "10.0.0.1"})
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/64")}
	if !slices.Equal(got, want) {
		t.Errorf("excludeCIDRs = %v, want %v", got, want)
	}
}

// --cleanup-kube-proxy uses the nft-backed and legacy iptables binaries where
// installed by name, else the plain ones, per family, as kube-proxy's cleanup
// does; a node with only plain names kept kube-proxy's iptables rules before.
func TestKubeProxyIPTablesBinaries(t *testing.T) {
	for _, tc := range []struct {
		have, want []string
	}{
		{[]string{"iptables-save", "ip6tables-save"}, []string{"iptables", "ip6tables"}},
		{[]string{"iptables-save", "iptables-nft-save", "iptables-legacy-save", "ip6tables-save", "ip6tables-nft-save"},
			[]string{"iptables-nft", "iptables-legacy", "ip6tables-nft"}},
		{[]string{"iptables-legacy-save"}, []string{"iptables-legacy"}},
		{nil, nil},
	} {
		dir := t.TempDir()
		for _, name := range tc.have {
			if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		t.Setenv("PATH", dir)
		if got := kubeProxyIPTablesBinaries(); !slices.Equal(got, tc.want) {
			t.Errorf("with %v: %v, want %v", tc.have, got, tc.want)
		}
	}
}

// The wait for the Node's addresses ends on addresses node IP selection can
// use: a Node listing only a loopback InternalIP or a Hostname has none (the
// wait ended on any parseable one before, and the node IPs were loopback then).
func TestHasNodeIPs(t *testing.T) {
	for _, tc := range []struct {
		addrs []v1.NodeAddress
		want  bool
	}{
		{nil, false},
		{[]v1.NodeAddress{{Type: v1.NodeHostName, Address: "node-a"}}, false},
		{[]v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "127.0.0.1"}}, false},
		{[]v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.0.2.1"}}, true},
		{[]v1.NodeAddress{{Type: v1.NodeExternalIP, Address: "2001:db8::1"}}, true},
	} {
		if got := hasNodeIPs(&v1.Node{Status: v1.NodeStatus{Addresses: tc.addrs}}); got != tc.want {
			t.Errorf("hasNodeIPs(%v) = %v, want %v", tc.addrs, got, tc.want)
		}
	}
}
