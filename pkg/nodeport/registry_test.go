package nodeport

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// Family-specific test data; every case runs once with each family as "this".
var testClusterIP = map[*family.Family]string{
	family.IPv4: "10.96.0.10",
	family.IPv6: "fd00:96::10",
}

// serves says which families a test Service serves, relative to the family under test.
type serves int

const (
	unknown serves = iota // no usable ipFamilies or clusterIPs
	this
	other
	both
)

func (s serves) families(f *family.Family) []*family.Family {
	switch s {
	case this:
		return []*family.Family{f}
	case other:
		return []*family.Family{f.Other()}
	case both:
		return []*family.Family{f, f.Other()}
	}
	return nil
}

// svcDef describes a test Service. Defaults: type NodePort, families from
// spec.ipFamilies and spec.clusterIPs both.
type svcDef struct {
	name    string // "ns/name"
	created int64  // Unix seconds; 0 leaves creationTimestamp unset
	serves  serves
	via     string // "" (ipFamilies and clusterIPs), "clusterIPs", "clusterIP", "badIPFamilies"
	typ     v1.ServiceType
	alloc   *bool
	ports   []v1.ServicePort
}

func (d svcDef) build(f *family.Family) *v1.Service {
	ns, name, _ := strings.Cut(d.name, "/")
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{
			Type:                          d.typ,
			AllocateLoadBalancerNodePorts: d.alloc,
			Ports:                         d.ports,
		},
	}
	if svc.Spec.Type == "" {
		svc.Spec.Type = v1.ServiceTypeNodePort
	}
	if d.created != 0 {
		svc.CreationTimestamp = metav1.NewTime(time.Unix(d.created, 0))
	}
	for _, ff := range d.serves.families(f) {
		svc.Spec.IPFamilies = append(svc.Spec.IPFamilies, ff.IPFamily)
		svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, testClusterIP[ff])
	}
	switch d.via {
	case "clusterIPs":
		svc.Spec.IPFamilies = nil
	case "clusterIP":
		svc.Spec.IPFamilies = nil
		svc.Spec.ClusterIP = first(svc.Spec.ClusterIPs)
		svc.Spec.ClusterIPs = nil
	case "badIPFamilies":
		svc.Spec.IPFamilies = []v1.IPFamily{"IPv5", ""}
	default:
		svc.Spec.ClusterIP = first(svc.Spec.ClusterIPs)
	}
	if d.serves == unknown {
		svc.Spec.ClusterIP = "None"
	}
	return svc
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

func port(proto v1.Protocol, nodePort int32) v1.ServicePort {
	return v1.ServicePort{Protocol: proto, Port: 80, NodePort: nodePort}
}

func tcp(nodePort int32) v1.ServicePort { return port(v1.ProtocolTCP, nodePort) }
func udp(nodePort int32) v1.ServicePort { return port(v1.ProtocolUDP, nodePort) }

func key(proto v1.Protocol, p uint16) Key { return Key{Protocol: proto, Port: p} }

var (
	tcp30000 = key(v1.ProtocolTCP, 30000)
	tcp30001 = key(v1.ProtocolTCP, 30001)
	udp30000 = key(v1.ProtocolUDP, 30000)
)

// op is an Update (def set) or a Delete (del set).
type op struct {
	def svcDef
	del string
}

