package ipvs

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

// bigPort is port i of bigState: a ClusterIP of its own (10.96.0.0/16 and up)
// with eps endpoints, every fourth a NodePort.
func bigPort(f *family.Family, i, eps int) *model.PortState {
	ps := port(f, fmt.Sprintf("s%d", i), 0)
	ps.ClusterIP = netip.AddrFrom4([4]byte{10, 96 + byte(i>>16), byte(i >> 8), byte(i)})
	if f == family.IPv6 {
		ps.ClusterIP = netip.MustParseAddr(fmt.Sprintf("fd00:96::%x", i+1))
	}
	for e := range eps {
		ps.Cluster = append(ps.Cluster, model.Endpoint{Addr: addr(f, fmt.Sprintf("10.64.%d.%d", e, 1+i%250), fmt.Sprintf("fd00:64::%d:%d", e, 1+i%250)),
			Port: 8080, Ready: true, Serving: true})
	}
	ps.HasAny = eps > 0
	if i%4 == 0 && i < 2700*4 {
		ps.NodePort = uint16(30000 + i/4)
	}
	return ps
}

// bigState is n ports with 10 endpoints each.
func bigState(f *family.Family, n int) *model.State {
	st := model.NewState()
	for i := range n {
		ps := bigPort(f, i, 10)
		st.Ports[ps.Name] = ps
	}
	return st
}

// BenchmarkSync measures the IPVS backend's Go side over a fake kernel that
// accepts everything: a cold start, and a one-endpoint change. kernel-ops/op is
// the netlink requests the sync makes (virtual servers, real servers, ipset
// members, addresses).
func BenchmarkSync(b *testing.B) {
	f := family.IPv4
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("cold/services=%d", n), func(b *testing.B) {
			st := bigState(f, n)
			b.ReportAllocs()
			ops := 0
			for range b.N {
				k := newFake()
				if _, err := newBackend(f, k).Sync(context.Background(), &proxier.SyncRequest{Full: true, State: st, Node: node(f)}); err != nil {
					b.Fatal(err)
				}
				ops = k.ops
			}
			b.ReportMetric(float64(ops), "kernel-ops/op")
		})
		b.Run(fmt.Sprintf("one-endpoint/services=%d", n), func(b *testing.B) {
			st := bigState(f, n)
			k := newFake()
			be := newBackend(f, k)
			if _, err := be.Sync(context.Background(), &proxier.SyncRequest{Full: true, State: st, Node: node(f)}); err != nil {
				b.Fatal(err)
			}
			name := portName(fmt.Sprintf("s%d", n/2))
			orig, smaller := st.Ports[name], bigPort(f, n/2, 9)
			k.ops = 0
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
			b.ReportMetric(float64(k.ops)/float64(b.N), "kernel-ops/op")
		})
	}
}
