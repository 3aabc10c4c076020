package iptables

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// benchSizes are the Service counts of issue 5's micro-benchmarks.
var benchSizes = []int{1000, 10000, 30000}

// bigState is n ClusterIP ports with 10 endpoints each (addresses need not be
// unique across ports for rendering).
func bigState(f *family.Family, n int) *model.State {
	st := model.NewState()
	for i := range n {
		ps := port(f, fmt.Sprintf("s%d", i), 1+i%250, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
		st.Ports[ps.Name] = ps
	}
	return st
}

// syncedBig returns bigState(f, n) and a backend that synced it in full.
func syncedBig(b *testing.B, f *family.Family, n int) (*model.State, *Backend, *fakeRunner) {
	st := bigState(f, n)
	be, r := newBackend(&testing.T{}, f)
	if _, err := be.Sync(context.Background(), &proxier.SyncRequest{Full: true, State: st, Node: node(f)}); err != nil {
		b.Fatal(err)
	}
	return st, be, r
}

// BenchmarkSync measures the pure-Go cost of the iptables backend's syncs (state →
// restore input) with a runner that accepts everything: a cold start, and a
// one-endpoint change (what each sync hands iptables-restore is reported as
// bytes/op).
func BenchmarkSync(b *testing.B) {
	f := family.IPv4
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("cold/services=%d", n), func(b *testing.B) {
			st := bigState(f, n)
			b.ReportAllocs()
			var bytes int
			for range b.N {
				be, r := newBackend(&testing.T{}, f)
				if _, err := be.Sync(context.Background(), &proxier.SyncRequest{Full: true, State: st, Node: node(f)}); err != nil {
					b.Fatal(err)
				}
				bytes = len(r.last())
			}
			b.ReportMetric(float64(bytes), "bytes/op")
		})
		b.Run(fmt.Sprintf("one-endpoint/services=%d", n), func(b *testing.B) {
			st, be, r := syncedBig(b, f, n)
			name := portName(fmt.Sprintf("s%d", n/2))
			orig := st.Ports[name]
			smaller := port(f, name.Name, 1+(n/2)%250, 1, 2, 3, 4, 5, 6, 7, 8, 9)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				st.Ports[name] = orig
				if i%2 == 0 {
					st.Ports[name] = smaller
				}
				if _, err := be.Sync(context.Background(), &proxier.SyncRequest{State: st, Changed: []model.ServicePortName{name}, Node: node(f)}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(r.last())), "bytes/op")
		})
		// A node change (what every pod's arrival was, when its host-side
		// veth's link-local address counted among the NodePort addresses):
		// every chain rewritten.
		b.Run(fmt.Sprintf("node-change/services=%d", n), func(b *testing.B) {
			st, be, r := syncedBig(b, f, n)
			name := portName(fmt.Sprintf("s%d", n/2))
			// Two configs that differ in one listed address, as one more
			// veth's did.
			nodes := [2]*proxier.NodeConfig{node(f), node(f)}
			nodes[1].NodePortAddresses.Addrs = []netip.Addr{netip.MustParseAddr("169.254.7.7")}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if _, err := be.Sync(context.Background(), &proxier.SyncRequest{State: st, Changed: []model.ServicePortName{name}, Node: nodes[1-i%2], NodeChanged: true}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(r.last())), "bytes/op")
		})
	}
}
