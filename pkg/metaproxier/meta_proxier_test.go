package metaproxier

import (
	"slices"
	"testing"

	discovery "k8s.io/api/discovery/v1"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// setup returns a MetaProxier over recorders of the given families.
func setup(t *testing.T, fams ...*family.Family) (*MetaProxier, map[*family.Family]*recorder) {
	t.Helper()
	recs := map[*family.Family]*recorder{}
	var fps []FamilyProxier
	for _, f := range fams {
		recs[f] = newRecorder(f)
		fps = append(fps, recs[f])
	}
	m, err := New(fps...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return m, recs
}

func TestNew(t *testing.T) {
	v4, v6 := newRecorder(family.IPv4), newRecorder(family.IPv6)
	for _, tc := range []struct {
		name     string
		proxiers []FamilyProxier
		want     []*family.Family // nil: an error
	}{
		{"none", nil, nil},
		{"nil proxier", []FamilyProxier{nil}, nil},
		{"no family", []FamilyProxier{newRecorder(nil)}, nil},
		{"foreign family", []FamilyProxier{newRecorder(&family.Family{Name: "IPv5"})}, nil},
		{"same family twice", []FamilyProxier{v4, newRecorder(family.IPv4)}, nil},
		{"three", []FamilyProxier{v4, v6, v4}, nil},
		{"IPv4 only", []FamilyProxier{v4}, []*family.Family{family.IPv4}},
		{"IPv6 only", []FamilyProxier{v6}, []*family.Family{family.IPv6}},
		{"dual, reported in family order", []FamilyProxier{v6, v4}, family.All},
	} {
		m, err := New(tc.proxiers...)
		switch {
		case tc.want == nil && err == nil:
			t.Errorf("%s: New succeeded, want an error", tc.name)
		case tc.want != nil && err != nil:
			t.Errorf("%s: New: %v", tc.name, err)
		case tc.want != nil && !slices.Equal(m.Families(), tc.want):
			t.Errorf("%s: Families() = %v, want %v", tc.name, m.Families(), tc.want)
		}
	}
}

func TestServiceAndNodeEventsReachEveryFamily(t *testing.T) {
	events := []struct {
		deliver func(m *MetaProxier)
		want    string
	}{
		{func(m *MetaProxier) { m.OnServiceAdd(svc("a")) }, "ServiceAdd a"},
		{func(m *MetaProxier) { m.OnServiceUpdate(svc("a"), svc("b")) }, "ServiceUpdate b"},
		{func(m *MetaProxier) { m.OnServiceDelete(svc("c")) }, "ServiceDelete c"},
		{func(m *MetaProxier) { m.OnNodeAdd(node("n1")) }, "NodeAdd n1"},
		{func(m *MetaProxier) { m.OnNodeUpdate(node("n1"), node("n2")) }, "NodeUpdate n2"},
		{func(m *MetaProxier) { m.OnNodeDelete(node("n3")) }, "NodeDelete n3"},
	}
	for _, fams := range [][]*family.Family{family.All, {family.IPv4}, {family.IPv6}} {
		m, recs := setup(t, fams...)
		for _, ev := range events {
			ev.deliver(m)
			for f, r := range recs {
				if got := r.take(); !slices.Equal(got, []string{ev.want}) {
					t.Errorf("families %v: %s got %q, want %q", fams, f, got, ev.want)
				}
			}
		}
	}
}

func TestEndpointSliceRouting(t *testing.T) {
	for _, tc := range []struct {
		name        string
		fams        []*family.Family
		addressType discovery.AddressType
		to          *family.Family // nil: dropped
	}{
		{"dual IPv4", family.All, discovery.AddressTypeIPv4, family.IPv4},
		{"dual IPv6", family.All, discovery.AddressTypeIPv6, family.IPv6},
		{"dual FQDN", family.All, discovery.AddressTypeFQDN, nil},
		{"dual unknown", family.All, "IPv5", nil},
		{"dual empty", family.All, "", nil},
		{"IPv4 node, IPv4", []*family.Family{family.IPv4}, discovery.AddressTypeIPv4, family.IPv4},
		{"IPv4 node, IPv6", []*family.Family{family.IPv4}, discovery.AddressTypeIPv6, nil},
		{"IPv6 node, IPv4", []*family.Family{family.IPv6}, discovery.AddressTypeIPv4, nil},
		{"IPv6 node, IPv6", []*family.Family{family.IPv6}, discovery.AddressTypeIPv6, family.IPv6},
	} {
		m, recs := setup(t, tc.fams...)
		old, cur := slice("s-old", tc.addressType), slice("s", tc.addressType)
		m.OnEndpointSliceAdd(cur)
		m.OnEndpointSliceUpdate(old, cur)
		m.OnEndpointSliceDelete(cur)
		m.OnEndpointSliceAdd(nil)
		for f, r := range recs {
			var want []string
			if f == tc.to {
				want = []string{"SliceAdd s", "SliceUpdate s", "SliceDelete s"}
			}
			if got := r.take(); !slices.Equal(got, want) {
				t.Errorf("%s: %s got %q, want %q", tc.name, f, got, want)
			}
		}
	}
}

func TestHandlerPanicDoesNotStarveOtherFamily(t *testing.T) {
	m, recs := setup(t, family.IPv4, family.IPv6)
	recs[family.IPv4].panics = true
	m.OnServiceAdd(svc("a"))
	m.OnNodeUpdate(node("n"), node("n"))
	m.OnEndpointSliceAdd(slice("s4", discovery.AddressTypeIPv4))
	m.OnEndpointSliceAdd(slice("s6", discovery.AddressTypeIPv6))
	m.OnServiceCIDRAdd(serviceCIDR("k", "10.96.0.0/16", "fd00::/112"))

	if got, want := recs[family.IPv6].take(), []string{"ServiceAdd a", "NodeUpdate n", "SliceAdd s6"}; !slices.Equal(got, want) {
		t.Errorf("IPv6 got %q, want %q", got, want)
	}
	if got := recs[family.IPv6].takeCIDRs(); len(got) != 1 {
		t.Errorf("IPv6 got %d CIDR notifications, want 1", len(got))
	}
	h := m.Health()
	// Four handlers, plus Health itself.
	if got := h[family.IPv4].HandlerPanics; got != 5 {
		t.Errorf("IPv4 HandlerPanics = %d, want 5", got)
	}
	if h[family.IPv4].Proxier.LastError == nil || h[family.IPv4].Healthy {
		t.Errorf("IPv4 status with a panicking Health: %+v", h[family.IPv4])
	}
	if got := h[family.IPv6].HandlerPanics; got != 0 {
		t.Errorf("IPv6 HandlerPanics = %d, want 0", got)
	}
}
