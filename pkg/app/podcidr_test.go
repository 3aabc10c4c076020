package app

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/dsproxy/dsproxy/pkg/config"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/nodeip"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

func nodeWithCIDRs(cidrs ...string) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Spec: v1.NodeSpec{PodCIDRs: cidrs}}
}

// With --detect-local-mode=NodeCIDR the daemon waits for the Node's PodCIDRs, as
// kube-proxy: it goes on once they are there, and gives up with a clear error.
func TestWaitForPodCIDRs(t *testing.T) {
	ctx := context.Background()
	calls := 0
	get := func(context.Context) (*v1.Node, error) {
		calls++
		switch {
		case calls == 1:
			return nil, errors.New("not found")
		case calls < 4:
			return nodeWithCIDRs(), nil
		}
		return nodeWithCIDRs("10.244.1.0/24", "fd00:10:244:1::/64"), nil
	}
	n, err := waitForPodCIDRs(ctx, get, time.Minute, time.Millisecond)
	if err != nil || len(n.Spec.PodCIDRs) != 2 || calls != 4 {
		t.Fatalf("waitForPodCIDRs = %v, %v after %d calls", n, err, calls)
	}
	noCIDRs := func(context.Context) (*v1.Node, error) { return nodeWithCIDRs(), nil }
	if _, err := waitForPodCIDRs(ctx, noCIDRs, 20*time.Millisecond, time.Millisecond); err == nil || !strings.Contains(err.Error(), `PodCIDR allocation on node "node-a"`) {
		t.Errorf("no PodCIDRs: %v", err)
	}
	noNode := func(context.Context) (*v1.Node, error) { return nil, errors.New("not found") }
	if _, err := waitForPodCIDRs(ctx, noNode, 20*time.Millisecond, time.Millisecond); err == nil || !strings.Contains(err.Error(), "Node object to exist") {
		t.Errorf("no Node: %v", err)
	}
}

// stubBackend accepts every sync and keeps the last request.
type stubBackend struct{ last *proxier.SyncRequest }

func (b *stubBackend) Sync(_ context.Context, req *proxier.SyncRequest) (proxier.SyncResult, error) {
	b.last = req
	return proxier.SyncResult{}, nil
}
func (b *stubBackend) Cleanup(context.Context) error { return nil }

// The Node registered again with other PodCIDRs: each family's detection follows
// them (kube-proxy exits to pick them up); a Node without them keeps the last.
func TestFollowPodCIDRs(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []config.LocalMode{config.LocalModeNodeCIDR, config.LocalModeClusterCIDR} {
		cfg := &config.Config{DetectLocalMode: mode, ClusterCIDRs: []string{"10.244.0.0/16", "fd00:10:244::/56"}}
		first := nodeWithCIDRs("10.244.1.0/24", "fd00:10:244:1::/64")
		d := &Daemon{cfg: cfg, nodeName: "node-a", proxiers: map[*family.Family]*proxier.Proxier{}}
		backends := map[*family.Family]*stubBackend{}
		for _, f := range family.All {
			backends[f] = &stubBackend{}
			p, err := proxier.New(proxier.Config{Family: f, NodeName: "node-a", Backend: backends[f], Local: localDetector(cfg, f, first)})
			if err != nil {
				t.Fatal(err)
			}
			d.proxiers[f] = p
		}
		h := &handler{d: d}
		for _, n := range []*v1.Node{nodeWithCIDRs("10.244.7.0/24", "fd00:10:244:7::/64"), nodeWithCIDRs()} {
			h.followPodCIDRs(n)
			for f, p := range d.proxiers {
				if err := p.Sync(ctx, false); err != nil {
					t.Fatal(err)
				}
				want := map[*family.Family]string{family.IPv4: "10.244.7.0/24", family.IPv6: "fd00:10:244:7::/64"}[f]
				if mode == config.LocalModeClusterCIDR {
					want = map[*family.Family]string{family.IPv4: "10.244.0.0/16", family.IPv6: "fd00:10:244::/56"}[f]
				}
				if got := backends[f].last.Node.Local; len(got.CIDRs) != 1 || got.CIDRs[0] != netip.MustParsePrefix(want) {
					t.Errorf("%s, %s, after a Node with PodCIDRs %v: local detection %+v, want %s", mode, f, n.Spec.PodCIDRs, got, want)
				}
			}
		}
	}
}

