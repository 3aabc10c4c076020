package endpointslice

import (
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/objmeta"
)

var webNN = types.NamespacedName{Namespace: "ns", Name: "web"}

func spn(port string, proto v1.Protocol) model.ServicePortName {
	return model.ServicePortName{NamespacedName: webNN, Port: port, Protocol: proto}
}

// slice builds an EndpointSlice of family f for Service "web" with one TCP port
// "http" numbered port, and endpoints at pod addresses ns (ready, on node-b).
func slice(f *family.Family, name string, port int32, ns ...int) *discovery.EndpointSlice {
	es := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{discovery.LabelServiceName: "web"}},
		AddressType: f.AddressType,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(port), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for _, n := range ns {
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{testaddr.Pod(f, n).String()}, NodeName: ptr.To("node-b")})
	}
	return es
}

func endpointsString(f *family.Family, eps []model.Endpoint) string {
	var s []string
	for _, e := range eps {
		for n := 0; n < 64; n++ {
			if testaddr.Pod(f, n) == e.Addr {
				tag := ""
				if e.Terminating {
					tag = "T"
				}
				if e.Local {
					tag += "L"
				}
				s = append(s, fmt.Sprintf("%d:%d%s", n, e.Port, tag))
			}
		}
	}
	return strings.Join(s, " ")
}

