package app

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dsproxy/dsproxy/pkg/config"
	"github.com/dsproxy/dsproxy/pkg/family"
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
