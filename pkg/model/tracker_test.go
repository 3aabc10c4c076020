package model

import (
	"slices"
	"strconv"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/family"
)

func TestServiceTracker(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			tr := NewServiceTracker(f)
			m := ServiceMap{}
			nn := types.NamespacedName{Namespace: "ns", Name: "web"}
			a := svcFor(f, nil)

			if !tr.Update(nil, a) || tr.Pending() != 1 {
				t.Fatal("add not recorded")
			}
			if got := tr.Checkout(m, false); !got[nn] || len(m[nn]) != 1 {
				t.Fatalf("checkout after add: changed %v map %v", got, m)
			}
			// A resync with an identical object is not a change.
			b := a.DeepCopy()
			b.ResourceVersion = "2"
			if tr.Update(a, b) || tr.Pending() != 0 {
				t.Fatal("no-op update recorded")
			}
			// Change then revert before checkout: nothing pending.
			c := b.DeepCopy()
			c.Spec.Ports[0].Port = 81
			if !tr.Update(b, c) {
				t.Fatal("port change not recorded")
			}
			if tr.Update(c, b) || tr.Pending() != 0 {
				t.Fatal("revert left a pending change")
			}
			// The other family's single-stack Service never enters this family.
			o := svcFor(f.Other(), func(s *v1.Service) { s.Name = "other" })
			if tr.Update(nil, o) {
				t.Fatal("other family's Service recorded")
			}
			// Becoming single-stack in the other family removes it here.
			d := svcFor(f.Other(), nil)
			if !tr.Update(b, d) {
				t.Fatal("family switch not recorded")
			}
			if got := tr.Checkout(m, false); !got[nn] || len(m) != 0 {
				t.Fatalf("after switch: changed %v map %v", got, m)
			}
			tr.Update(nil, a)
			tr.Checkout(m, false)
			if !tr.Update(a, nil) {
				t.Fatal("delete not recorded")
			}
			tr.Checkout(m, false)
			if len(m) != 0 {
				t.Fatalf("map after delete: %v", m)
			}
			// A full checkout rebuilds the map and reports everything.
			tr.Update(nil, a)
			tr.Checkout(m, false)
			m2 := ServiceMap{{Namespace: "stale", Name: "x"}: nil}
			got := tr.Checkout(m2, true)
			if !got[nn] || !got[types.NamespacedName{Namespace: "stale", Name: "x"}] || len(m2) != 1 || m2[nn][0].ClusterIP != testaddr.Svc(f, 10) {
				t.Fatalf("full checkout: changed %v map %v", got, m2)
			}
		})
	}
}

func TestStateUpdate(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			tr := NewServiceTracker(f)
			svcs, eps, st := ServiceMap{}, EndpointsMap{}, NewState()
			node := NodeInfo{Name: "node-a"}
			two := svcFor(f, func(s *v1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP})
			})
			tr.Update(nil, two)
			changed := tr.Checkout(svcs, false)
			names := st.Update(svcs, eps, node, changed, false)
			if len(names) != 2 || len(st.Ports) != 2 {
				t.Fatalf("add: changed %v, state %d", names, len(st.Ports))
			}
			http := ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web"}, Port: "http", Protocol: v1.ProtocolTCP}
			eps[http] = []Endpoint{{Addr: testaddr.Pod(f, 1), Port: 8080, Ready: true, Serving: true}}
			names = st.Update(svcs, eps, node, map[types.NamespacedName]bool{http.NamespacedName: true}, false)
			if !slices.Equal(names, []ServicePortName{http}) {
				t.Fatalf("endpoint add changed %v, want only %v", names, http)
			}
			if got := st.Ports[http].InternalEndpoints(); len(got) != 1 || got[0].Addr != testaddr.Pod(f, 1) {
				t.Fatalf("endpoints %v", got)
			}
			// A not-ready endpoint changes nothing that is programmed.
			eps[http] = append(eps[http], Endpoint{Addr: testaddr.Pod(f, 2), Port: 8080})
			if names = st.Update(svcs, eps, node, map[types.NamespacedName]bool{http.NamespacedName: true}, false); len(names) != 0 {
				t.Fatalf("not-ready endpoint changed %v", names)
			}
			// Removing one port reports it gone.
			one := two.DeepCopy()
			one.Spec.Ports = one.Spec.Ports[:1]
			tr.Update(two, one)
			names = st.Update(svcs, eps, node, tr.Checkout(svcs, false), false)
			if len(names) != 1 || names[0].Port != "dns" || len(st.Ports) != 1 {
				t.Fatalf("port removal changed %v, state %v", names, st.Ports)
			}
			// A full update of an unchanged world changes nothing.
			if names = st.Update(svcs, eps, node, nil, true); len(names) != 0 {
				t.Fatalf("full update of unchanged state changed %v", names)
			}
			tr.Update(one, nil)
			names = st.Update(svcs, eps, node, tr.Checkout(svcs, false), false)
			if len(names) != 1 || len(st.Ports) != 0 || len(st.byService) != 0 {
				t.Fatalf("delete: changed %v, state %v", names, st.Ports)
			}
		})
	}
}

