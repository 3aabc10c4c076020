package app

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/ipvs"
)

// kubeProxyIPVSLink is the dummy link kube-proxy's IPVS mode binds Service
// addresses to.
const kubeProxyIPVSLink = ipvs.KubeProxyLinkName

// kubeProxyIPSets are the ipsets kube-proxy v1.36's IPVS mode creates for
// IPv4; its IPv6 sets are named with KUBE-6- (kubeProxyIPSet).
var kubeProxyIPSets = []string{
	"KUBE-LOOP-BACK", "KUBE-CLUSTER-IP", "KUBE-EXTERNAL-IP", "KUBE-EXTERNAL-IP-LOCAL",
	"KUBE-LOAD-BALANCER", "KUBE-LOAD-BALANCER-LOCAL", "KUBE-LOAD-BALANCER-FW",
	"KUBE-LOAD-BALANCER-SOURCE-IP", "KUBE-LOAD-BALANCER-SOURCE-CIDR",
	"KUBE-NODE-PORT-TCP", "KUBE-NODE-PORT-LOCAL-TCP", "KUBE-NODE-PORT-UDP", "KUBE-NODE-PORT-LOCAL-UDP",
	"KUBE-NODE-PORT-SCTP-HASH", "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
	"KUBE-HEALTH-CHECK-NODE-PORT", "KUBE-IPVS-IPS",
}

// kubeProxyIPSet reports whether the ipset name is kube-proxy's: one of
// kubeProxyIPSets or its IPv6 twin, KUBE- replaced by KUBE-6- and cut to 31
// characters as kube-proxy cuts it. kube-proxy's own cleanup destroys only the
// IPv4 sets; other programs' KUBE- sets (kube-router's KUBE-SRC-*, KUBE-DST-*)
// are not kube-proxy's.
func kubeProxyIPSet(name string) bool {
	for _, s := range kubeProxyIPSets {
		v6 := "KUBE-6-" + strings.TrimPrefix(s, "KUBE-")
		if name == s || name == v6[:min(len(v6), 31)] {
			return true
		}
	}
	return false
}

// ipvsScope says which IPVS virtual servers --cleanup-kube-proxy removes.
type ipvsScope struct {
	// none: dsproxy's IPVS mode owns every virtual server of the family,
	// those kube-proxy left included.
	none bool
	// kubeProxyOnly: for a dsproxy that keeps running, only what kube-proxy's
	// IPVS mode made: virtual servers on kube-ipvs0's addresses (ClusterIPs,
	// ExternalIPs, load-balancer IPs) and, on other addresses, at a port that is
	// a Service's NodePort (nodePorts, by protocol number and port). Other IPVS
	// users' virtual servers stay. Otherwise every virtual server outside
	// exclude goes, as with kube-proxy's own --cleanup.
	kubeProxyOnly bool
	nodePorts     map[ipvs.Key]bool // Addr unset
	exclude       []netip.Prefix
}

// selects reports whether s goes; linkAddrs are kube-ipvs0's addresses.
func (sc ipvsScope) selects(s ipvs.Key, linkAddrs []netip.Addr) bool {
	switch {
	case sc.none:
		return false
	case slices.ContainsFunc(sc.exclude, func(p netip.Prefix) bool { return p.Contains(s.Addr) }):
		return false
	case sc.kubeProxyOnly:
		return slices.Contains(linkAddrs, s.Addr) || sc.nodePorts[ipvs.Key{Proto: s.Proto, Port: s.Port}]
	}
	return true
}

// cleanupKubeProxyIPVS removes what kube-proxy's IPVS mode leaves: the virtual
// servers scope selects, the kube-ipvs0 link, and its ipsets. It runs after
// its iptables chains are gone (a set a rule uses cannot be destroyed), and
// loads neither IPVS nor ipset where they are not loaded: then nothing of them
// can be left.
func cleanupKubeProxyIPVS(_ context.Context, scope ipvsScope) error {
	var errs []error
	var linkAddrs []netip.Addr
	link, linkErr := netlink.LinkByName(kubeProxyIPVSLink)
	if linkErr == nil {
		addrs, err := ipvs.RetryDump(func() ([]netlink.Addr, error) { return netlink.AddrList(link, netlink.FAMILY_ALL) })
		errs = append(errs, err)
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				linkAddrs = append(linkAddrs, ip.Unmap())
			}
		}
	}
	for _, f := range family.All {
		k, err := ipvs.Open(f, "", false)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f, err))
			continue
		}
		var svcs []ipvs.Service
		if !scope.none {
			svcs, err = k.Services()
			errs = append(errs, err)
		}
		n := 0
		for _, s := range svcs {
			if !scope.selects(s.Key, linkAddrs) {
				continue
			}
			errs = append(errs, k.DelService(s.Key))
			n++
		}
		if n > 0 {
			klog.InfoS("Removed IPVS virtual servers", "ipFamily", f.Name, "count", n)
		}
		if f == family.IPv4 && ipvs.IPSetLoaded() {
			sets, err := k.Sets()
			errs = append(errs, err)
			for _, s := range sets {
				if kubeProxyIPSet(s) {
					errs = append(errs, k.DestroySet(s))
				}
			}
		}
		k.Close()
	}
	if linkErr == nil {
		if err := netlink.LinkDel(link); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %w", kubeProxyIPVSLink, err))
		} else {
			klog.InfoS("Removed kube-proxy's IPVS link", "link", kubeProxyIPVSLink)
		}
	}
	return errors.Join(errs...)
}