func up(d svcDef) op     { return op{def: d} }
func del(name string) op { return op{del: name} }
func ptr[T any](v T) *T  { return &v }
func (o op) apply(r *Registry, f *family.Family) {
	if o.del != "" {
		ns, name, _ := strings.Cut(o.del, "/")
		r.Delete(&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
		return
	}
	r.Update(o.def.build(f))
}

func TestRegistry(t *testing.T) {
	tests := []struct {
		name      string
		ops       []op
		wantThis  []Key            // ReservedFor(this)
		wantOther []Key            // ReservedFor(other)
		wantOwner map[Key]string   // the whole Snapshot, Key → owner
		wantLoser map[Key][]string // Snapshot losers, where any
	}{{
		name:      "single-stack service reserves its port on the other family",
		ops:       []op{up(svcDef{name: "ns/a", serves: this, ports: []v1.ServicePort{tcp(30000)}})},
		wantOther: []Key{tcp30000},
		wantOwner: map[Key]string{tcp30000: "ns/a"},
	}, {
		name:      "dual-stack service reserves nothing",
		ops:       []op{up(svcDef{name: "ns/a", serves: both, ports: []v1.ServicePort{tcp(30000)}})},
		wantOwner: map[Key]string{tcp30000: "ns/a"},
	}, {
		name:      "families from clusterIPs when ipFamilies is empty",
		ops:       []op{up(svcDef{name: "ns/a", serves: this, via: "clusterIPs", ports: []v1.ServicePort{tcp(30000)}})},
		wantOther: []Key{tcp30000},
		wantOwner: map[Key]string{tcp30000: "ns/a"},
	}, {
		name:      "families from clusterIP when clusterIPs is empty too",
		ops:       []op{up(svcDef{name: "ns/a", serves: this, via: "clusterIP", ports: []v1.ServicePort{tcp(30000)}})},
		wantOther: []Key{tcp30000},
		wantOwner: map[Key]string{tcp30000: "ns/a"},
	}, {
		name:      "unknown ipFamilies fall back to clusterIPs",
		ops:       []op{up(svcDef{name: "ns/a", serves: this, via: "badIPFamilies", ports: []v1.ServicePort{tcp(30000)}})},
		wantOther: []Key{tcp30000},
		wantOwner: map[Key]string{tcp30000: "ns/a"},
	}, {
		name:      "undeterminable families reserve on both",
		ops:       []op{up(svcDef{name: "ns/a", serves: unknown, ports: []v1.ServicePort{tcp(30000)}})},
		wantThis:  []Key{tcp30000},
		wantOther: []Key{tcp30000},
		wantOwner: map[Key]string{tcp30000: "ns/a"},
	}, {
		name: "TCP and UDP on one port are separate keys",
		ops: []op{
			up(svcDef{name: "ns/a", serves: this, ports: []v1.ServicePort{tcp(30000)}}),
			up(svcDef{name: "ns/b", serves: other, ports: []v1.ServicePort{udp(30000)}}),
		},
		wantThis:  []Key{udp30000},
		wantOther: []Key{tcp30000},
		wantOwner: map[Key]string{tcp30000: "ns/a", udp30000: "ns/b"},
	}, {
		name:      "empty protocol is TCP; duplicate ports collapse",
		ops:       []op{up(svcDef{name: "ns/a", serves: this, ports: []v1.ServicePort{port("", 30000), tcp(30000)}})},
		wantOther: []Key{tcp30000},
		wantOwner: map[Key]string{tcp30000: "ns/a"},
	}, {
		name: "ClusterIP and ExternalName services claim nothing",
		ops: []op{
			up(svcDef{name: "ns/a", serves: this, typ: v1.ServiceTypeClusterIP, ports: []v1.ServicePort{tcp(30000)}}),
			up(svcDef{name: "ns/b", serves: this, typ: v1.ServiceTypeExternalName, ports: []v1.ServicePort{tcp(30001)}}),
		},
	}, {
		name: "LoadBalancer without allocated NodePorts keeps explicit ones",
		ops: []op{up(svcDef{name: "ns/a", serves: this, typ: v1.ServiceTypeLoadBalancer, alloc: ptr(false),
			ports: []v1.ServicePort{tcp(0), tcp(30001)}})},
		wantOther: []Key{tcp30001},
		wantOwner: map[Key]string{tcp30001: "ns/a"},
	}, {
		name: "unusable ports are ignored, the rest kept",
		ops: []op{up(svcDef{name: "ns/a", serves: this, ports: []v1.ServicePort{
			tcp(0), tcp(-1), tcp(65536), tcp(1 << 30), port("ICMP", 30001), udp(30000)}})},
		wantOther: []Key{udp30000},
		wantOwner: map[Key]string{udp30000: "ns/a"},
	}, {
		name: "conflict: the oldest Service wins",
		ops: []op{
			up(svcDef{name: "ns/a", created: 200, serves: this, ports: []v1.ServicePort{tcp(30000)}}),
			up(svcDef{name: "ns/b", created: 100, serves: other, ports: []v1.ServicePort{tcp(30000)}}),
		},
		wantThis:  []Key{tcp30000},
		wantOwner: map[Key]string{tcp30000: "ns/b"},
		wantLoser: map[Key][]string{tcp30000: {"ns/a"}},
	}, {
		name: "conflict: a tie goes to namespace, then name",
		ops: []op{
			up(svcDef{name: "ns2/a", created: 100, serves: other, ports: []v1.ServicePort{tcp(30000)}}),
			up(svcDef{name: "ns1/b", created: 100, serves: this, ports: []v1.ServicePort{tcp(30000)}}),
			up(svcDef{name: "ns1/a", created: 100, serves: other, ports: []v1.ServicePort{tcp(30000)}}),
		},
		wantThis:  []Key{tcp30000},
		wantOwner: map[Key]string{tcp30000: "ns1/a"},
		wantLoser: map[Key][]string{tcp30000: {"ns1/b", "ns2/a"}},
	}, {
		name: "conflict: a Service without creationTimestamp loses",
		ops: []op{
			up(svcDef{name: "ns/a", serves: other, ports: []v1.ServicePort{tcp(30000)}}),
			up(svcDef{name: "ns/b", created: 300, serves: this, ports: []v1.ServicePort{tcp(30000)}}),
		},
		wantOther: []Key{tcp30000},
		wantOwner: map[Key]string{tcp30000: "ns/b"},
		wantLoser: map[Key][]string{tcp30000: {"ns/a"}},
	}, {
		name: "conflict: the loser takes over when the winner is deleted",
		ops: []op{
			up(svcDef{name: "ns/a", created: 200, serves: this, ports: []v1.ServicePort{tcp(30000)}}),
			up(svcDef{name: "ns/b", created: 100, serves: other, ports: []v1.ServicePort{tcp(30000)}}),
			del("ns/b"),
		},
		wantOther: []Key{tcp30000},
		wantOwner: map[Key]string{tcp30000: "ns/a"},
	}, {
		name: "conflict: the loser takes over when the winner moves to another port",
		ops: []op{
			up(svcDef{name: "ns/a", created: 200, serves: this, ports: []v1.ServicePort{tcp(30000)}}),
			up(svcDef{name: "ns/b", created: 100, serves: other, ports: []v1.ServicePort{tcp(30000)}}),
			up(svcDef{name: "ns/b", created: 100, serves: other, ports: []v1.ServicePort{tcp(30001)}}),
		},
		wantThis:  []Key{tcp30001},
		wantOther: []Key{tcp30000},
		wantOwner: map[Key]string{tcp30000: "ns/a", tcp30001: "ns/b"},
	}, {
		name: "update to another port releases the old one",
		ops: []op{
			up(svcDef{name: "ns/a", serves: this, ports: []v1.ServicePort{tcp(30000)}}),
			up(svcDef{name: "ns/a", serves: this, ports: []v1.ServicePort{tcp(30001)}}),
		},
		wantOther: []Key{tcp30001},
		wantOwner: map[Key]string{tcp30001: "ns/a"},
	}, {
		name: "update to another family moves the reservation",
		ops: []op{
			up(svcDef{name: "ns/a", serves: this, ports: []v1.ServicePort{tcp(30000)}}),
			up(svcDef{name: "ns/a", serves: other, ports: []v1.ServicePort{tcp(30000)}}),
		},
		wantThis:  []Key{tcp30000},
		wantOwner: map[Key]string{tcp30000: "ns/a"},
	}, {
		name: "update to type ClusterIP releases everything",
		ops: []op{
			up(svcDef{name: "ns/a", serves: this, ports: []v1.ServicePort{tcp(30000), udp(30000)}}),
			up(svcDef{name: "ns/a", serves: this, typ: v1.ServiceTypeClusterIP, ports: []v1.ServicePort{tcp(30000)}}),
		},
	}, {
		name: "delete releases; deleting again or an unknown Service is a no-op",
		ops: []op{
			up(svcDef{name: "ns/a", serves: this, ports: []v1.ServicePort{tcp(30000)}}),
			up(svcDef{name: "ns/b", serves: other, ports: []v1.ServicePort{udp(30000)}}),
			del("ns/a"), del("ns/a"), del("ns/zzz"),
		},
		wantThis:  []Key{udp30000},
		wantOwner: map[Key]string{udp30000: "ns/b"},
	}}
	for _, tc := range tests {
		for _, f := range family.All {
			t.Run(tc.name+"/"+f.Name, func(t *testing.T) {
				logger, _ := ktesting.NewTestContext(t)
				r := New(logger)
				for _, o := range tc.ops {
					o.apply(r, f)
				}
				checkReserved(t, r, f, tc.wantThis)
				checkReserved(t, r, f.Other(), tc.wantOther)
				owners, losers := map[Key]string{}, map[Key][]string{}
				for _, c := range r.Snapshot() {
					owners[c.Key] = c.Owner.String()
					for _, l := range c.Losers {
						losers[c.Key] = append(losers[c.Key], l.String())
					}
					if got, ok := r.Owner(c.Key); !ok || got != c.Owner {
						t.Errorf("Owner(%v) = %v, %v; Snapshot says %v", c.Key, got, ok, c.Owner)
					}
				}
				if !maps.Equal(owners, orEmpty(tc.wantOwner)) {
					t.Errorf("owners = %v, want %v", owners, tc.wantOwner)
				}
				if !maps.EqualFunc(losers, orEmpty(tc.wantLoser), slices.Equal) {
					t.Errorf("losers = %v, want %v", losers, tc.wantLoser)
				}
			})
		}
	}
}

func orEmpty[V any](m map[Key]V) map[Key]V {
	if m == nil {
		return map[Key]V{}
	}
	return m
}

func checkReserved(t *testing.T, r *Registry, f *family.Family, want []Key) {
	t.Helper()
	got := r.ReservedFor(f)
	if got.Family != f || !slices.Equal(got.Keys, want) {
		t.Errorf("ReservedFor(%v) = %v %v, want %v", f, got.Family, got.Keys, want)
	}
	for _, k := range want {
		if !got.Has(k) {
			t.Errorf("ReservedFor(%v).Has(%v) = false", f, k)
		}
	}
}

// TestNotifications checks that OnChange and Generation report a family exactly when
// its reserved set changes.
func TestNotifications(t *testing.T) {
	steps := []struct {
		name string
		op   op
		want []serves // families notified, as this / other
	}{
		{"single-stack add", up(svcDef{name: "ns/a", created: 100, serves: this, ports: []v1.ServicePort{tcp(30000)}}), []serves{other}},
		{"same object again (resync)", up(svcDef{name: "ns/a", created: 100, serves: this, ports: []v1.ServicePort{tcp(30000)}}), nil},
		{"unusable port added", up(svcDef{name: "ns/a", created: 100, serves: this, ports: []v1.ServicePort{tcp(30000), tcp(-5)}}), nil},
		{"newer dual-stack conflict loses", up(svcDef{name: "ns/b", created: 200, serves: both, ports: []v1.ServicePort{tcp(30000)}}), nil},
		{"owner deleted, dual-stack loser takes over", del("ns/a"), []serves{other}},
		{"dual-stack port added", up(svcDef{name: "ns/b", created: 200, serves: both, ports: []v1.ServicePort{tcp(30000), udp(30000)}}), nil},
		{"becomes single-stack other", up(svcDef{name: "ns/b", created: 200, serves: other, ports: []v1.ServicePort{tcp(30000), udp(30000)}}), []serves{this}},
		{"single-stack other of the same port, older, takes over", up(svcDef{name: "ns/c", created: 50, serves: other, ports: []v1.ServicePort{tcp(30000)}}), nil},
		{"unknown families take a port", up(svcDef{name: "ns/d", created: 60, serves: unknown, ports: []v1.ServicePort{tcp(30001)}}), []serves{this, other}},
		{"everything deleted", del("ns/b"), []serves{this}},
		{"delete of unknown service", del("ns/zzz"), nil},
	}
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			logger, _ := ktesting.NewTestContext(t)
			r := New(logger)
			var mu sync.Mutex
			var got []*family.Family
			r.OnChange(func(ff *family.Family) {
				// The change must be visible to readers by now.
				_ = r.ReservedFor(ff)
				mu.Lock()
				got = append(got, ff)
				mu.Unlock()
			})
			r.OnChange(nil)
			gens := map[*family.Family]uint64{}
			for _, s := range steps {
				got = nil
				s.op.apply(r, f)
				var want []*family.Family
				for _, w := range s.want {
					want = append(want, w.families(f)...)
				}
				slices.SortFunc(want, func(a, b *family.Family) int { return a.BitLen - b.BitLen })
				if !slices.Equal(got, want) {
					t.Errorf("%s: notified %v, want %v", s.name, got, want)
				}
				for _, ff := range family.All {
					g := r.ReservedFor(ff).Generation
					if wantGen := gens[ff] + boolToUint(slices.Contains(want, ff)); g != wantGen {
						t.Errorf("%s: %v generation %d, want %d", s.name, ff, g, wantGen)
					}
					gens[ff] = g
				}
			}
		})
	}
}

