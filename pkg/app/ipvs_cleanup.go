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
const kubeProxyIPVSLink = "kube-ipvs0"

// cleanupKubeProxyIPVS removes what kube-proxy's IPVS mode leaves, as its own
// --cleanup does: every IPVS virtual server of both families but those in
// exclude (--ipvs-exclude-cidrs; none with keepServices), the kube-ipvs0 link,
// and the KUBE- ipsets. It runs after the KUBE- chains are gone (a set a rule
// uses cannot be destroyed), and loads neither IPVS nor ipset where they are not
// loaded: then nothing of them can be left.
func cleanupKubeProxyIPVS(_ context.Context, exclude []netip.Prefix, keepServices bool) error {
	var errs []error
	for _, f := range family.All {
		k, err := ipvs.Open(f, "", false)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f, err))
			continue
		}
		var svcs []ipvs.Service
		if !keepServices {
			svcs, err = k.Services()
			errs = append(errs, err)
		}
		n := 0
		for _, s := range svcs {
			if slices.ContainsFunc(exclude, func(p netip.Prefix) bool { return p.Contains(s.Addr) }) {
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
				if strings.HasPrefix(s, kubeProxyChainPrefix) {
					errs = append(errs, k.DestroySet(s))
				}
			}
		}
		k.Close()
	}
	if l, err := netlink.LinkByName(kubeProxyIPVSLink); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %w", kubeProxyIPVSLink, err))
		} else {
			klog.InfoS("Removed kube-proxy's IPVS link", "link", kubeProxyIPVSLink)
		}
	}
	return errors.Join(errs...)
}