// Families and their node IPs as kube-proxy v1.36 takes them: every family the
// kernel supports is proxied, one the Node lists no IP of with the loopback
// address; a specific --bind-address overrides its family's node IP only.
func TestFamilyNodeIPs(t *testing.T) {
	proc := t.TempDir()
	if err := os.MkdirAll(filepath.Join(proc, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "net/if_inet6"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	disable := filepath.Join(proc, "sys/net/ipv6/conf/all/disable_ipv6")
	if err := os.MkdirAll(filepath.Dir(disable), 0o755); err != nil {
		t.Fatal(err)
	}
	node := func(addrs ...string) *v1.Node {
		n := nodeWithCIDRs()
		for _, a := range addrs {
			n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: a})
		}
		return n
	}
	for _, tc := range []struct {
		name         string
		node         *v1.Node
		nodeIP, bind string
		ipv6Off      bool
		want4, want6 string // "": not proxied
	}{
		{"dual-stack Node", node("10.0.0.5", "fd00::5"), "", "", false, "10.0.0.5", "fd00::5"},
		{"IPv4-only Node: IPv6 proxied with ::1", node("10.0.0.5"), "", "", false, "10.0.0.5", "::1"},
		{"IPv4-only Node, IPv6 disabled", node("10.0.0.5"), "", "", true, "10.0.0.5", ""},
		{"IPv6-only Node: IPv4 proxied with 127.0.0.1", node("fd00::5"), "", "", false, "127.0.0.1", "fd00::5"},
		{"--node-ip IPv4 asks for single-stack", node("10.0.0.5", "fd00::5"), "IPv4", "", false, "10.0.0.5", ""},
		{"--bind-address overrides its family only", node("10.0.0.5", "fd00::5"), "", "10.0.0.9", false, "10.0.0.9", "fd00::5"},
		{"--bind-address IPv6, not among the Node's", node("10.0.0.5", "fd00::5"), "", "fd00::9", false, "10.0.0.5", "fd00::9"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := "0\n"
			if tc.ipv6Off {
				v = "1\n"
			}
			if err := os.WriteFile(disable, []byte(v), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg := &config.Config{NodeIP: tc.nodeIP, BindAddress: tc.bind}
			if tc.bind == "" {
				cfg.BindAddress = "0.0.0.0"
			}
			spec, err := NodeIPSpec(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ips, err := nodeip.NodeIPs(tc.node, spec, nodeip.Options{Mode: nodeip.NoCloud})
			if err != nil {
				t.Fatal(err)
			}
			nodeIPs := familyNodeIPs(ips, bindNodeIP(cfg))
			for f, want := range map[*family.Family]string{family.IPv4: tc.want4, family.IPv6: tc.want6} {
				ip, ok, why := familyNodeIP(f, ips, nodeIPs, proc)
				got := ""
				if ok {
					got = ip.String()
				}
				if got != want {
					t.Errorf("%s: node IP %q (proxied %v, %s), want %q", f, got, ok, why, want)
				}
			}
		})
	}
}

// Logging options behind a logging feature gate are valid once the gate is on, as
// in kube-proxy; other gates are ignored here. (Applying can happen once per
// process, so this validates what ApplyLogging applies.)
func TestLoggingGates(t *testing.T) {
	check := func(cfg *config.Config) string {
		t.Helper()
		fg, err := loggingGates(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return logsapi.Validate(&cfg.Logging, fg, nil).ToAggregate().Error()
	}
	cfg := config.Default()
	cfg.Logging.Options.Text.SplitStream = true
	if errs := check(cfg); !strings.Contains(errs, "LoggingAlphaOptions") {
		t.Errorf("split stream without LoggingAlphaOptions: %q, want the gate's error", errs)
	}
	cfg.FeatureGates = map[string]bool{"LoggingAlphaOptions": true, "AllowServiceExternalIPs": false}
	fg, err := loggingGates(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if errs := logsapi.Validate(&cfg.Logging, fg, nil); len(errs) != 0 {
		t.Errorf("split stream with LoggingAlphaOptions=true: %v", errs)
	}
}