func TestCacheMerge(t *testing.T) {
	type step struct {
		update *discovery.EndpointSlice
		delete *discovery.EndpointSlice
	}
	cases := []struct {
		name    string
		steps   func(f *family.Family) []step
		want    map[model.ServicePortName]string
		changed bool // whether the last step reports a change
	}{
		{name: "two slices merged and sorted",
			steps: func(f *family.Family) []step {
				return []step{{update: slice(f, "b", 80, 3, 1)}, {update: slice(f, "a", 80, 2)}}
			},
			want: map[model.ServicePortName]string{spn("http", v1.ProtocolTCP): "1:80 2:80 3:80"}, changed: true},
		{name: "one slice, unsorted, is merged sorted",
			steps: func(f *family.Family) []step {
				return []step{{update: slice(f, "a", 80, 3, 1, 2)}}
			},
			want: map[model.ServicePortName]string{spn("http", v1.ProtocolTCP): "1:80 2:80 3:80"}, changed: true},
		{name: "duplicate within one slice keeps the non-terminating copy",
			steps: func(f *family.Family) []step {
				a := slice(f, "a", 80, 2, 1, 1)
				a.Endpoints[1].Conditions.Terminating = ptr.To(true)
				return []step{{update: a}}
			},
			want: map[model.ServicePortName]string{spn("http", v1.ProtocolTCP): "1:80 2:80"}, changed: true},
		{name: "duplicate within one slice, both terminating, keeps one",
			steps: func(f *family.Family) []step {
				a := slice(f, "a", 80, 1, 1)
				a.Endpoints[0].Conditions.Terminating = ptr.To(true)
				a.Endpoints[1].Conditions.Terminating = ptr.To(true)
				return []step{{update: a}}
			},
			want: map[model.ServicePortName]string{spn("http", v1.ProtocolTCP): "1:80T"}, changed: true},
		{name: "one slice without endpoints has no port",
			steps: func(f *family.Family) []step {
				return []step{{update: slice(f, "a", 80)}}
			},
			want: map[model.ServicePortName]string{}, changed: true},
		{name: "duplicate across slices keeps the non-terminating copy",
			steps: func(f *family.Family) []step {
				a := slice(f, "a", 80, 1)
				b := slice(f, "b", 80, 1)
				a.Endpoints[0].Conditions.Terminating = ptr.To(true)
				return []step{{update: b}, {update: a}}
			},
			want: map[model.ServicePortName]string{spn("http", v1.ProtocolTCP): "1:80"}, changed: true},
		{name: "same named port with different numbers per slice",
			steps: func(f *family.Family) []step {
				return []step{{update: slice(f, "a", 80, 1)}, {update: slice(f, "b", 8080, 2)}}
			},
			want: map[model.ServicePortName]string{spn("http", v1.ProtocolTCP): "1:80 2:8080"}, changed: true},
		{name: "several ports and protocols",
			steps: func(f *family.Family) []step {
				a := slice(f, "a", 80, 1)
				a.Ports = append(a.Ports, discovery.EndpointPort{Name: ptr.To("dns"), Port: ptr.To(int32(53)), Protocol: ptr.To(v1.ProtocolUDP)},
					discovery.EndpointPort{Name: ptr.To(""), Port: ptr.To(int32(9)), Protocol: ptr.To(v1.ProtocolSCTP)})
				return []step{{update: a}}
			},
			want:    map[model.ServicePortName]string{spn("http", v1.ProtocolTCP): "1:80", spn("dns", v1.ProtocolUDP): "1:53", spn("", v1.ProtocolSCTP): "1:9"},
			changed: true},
		{name: "deleting a slice removes its endpoints and empty ports",
			steps: func(f *family.Family) []step {
				return []step{{update: slice(f, "a", 80, 1)}, {update: slice(f, "b", 81, 2)}, {delete: slice(f, "a", 80)}}
			},
			want: map[model.ServicePortName]string{spn("http", v1.ProtocolTCP): "2:81"}, changed: true},
		{name: "no-op update is not a change",
			steps: func(f *family.Family) []step {
				b := slice(f, "a", 80, 1)
				b.ResourceVersion = "7"
				return []step{{update: slice(f, "a", 80, 1)}, {update: b}}
			},
			want: map[model.ServicePortName]string{spn("http", v1.ProtocolTCP): "1:80"}, changed: false},
		{name: "deleting an unknown slice is not a change",
			steps: func(f *family.Family) []step {
				return []step{{update: slice(f, "a", 80, 1)}, {delete: slice(f, "zzz", 80)}}
			},
			want: map[model.ServicePortName]string{spn("http", v1.ProtocolTCP): "1:80"}, changed: false},
		{name: "local endpoints marked",
			steps: func(f *family.Family) []step {
				a := slice(f, "a", 80, 1, 2)
				a.Endpoints[1].NodeName = ptr.To("node-a")
				return []step{{update: a}}
			},
			want: map[model.ServicePortName]string{spn("http", v1.ProtocolTCP): "1:80 2:80L"}, changed: true},
		{name: "a slice relabelled to another Service moves",
			steps: func(f *family.Family) []step {
				a := slice(f, "a", 80, 1)
				moved := slice(f, "a", 80, 1)
				moved.Labels[discovery.LabelServiceName] = "other"
				return []step{{update: a}, {update: moved}}
			},
			want: map[model.ServicePortName]string{
				{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "other"}, Port: "http", Protocol: v1.ProtocolTCP}: "1:80"},
			changed: true},
		{name: "a slice that becomes unusable is dropped",
			steps: func(f *family.Family) []step {
				bad := slice(f, "a", 80, 1)
				bad.Labels[model.LabelServiceProxyName] = "other-proxy"
				return []step{{update: slice(f, "a", 80, 1)}, {update: bad}}
			},
			want: map[model.ServicePortName]string{}, changed: true},
		{name: "bad endpoints skipped, good ones kept",
			steps: func(f *family.Family) []step {
				a := slice(f, "a", 80, 1)
				a.Endpoints = append(a.Endpoints,
					discovery.Endpoint{Addresses: []string{testaddr.Pod(f.Other(), 5).String()}},
					discovery.Endpoint{Addresses: nil},
					discovery.Endpoint{Addresses: []string{"not-an-ip"}},
					discovery.Endpoint{Addresses: []string{"::ffff:10.0.0.1"}},
					discovery.Endpoint{Addresses: []string{"fe80::1%eth0"}})
				a.Ports = append(a.Ports, discovery.EndpointPort{Name: nil, Port: ptr.To(int32(1))},
					discovery.EndpointPort{Name: ptr.To("z"), Port: ptr.To(int32(0))},
					discovery.EndpointPort{Name: ptr.To("y"), Port: ptr.To(int32(70000))},
					discovery.EndpointPort{Name: ptr.To("x"), Port: ptr.To(int32(5)), Protocol: ptr.To(v1.Protocol("ICMP"))})
				return []step{{update: a}}
			},
			want: map[model.ServicePortName]string{spn("http", v1.ProtocolTCP): "1:80"}, changed: true},
	}
	for _, f := range family.All {
		for _, tc := range cases {
			t.Run(f.Name+"/"+tc.name, func(t *testing.T) {
				c := NewCache(f)
				m := model.EndpointsMap{}
				var changed bool
				for _, st := range tc.steps(f) {
					if st.update != nil {
						changed = c.Update(Ingest(st.update, "node-a"))
					} else {
						changed = c.Delete(Ingest(st.delete, "node-a"))
					}
					c.Checkout(m, false)
				}
				if changed != tc.changed {
					t.Errorf("last step changed = %v, want %v", changed, tc.changed)
				}
				got := map[model.ServicePortName]string{}
				for k, v := range m {
					got[k] = endpointsString(f, v)
				}
				if fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Errorf("endpoints\n got %v\nwant %v", got, tc.want)
				}
				// A full checkout from scratch agrees with the incremental one.
				full := model.EndpointsMap{}
				c.Checkout(full, true)
				if fmt.Sprint(full) != fmt.Sprint(m) {
					t.Errorf("full checkout differs:\n%v\n%v", full, m)
				}
			})
		}
	}
}