func boolToUint(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	MustRegister(reg)
	conflicts := func() float64 {
		var m dto.Metric
		if err := conflictsTotal.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	reservations := func(f *family.Family) float64 {
		var m dto.Metric
		if err := reservationsGauge.WithLabelValues(f.Name).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetGauge().GetValue()
	}
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			logger, _ := ktesting.NewTestContext(t)
			r := New(logger)
			base := conflicts()
			a := svcDef{name: "ns/a", created: 100, serves: this, ports: []v1.ServicePort{tcp(30000), tcp(30001)}}
			b := svcDef{name: "ns/b", created: 200, serves: both, ports: []v1.ServicePort{tcp(30000)}}
			r.Update(a.build(f))
			if got := reservations(f.Other()); got != 2 {
				t.Errorf("reservations{%v} = %v, want 2", f.Other(), got)
			}
			r.Update(b.build(f))
			r.Update(b.build(f)) // a resync is not a new conflict
			b.created = 150
			r.Update(b.build(f)) // nor is a reordering
			if got := conflicts() - base; got != 1 {
				t.Errorf("conflicts counted %v, want 1", got)
			}
			r.Delete(a.build(f))
			if got, got2 := reservations(f.Other()), reservations(f); got != 0 || got2 != 0 {
				t.Errorf("reservations after delete = %v, %v, want 0, 0", got, got2)
			}
			r.Update(a.build(f))
			if got := conflicts() - base; got != 2 {
				t.Errorf("conflicts counted %v, want 2", got)
			}
		})
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, fmt.Sprintf("%s/%d", mf.GetName(), len(mf.GetMetric())))
	}
	if want := []string{"dsproxy_nodeport_conflicts_total/1", "dsproxy_nodeport_reservations/2"}; !slices.Equal(names, want) {
		t.Errorf("gathered %v, want %v", names, want)
	}
}

