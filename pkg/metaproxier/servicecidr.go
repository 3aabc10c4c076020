package metaproxier

import (
	"cmp"
	"errors"
	"net/netip"
	"slices"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// OnServiceCIDRAdd records the CIDRs of a ServiceCIDR. Each family whose list of
// service CIDRs changes as a result gets OnServiceCIDRsChanged; invalid CIDR strings
// are skipped and logged.
func (m *MetaProxier) OnServiceCIDRAdd(sc *networkingv1.ServiceCIDR) {
	if sc != nil {
		m.setServiceCIDR(sc.Name, sc.Spec.CIDRs)
	}
}

// OnServiceCIDRUpdate replaces the CIDRs recorded for a ServiceCIDR, like
// OnServiceCIDRAdd.
func (m *MetaProxier) OnServiceCIDRUpdate(_, cur *networkingv1.ServiceCIDR) {
	m.OnServiceCIDRAdd(cur)
}

// OnServiceCIDRDelete forgets a ServiceCIDR's CIDRs; a CIDR still listed by another
// ServiceCIDR stays.
func (m *MetaProxier) OnServiceCIDRDelete(sc *networkingv1.ServiceCIDR) {
	if sc != nil {
		m.setServiceCIDR(sc.Name, nil)
	}
}

// setServiceCIDR records (or, for nil cidrs, forgets) the CIDRs of the named
// ServiceCIDR and notifies the families whose list changed. Notifications are made
// under cidrMu so that each family sees its lists in event order.
func (m *MetaProxier) setServiceCIDR(name string, cidrs []string) {
	m.cidrMu.Lock()
	defer m.cidrMu.Unlock()
	if cidrs == nil {
		delete(m.cidrs, name)
	} else {
		m.cidrs[name] = parseCIDRs(name, cidrs)
	}
	for _, mb := range m.members {
		want := m.familyCIDRsLocked(mb.fam)
		if slices.Equal(want, mb.cidrs) {
			continue
		}
		mb.cidrs = want
		klog.V(2).InfoS("Service CIDRs changed", "ipFamily", mb.fam.Name, "cidrs", want)
		mb.call("OnServiceCIDRsChanged", func(fp FamilyProxier) { fp.OnServiceCIDRsChanged(slices.Clone(want)) })
	}
}

// familyCIDRsLocked returns f's CIDRs across all ServiceCIDRs, sorted and unique.
func (m *MetaProxier) familyCIDRsLocked(f *family.Family) []netip.Prefix {
	var out []netip.Prefix
	for _, ps := range m.cidrs {
		for _, p := range ps {
			if f.ContainsPrefix(p) {
				out = append(out, p)
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	return slices.Compact(out)
}

// parseCIDRs parses a ServiceCIDR's CIDR strings, skipping (and logging) invalid ones.
// Host bits are masked off; the API server rejects such CIDRs, but a proxy must not
// trust that.
func parseCIDRs(name string, cidrs []string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(cidrs))
	for _, s := range cidrs {
		p, err := netip.ParsePrefix(s)
		if err == nil && p.Addr().Is4In6() {
			err = errors.New("IPv4-mapped IPv6 prefix")
		}
		if err != nil {
			klog.InfoS("Skipping invalid CIDR in ServiceCIDR", "serviceCIDR", name, "cidr", s, "reason", err)
			continue
		}
		out = append(out, p.Masked())
	}
	return out
}
