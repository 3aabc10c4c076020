package metaproxier

import (
	"net/netip"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dsproxy/dsproxy/pkg/family"
)

func serviceCIDR(name string, cidrs ...string) *networkingv1.ServiceCIDR {
	return &networkingv1.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       networkingv1.ServiceCIDRSpec{CIDRs: cidrs},
	}
}

func TestServiceCIDRsSplitByFamilyAndNotifiedOnChange(t *testing.T) {
	type step struct {
		name   string
		event  func(m *MetaProxier)
		v4, v6 []netip.Prefix // the list notified; nil: no notification
	}
	add := func(sc *networkingv1.ServiceCIDR) func(*MetaProxier) {
		return func(m *MetaProxier) { m.OnServiceCIDRAdd(sc) }
	}
	update := func(sc *networkingv1.ServiceCIDR) func(*MetaProxier) {
		return func(m *MetaProxier) { m.OnServiceCIDRUpdate(sc, sc) }
	}
	del := func(name string) func(*MetaProxier) {
		return func(m *MetaProxier) { m.OnServiceCIDRDelete(serviceCIDR(name)) }
	}
	steps := []step{
		{"default dual-stack CIDRs", add(serviceCIDR("kubernetes", "10.96.0.0/16", "fd00:96::/112")),
			prefixes("10.96.0.0/16"), prefixes("fd00:96::/112")},
		{"IPv4 only, sorted, invalid skipped, host bits masked",
			add(serviceCIDR("extra", "10.200.0.1/24", "not-a-cidr", "10.100.0.0/24", "10.0.0.0/33")),
			prefixes("10.96.0.0/16", "10.100.0.0/24", "10.200.0.0/24"), nil},
		{"resync update changes nothing", update(serviceCIDR("extra", "10.200.0.0/24", "10.100.0.0/24")), nil, nil},
		{"duplicate CIDR in another object", add(serviceCIDR("dup", "10.96.0.0/16")), nil, nil},
		{"delete keeps CIDRs still listed elsewhere", del("kubernetes"), nil, prefixes()},
		{"IPv4-mapped IPv6 is invalid", add(serviceCIDR("mapped", "::ffff:10.0.0.0/104")), nil, nil},
		{"delete of an unknown object", del("never-seen"), nil, nil},
		{"IPv6 again", add(serviceCIDR("v6", "fd00:1::/112", "fd00::/112")), nil, prefixes("fd00::/112", "fd00:1::/112")},
		{"delete IPv4 object", del("extra"), prefixes("10.96.0.0/16"), nil},
		{"nil objects are ignored", func(m *MetaProxier) { m.OnServiceCIDRAdd(nil); m.OnServiceCIDRDelete(nil) }, nil, nil},
	}
	for _, fams := range [][]*family.Family{family.All, {family.IPv4}, {family.IPv6}} {
		m, recs := setup(t, fams...)
		for _, st := range steps {
			st.event(m)
			for f, want := range map[*family.Family][]netip.Prefix{family.IPv4: st.v4, family.IPv6: st.v6} {
				r := recs[f]
				if r == nil {
					continue
				}
				var wantCalls [][]netip.Prefix
				if want != nil {
					wantCalls = [][]netip.Prefix{want}
				}
				if got := r.takeCIDRs(); !equalCIDRLists(got, wantCalls) {
					t.Errorf("families %v, %s: %s notified %v, want %v", fams, st.name, f, got, wantCalls)
				}
			}
		}
	}
}

func TestServiceCIDRListIsTheProxiersToKeep(t *testing.T) {
	m, recs := setup(t, family.IPv4)
	m.OnServiceCIDRAdd(serviceCIDR("a", "10.96.0.0/16"))
	got := recs[family.IPv4].takeCIDRs()[0]
	got[0] = netip.MustParsePrefix("192.0.2.0/24") // the proxier scribbles on its copy
	m.OnServiceCIDRAdd(serviceCIDR("a", "10.96.0.0/16"))
	if n := len(recs[family.IPv4].takeCIDRs()); n != 0 {
		t.Errorf("%d notifications after an unchanged update, want 0", n)
	}
}
