package bench

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dsproxy/dsproxy/pkg/endpointslice"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
)

var sizes = []int{1000, 10000, 30000}

// familyModel is the pure part of one family proxier: trackers and desired state.
type familyModel struct {
	f     *family.Family
	svcs  *model.ServiceTracker
	eps   *endpointslice.Cache
	sm    model.ServiceMap
	em    model.EndpointsMap
	state *model.State
	node  model.NodeInfo
}

func newFamilyModel(f *family.Family, node string) *familyModel {
	return &familyModel{f: f, svcs: model.NewServiceTracker(f), eps: endpointslice.NewCache(f),
		sm: model.ServiceMap{}, em: model.EndpointsMap{}, state: model.NewState(), node: model.NodeInfo{Name: node}}
}

func (m *familyModel) sync(full bool) []model.ServicePortName {
	changed := m.svcs.Checkout(m.sm, full)
	for nn := range m.eps.Checkout(m.em, full) {
		changed[nn] = true
	}
	return m.state.Update(m.sm, m.em, m.node, changed, full)
}

type objects struct {
	svcs   []*v1.Service
	slices map[*family.Family][]*discovery.EndpointSlice
}

func generate(w Workload) objects {
	o := objects{slices: map[*family.Family][]*discovery.EndpointSlice{}}
	for i := range w.Services {
		o.svcs = append(o.svcs, w.Service(i))
		for _, f := range family.All {
			o.slices[f] = append(o.slices[f], w.Slice(f, i, w.EndpointsPerFamily))
		}
	}
	return o
}

// BenchmarkSnapshotToState measures turning a dual-stack cluster snapshot (Services
// and EndpointSlices as the informers deliver them) into the desired state of both
// families: ingestion, validation, merging, endpoint selection.
func BenchmarkSnapshotToState(b *testing.B) {
	for _, n := range sizes {
		w := Workload{Services: n, EndpointsPerFamily: 10, NodePortEvery: 4, NodeName: "node-0"}
		o := generate(w)
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for _, f := range family.All {
					m := newFamilyModel(f, w.NodeName)
					for i, s := range o.svcs {
						m.svcs.Update(nil, s)
						m.eps.Update(endpointslice.Ingest(o.slices[f][i], m.node.Name))
					}
					if got := len(m.sync(true)); got != n {
						b.Fatalf("%s: %d ports changed, want %d", f, got, n)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1e6, "ms/snapshot")
		})
	}
}

// BenchmarkOneEndpointUpdate measures the pure part of a sync after one endpoint of
// one Service is added or removed, in a cluster of n dual-stack Services: slice
// ingestion, checkout and the state update that yields the one changed port.
func BenchmarkOneEndpointUpdate(b *testing.B) {
	for _, n := range sizes {
		w := Workload{Services: n, EndpointsPerFamily: 10, NodePortEvery: 4, NodeName: "node-0"}
		o := generate(w)
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			f := family.IPv6
			m := newFamilyModel(f, w.NodeName)
			for i, s := range o.svcs {
				m.svcs.Update(nil, s)
				m.eps.Update(endpointslice.Ingest(o.slices[f][i], m.node.Name))
			}
			m.sync(true)
			target := n / 2
			grown, shrunk := w.Slice(f, target, 11), o.slices[f][target]
			want := model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "bench", Name: o.svcs[target].Name}, Port: "http", Protocol: v1.ProtocolTCP}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				es := grown
				if i%2 == 1 {
					es = shrunk
				}
				i++
				m.eps.Update(endpointslice.Ingest(es, m.node.Name))
				if got := m.sync(false); len(got) != 1 || got[0] != want {
					b.Fatalf("changed %v, want [%v]", got, want)
				}
			}
		})
	}
}

// BenchmarkOneServiceAddDelete measures the pure part of the two syncs that create
// a new dual-stack-workload Service with 10 endpoints (one family) and delete it again,
// in a cluster of n Services: ingestion, checkout and the state updates, each yielding
// exactly the one changed port. One op is the pair.
func BenchmarkOneServiceAddDelete(b *testing.B) {
	for _, n := range sizes {
		w := Workload{Services: n + 1, EndpointsPerFamily: 10, NodePortEvery: 4, NodeName: "node-0"}
		o := generate(w)
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			f := family.IPv6
			m := newFamilyModel(f, w.NodeName)
			for i := range n {
				m.svcs.Update(nil, o.svcs[i])
				m.eps.Update(endpointslice.Ingest(o.slices[f][i], m.node.Name))
			}
			m.sync(true)
			s, es := o.svcs[n], o.slices[f][n]
			want := model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "bench", Name: s.Name}, Port: "http", Protocol: v1.ProtocolTCP}
			var addT, delT time.Duration
			b.ReportAllocs()
			for b.Loop() {
				t0 := time.Now()
				m.svcs.Update(nil, s)
				m.eps.Update(endpointslice.Ingest(es, m.node.Name))
				if got := m.sync(false); len(got) != 1 || got[0] != want {
					b.Fatalf("add: changed %v, want [%v]", got, want)
				}
				t1 := time.Now()
				if _, ok := m.state.Ports[want]; !ok {
					b.Fatalf("add: %v not in the state", want)
				}
				m.svcs.Update(s, nil)
				m.eps.Delete(endpointslice.Ingest(es, m.node.Name))
				if got := m.sync(false); len(got) != 1 || got[0] != want {
					b.Fatalf("delete: changed %v, want [%v]", got, want)
				}
				t2 := time.Now()
				if _, ok := m.state.Ports[want]; ok {
					b.Fatalf("delete: %v still in the state", want)
				}
				addT += t1.Sub(t0)
				delT += t2.Sub(t1)
			}
			// The two halves apart: a delete is expected to cost about an add.
			b.ReportMetric(float64(addT.Nanoseconds())/float64(b.N), "add-ns/op")
			b.ReportMetric(float64(delT.Nanoseconds())/float64(b.N), "delete-ns/op")
		})
	}
}