// A Service with one single-port slice uses the parsed list as its merged one
// (no copy per Service); a second slice makes a list of its own, and the first
// slice's list is left as it was.
func TestCacheSharesSingleSliceList(t *testing.T) {
	f := family.IPv4
	c := NewCache(f)
	c.Update(Ingest(slice(f, "a", 80, 2, 1), "node-a"))
	m := model.EndpointsMap{}
	c.Checkout(m, false)
	key := spn("http", v1.ProtocolTCP)
	parsed := c.byService[webNN].slices[0].Endpoints
	if got := m[key]; len(got) != 2 || &got[0] != &parsed[0] {
		t.Fatalf("merged list %v is not the parsed slice's %v", got, parsed)
	}
	c.Update(Ingest(slice(f, "b", 80, 0), "node-a"))
	c.Checkout(m, false)
	if got := endpointsString(f, m[key]); got != "0:80 1:80 2:80" {
		t.Fatalf("two slices: %q", got)
	}
	if &m[key][0] == &parsed[0] {
		t.Fatal("merging two slices wrote into the first slice's list")
	}
	if got := endpointsString(f, parsed); got != "1:80 2:80" {
		t.Fatalf("first slice's list changed to %q", got)
	}
}

// Objects that did not come from Ingest for this family are skipped, not trusted.
func TestCacheSkipsForeignObjects(t *testing.T) {
	c := NewCache(family.IPv4)
	for _, o := range []*Object{
		nil,
		{},
		{Meta: objmeta.Meta{Namespace: "ns", Name: "x"}, Family: family.IPv4},
		Ingest(slice(family.IPv6, "a", 80, 1), "node-a"),
	} {
		if c.Update(o) {
			t.Errorf("Update(%+v) reported a change", o)
		}
	}
	if c.Pending() != 0 {
		t.Errorf("%d Services pending", c.Pending())
	}
}

func TestParseRejects(t *testing.T) {
	for _, f := range family.All {
		cases := []struct {
			name   string
			mutate func(*discovery.EndpointSlice)
			reason string
		}{
			{"wrong family", func(es *discovery.EndpointSlice) { es.AddressType = f.Other().AddressType }, "addressType"},
			{"FQDN", func(es *discovery.EndpointSlice) { es.AddressType = discovery.AddressTypeFQDN }, "addressType"},
			{"no service label", func(es *discovery.EndpointSlice) { delete(es.Labels, discovery.LabelServiceName) }, "no kubernetes.io/service-name label"},
			{"no name", func(es *discovery.EndpointSlice) { es.Name = "" }, "name and namespace"},
			{"too many endpoints", func(es *discovery.EndpointSlice) {
				es.Endpoints = make([]discovery.Endpoint, MaxEndpointsPerSlice+1)
			}, "more than 1000 endpoints"},
			{"too many ports", func(es *discovery.EndpointSlice) { es.Ports = make([]discovery.EndpointPort, MaxPortsPerSlice+1) }, "more than 20000 ports"},
			{"headless", func(es *discovery.EndpointSlice) { es.Labels[model.LabelHeadless] = "" }, "headless"},
		}
		for _, tc := range cases {
			t.Run(f.Name+"/"+tc.name, func(t *testing.T) {
				es := slice(f, "a", 80, 1)
				tc.mutate(es)
				_, _, err := Parse(f, es, "")
				if err == nil || !strings.Contains(err.Error(), tc.reason) {
					t.Fatalf("err = %v, want mention of %q", err, tc.reason)
				}
			})
		}
	}
	if _, _, err := Parse(family.IPv4, nil, ""); err == nil {
		t.Fatal("nil slice accepted")
	}
}

// A Service of more than 100 ports (an RTP or passive-FTP range) has slices of
// that many ports: the API server allows 20000, and kube-proxy serves them. They
// were rejected whole before, and every port of such a Service refused.
func TestParseManyPorts(t *testing.T) {
	for _, f := range family.All {
		es := slice(f, "a", 80, 1, 2)
		es.Ports = nil
		for i := range 1000 {
			es.Ports = append(es.Ports, discovery.EndpointPort{Name: ptr.To(fmt.Sprintf("p%d", i)), Port: ptr.To(int32(10000 + i)), Protocol: ptr.To(v1.ProtocolUDP)})
		}
		s, skips, err := Parse(f, es, "")
		if err != nil || len(skips) != 0 {
			t.Fatalf("%s: a slice of 1000 ports: %v %v", f, err, skips)
		}
		if len(s.Ports) != 1000 || len(s.Endpoints) != 2 {
			t.Fatalf("%s: %d ports, %d endpoints; want 1000 and 2", f, len(s.Ports), len(s.Endpoints))
		}
	}
}