// TestHostileInput feeds objects the apiserver would never produce.
func TestHostileInput(t *testing.T) {
	tests := []struct {
		name       string
		svc        func(f *family.Family) *v1.Service
		wantOwners int
		reservedOn []serves
	}{
		{"nil", func(*family.Family) *v1.Service { return nil }, 0, nil},
		{"zero value", func(*family.Family) *v1.Service { return &v1.Service{} }, 0, nil},
		{"no name", func(f *family.Family) *v1.Service {
			s := svcDef{name: "ns/", serves: this, ports: []v1.ServicePort{tcp(30000)}}.build(f)
			return s
		}, 0, nil},
		{"extreme ports", func(f *family.Family) *v1.Service {
			return svcDef{name: "ns/a", serves: this, ports: []v1.ServicePort{
				tcp(math.MinInt32), tcp(math.MaxInt32), tcp(65535), tcp(1), port("tcp", 30000)}}.build(f)
		}, 2, []serves{other}},
		{"zoned and invalid clusterIPs name no family", func(f *family.Family) *v1.Service {
			s := svcDef{name: "ns/a", serves: this, via: "clusterIPs", ports: []v1.ServicePort{tcp(30000)}}.build(f)
			s.Spec.ClusterIPs = []string{"fe80::1%eth0", "garbage", ""}
			return s
		}, 1, []serves{this, other}},
		{"an IPv4-mapped clusterIP is IPv4, as kube-proxy reads it", func(f *family.Family) *v1.Service {
			s := svcDef{name: "ns/a", serves: this, via: "clusterIPs", ports: []v1.ServicePort{tcp(30000)}}.build(f)
			s.Spec.ClusterIPs = []string{map[*family.Family]string{family.IPv4: "::ffff:10.0.0.1", family.IPv6: "fd00::1"}[f]}
			return s
		}, 1, []serves{other}},
		{"repeated ipFamilies", func(f *family.Family) *v1.Service {
			s := svcDef{name: "ns/a", serves: this, ports: []v1.ServicePort{tcp(30000)}}.build(f)
			s.Spec.IPFamilies = []v1.IPFamily{f.IPFamily, f.IPFamily, "IPv5"}
			return s
		}, 1, []serves{other}},
		{"allocateLoadBalancerNodePorts on a NodePort Service is ignored", func(f *family.Family) *v1.Service {
			return svcDef{name: "ns/a", serves: this, alloc: ptr(false), ports: []v1.ServicePort{tcp(0), tcp(30000)}}.build(f)
		}, 1, []serves{other}},
		{"unknown type", func(f *family.Family) *v1.Service {
			return svcDef{name: "ns/a", serves: this, typ: "Bogus", ports: []v1.ServicePort{tcp(30000)}}.build(f)
		}, 0, nil},
		{"many ports", func(f *family.Family) *v1.Service {
			s := svcDef{name: "ns/a", serves: this}.build(f)
			for i := range 70000 {
				s.Spec.Ports = append(s.Spec.Ports, tcp(int32(i%65537)))
			}
			return s
		}, 65535, []serves{other}},
	}
	for _, tc := range tests {
		for _, f := range family.All {
			t.Run(tc.name+"/"+f.Name, func(t *testing.T) {
				logger, _ := ktesting.NewTestContext(t)
				r := New(logger)
				svc := tc.svc(f)
				r.Update(svc)
				if got := len(r.Snapshot()); got != tc.wantOwners {
					t.Errorf("%d keys owned, want %d", got, tc.wantOwners)
				}
				for _, ff := range family.All {
					want := 0
					if slices.ContainsFunc(tc.reservedOn, func(s serves) bool { return slices.Contains(s.families(f), ff) }) {
						want = tc.wantOwners
					}
					if got := len(r.ReservedFor(ff).Keys); got != want {
						t.Errorf("%v reserves %d keys, want %d", ff, got, want)
					}
				}
				r.Delete(svc)
				if got := r.Snapshot(); len(got) != 0 {
					t.Errorf("after Delete: %v", got)
				}
			})
		}
	}
	if got := New(ktesting.NewLogger(t, ktesting.NewConfig())).ReservedFor(&family.Family{Name: "IPv5"}); len(got.Keys) != 0 || got.Generation != 0 {
		t.Errorf("ReservedFor(unknown family) = %v", got)
	}
}