func TestStatePrevious(t *testing.T) {
	f := family.IPv4
	tr := NewServiceTracker(f)
	svcs, eps, st := ServiceMap{}, EndpointsMap{}, NewState()
	svc := svcFor(f, nil)
	tr.Update(nil, svc)
	names := st.Update(svcs, eps, NodeInfo{}, tr.Checkout(svcs, false), false)
	if len(names) != 1 || st.Previous[names[0]] != nil || len(st.Previous) != 1 {
		t.Fatalf("new port: previous %v", st.Previous)
	}
	before := st.Ports[names[0]]
	tr.Update(svc, nil)
	st.Update(svcs, eps, NodeInfo{}, tr.Checkout(svcs, false), false)
	if st.Previous[names[0]] != before || len(st.Ports) != 0 {
		t.Fatalf("deleted port: previous %v", st.Previous)
	}
}

// With NoExternalIPs (kube-proxy's AllowServiceExternalIPs=false) a Service's
// externalIPs are left out, and the rest of it is kept.
func TestServiceTrackerNoExternalIPs(t *testing.T) {
	for _, off := range []bool{false, true} {
		tr := NewServiceTracker(family.IPv4)
		tr.NoExternalIPs = off
		svc := &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
				ExternalIPs: []string{"203.0.113.7"}, Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
		}
		if !tr.Update(nil, svc) {
			t.Fatal("no change recorded")
		}
		m := ServiceMap{}
		tr.Checkout(m, false)
		ports := m[types.NamespacedName{Namespace: "ns", Name: "web"}]
		if len(ports) != 1 || ports[0].ClusterIP.String() != "10.96.0.10" {
			t.Fatalf("NoExternalIPs=%v: ports %+v", off, ports)
		}
		if got := len(ports[0].ExternalIPs); got != map[bool]int{false: 1, true: 0}[off] {
			t.Errorf("NoExternalIPs=%v: %d external IPs", off, got)
		}
	}
}

// manyPorts returns a ClusterIP Service with ports p0 … p<n-1> (ports 1 … n).
func manyPorts(n int) *v1.Service {
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "big"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1"}}}
	for i := range n {
		svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{Name: "p" + strconv.Itoa(i), Port: int32(1 + i), Protocol: v1.ProtocolTCP})
	}
	return svc
}

// A Service that loses some of its many ports: exactly those go, whether the
// old names are looked up in the list (few) or in a set (many).
func TestStateManyPortsRemoved(t *testing.T) {
	for _, n := range []int{6, 40} {
		tr := NewServiceTracker(family.IPv4)
		svcs, st := ServiceMap{}, NewState()
		big := manyPorts(n)
		tr.Update(nil, big)
		if got := st.Update(svcs, EndpointsMap{}, NodeInfo{}, tr.Checkout(svcs, false), false); len(got) != n {
			t.Fatalf("%d ports: %d changed", n, len(got))
		}
		fewer := big.DeepCopy()
		fewer.Spec.Ports = slices.DeleteFunc(fewer.Spec.Ports, func(p v1.ServicePort) bool { return p.Port%3 == 0 })
		tr.Update(big, fewer)
		got := st.Update(svcs, EndpointsMap{}, NodeInfo{}, tr.Checkout(svcs, false), false)
		var want []string
		for i := range n {
			if (1+i)%3 == 0 {
				want = append(want, "p"+strconv.Itoa(i))
			}
		}
		var gotNames []string
		for _, name := range got {
			gotNames = append(gotNames, name.Port)
			if st.Ports[name] != nil || st.Previous[name] == nil {
				t.Errorf("%d ports: removed %s still in Ports or not in Previous", n, name)
			}
		}
		slices.Sort(gotNames)
		slices.Sort(want)
		if !slices.Equal(gotNames, want) {
			t.Errorf("%d ports: changed %v, want %v", n, gotNames, want)
		}
		if len(st.Ports) != len(fewer.Spec.Ports) {
			t.Errorf("%d ports: %d left, want %d", n, len(st.Ports), len(fewer.Spec.Ports))
		}
	}
}

// BenchmarkStateUpdateManyPorts: one Service of 20k ports synced again (the API
// sets no limit on ports; the old names were looked up in a list, 2.8 s here).
func BenchmarkStateUpdateManyPorts(b *testing.B) {
	tr := NewServiceTracker(family.IPv4)
	svcs, st := ServiceMap{}, NewState()
	tr.Update(nil, manyPorts(20000))
	changed := tr.Checkout(svcs, false)
	st.Update(svcs, EndpointsMap{}, NodeInfo{}, changed, false)
	for b.Loop() {
		st.Update(svcs, EndpointsMap{}, NodeInfo{}, changed, false)
	}
}