func TestParseConditionsAndHints(t *testing.T) {
	for _, f := range family.All {
		es := slice(f, "a", 80, 1, 2)
		es.Endpoints[0].Conditions = discovery.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}
		es.Endpoints[1].Zone = ptr.To("z1")
		es.Endpoints[1].Hints = &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "z2"}, {Name: "z1"}, {Name: "z2"}}, ForNodes: []discovery.ForNode{{Name: "n"}}}
		s, skips, err := Parse(f, es, "node-b")
		if err != nil || len(skips) != 0 {
			t.Fatalf("%s: %v %v", f, err, skips)
		}
		e0, e1 := s.Endpoints[0], s.Endpoints[1]
		if e0.Ready || !e0.Serving || !e0.Terminating || !e0.Local {
			t.Errorf("%s: conditions of endpoint 0: %+v", f, e0)
		}
		if !e1.Ready || !e1.Serving || e1.Terminating || !e1.Local ||
			fmt.Sprint(e1.ZoneHints()) != "[z1 z2]" || fmt.Sprint(e1.NodeHints()) != "[n]" {
			t.Errorf("%s: endpoint 1: %+v", f, e1)
		}
	}
}

// An endpoint whose slice names no node is not local, and is marked NoNodeName
// (it may be a pod on this node; the backends masquerade it reaching itself).
func TestParseNoNodeName(t *testing.T) {
	for _, f := range family.All {
		es := slice(f, "a", 80, 1, 2, 3)
		es.Endpoints[0].NodeName = nil
		es.Endpoints[1].NodeName = ptr.To("")
		es.Endpoints[2].NodeName = ptr.To("node-c")
		s, skips, err := Parse(f, es, "node-b")
		if err != nil || len(skips) != 0 {
			t.Fatalf("%s: %v %v", f, err, skips)
		}
		for i, want := range []bool{true, true, false} {
			if e := s.Endpoints[i]; e.NoNodeName != want || e.Local {
				t.Errorf("%s: endpoint %d: %+v, want NoNodeName %v, not local", f, i, e, want)
			}
		}
	}
}

// A slice whose only change is an endpoint's nodeName going from unset to
// another node's (or back) is a change: NoNodeName decides whether the
// backends masquerade the endpoint reaching itself, and an update taken as
// unchanged would keep the old value until some other field changed.
func TestCacheNodeNameOnlyChange(t *testing.T) {
	for _, f := range family.All {
		c := NewCache(f)
		m := model.EndpointsMap{}
		unnamed := slice(f, "a", 80, 1)
		unnamed.Endpoints[0].NodeName = nil
		named := slice(f, "a", 80, 1)
		named.Endpoints[0].NodeName = ptr.To("node-c")
		for i, es := range []*discovery.EndpointSlice{unnamed, named, unnamed} {
			if !c.Update(Ingest(es, "node-b")) {
				t.Fatalf("%s: update %d (nodeName %s) reported no change", f, i, ptr.Deref(es.Endpoints[0].NodeName, "<unset>"))
			}
			c.Checkout(m, false)
			want := es.Endpoints[0].NodeName == nil
			if eps := m[spn("http", v1.ProtocolTCP)]; len(eps) != 1 || eps[0].NoNodeName != want {
				t.Fatalf("%s: update %d: endpoints %+v, want one with NoNodeName %v", f, i, eps, want)
			}
		}
	}
}

// Endpoint addresses stored before v1.36's StrictIPCIDRValidation may have leading
// zeros or an IPv4-mapped form: read as kube-proxy reads them, not dropped.
func TestParseLegacyAddresses(t *testing.T) {
	es := slice(family.IPv4, "a", 80)
	es.Endpoints = []discovery.Endpoint{{Addresses: []string{"010.000.001.001"}}, {Addresses: []string{"::ffff:10.0.1.2"}}}
	s, skips, err := Parse(family.IPv4, es, "")
	if err != nil || len(skips) != 0 || len(s.Endpoints) != 2 {
		t.Fatalf("Parse: %v, skips %v, %d endpoints", err, skips, len(s.Endpoints))
	}
	if a, b := s.Endpoints[0].Addr.String(), s.Endpoints[1].Addr.String(); a != "10.0.1.1" || b != "10.0.1.2" {
		t.Errorf("endpoints %s, %s; want 10.0.1.1, 10.0.1.2", a, b)
	}
	es6 := slice(family.IPv6, "b", 80)
	es6.Endpoints = []discovery.Endpoint{{Addresses: []string{"::ffff:10.0.1.2"}}}
	if s, skips, _ := Parse(family.IPv6, es6, ""); s != nil && len(s.Endpoints) != 0 || len(skips) != 1 {
		t.Errorf("an IPv4-mapped endpoint taken in an IPv6 slice: %+v, skips %v", s, skips)
	}
}