// TestConcurrentUse runs writers and readers together; run it with -race.
func TestConcurrentUse(t *testing.T) {
	r := New(logr.Discard())
	var notified sync.Map
	r.OnChange(func(f *family.Family) {
		_ = r.ReservedFor(f)
		notified.Store(f, true)
	})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 200 {
				f := family.All[(w+i)%2]
				d := svcDef{name: fmt.Sprintf("ns/w%d", w), created: int64(w), serves: serves(i % 4),
					ports: []v1.ServicePort{tcp(int32(30000 + i%5)), udp(30000)}}
				r.Update(d.build(f))
				if i%3 == 0 {
					r.Delete(d.build(f))
				}
			}
			r.Delete(svcDef{name: fmt.Sprintf("ns/w%d", w)}.build(family.IPv4))
		})
	}
	for range 4 {
		wg.Go(func() {
			for range 200 {
				for _, f := range family.All {
					for _, k := range r.ReservedFor(f).Keys {
						r.Owner(k)
					}
				}
				r.Snapshot()
			}
		})
	}
	wg.Wait()
	if got := r.Snapshot(); len(got) != 0 {
		t.Errorf("all Services deleted, still claimed: %v", got)
	}
	for _, f := range family.All {
		if got := r.ReservedFor(f); len(got.Keys) != 0 {
			t.Errorf("ReservedFor(%v) = %v", f, got.Keys)
		}
		if _, ok := notified.Load(f); !ok {
			t.Errorf("%v never notified", f)
		}
	}
}
