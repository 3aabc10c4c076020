package app

import (
	"fmt"
	"net/netip"

	"github.com/dsproxy/dsproxy/pkg/config"
	"github.com/dsproxy/dsproxy/pkg/family"
)

// badConfig returns kube-proxy v1.36's warnings about a configuration that may be
// incomplete or incorrect for the node (its checkBadConfig and the non-fatal
// checks of checkBadIPConfig), in its words, for the daemon to log: NodePort
// addresses that leave a family open on every local address, and CIDRs or bind
// addresses only of the family the node does not have first. primary is the
// primary node IP's family (IPv4 without one); nodeIPs are the node IPs per
// family (loopback where the node has none); dualStack says both families run.
func badConfig(cfg *config.Config, primary *family.Family, nodeIPs map[*family.Family]netip.Addr, podCIDRs []string, dualStack bool) []string {
	var out []string
	npa := cfg.NodePortAddresses
	if len(npa) == 1 && npa[0] == "primary" {
		// kube-proxy checks what "primary" became: the node IPs but loopback.
		npa = nil
		for _, f := range family.All {
			if ip, ok := nodeIPs[f]; ok && !f.Loopback.Contains(ip) {
				npa = append(npa, netip.PrefixFrom(ip, f.BitLen).String())
			}
		}
	}
	anyDualStack := false
	for _, cidrs := range [][]string{cfg.ClusterCIDRs, npa, cfg.IPVS.ExcludeCIDRs, podCIDRs} {
		if len(familyCIDRs(family.IPv4, cidrs)) > 0 && len(familyCIDRs(family.IPv6, cidrs)) > 0 {
			anyDualStack = true
		}
	}
	other := primary.Other()
	switch primaryNPA := len(familyCIDRs(primary, npa)); {
	case len(npa) == 0:
		out = append(out, "nodePortAddresses is unset; NodePort connections will be accepted on all local IPs. Consider using `--nodeport-addresses primary`")
	case anyDualStack && primaryNPA == len(npa):
		out = append(out, fmt.Sprintf("cluster appears to be dual-stack but nodePortAddresses contains only %s addresses; NodePort connections will be accepted on all local %s IPs", primary.Name, other.Name))
	case primaryNPA == 0:
		out = append(out, fmt.Sprintf("cluster appears to be %s-primary but nodePortAddresses contains only %s addresses; NodePort connections will be accepted on all local %s IPs", primary.Name, other.Name, primary.Name))
	}

	clusterType := primary.Name + "-only"
	if dualStack {
		clusterType = primary.Name + "-primary"
	}
	onlyOther := func(cidrs []string) bool { return len(cidrs) > 0 && len(familyCIDRs(other, cidrs)) == len(cidrs) }
	if onlyOther(cfg.ClusterCIDRs) {
		out = append(out, fmt.Sprintf("cluster is %s but clusterCIDRs contains only %s addresses", clusterType, other.Name))
	}
	if onlyOther(podCIDRs) {
		out = append(out, fmt.Sprintf("cluster is %s but node.spec.podCIDRs contains only %s addresses", clusterType, other.Name))
	}
	if !dualStack {
		if onlyOther(cfg.IPVS.ExcludeCIDRs) {
			out = append(out, fmt.Sprintf("cluster is %s but ipvs.excludeCIDRs contains only %s addresses", clusterType, other.Name))
		}
		for _, b := range []struct{ field, addr string }{{"healthzBindAddress", cfg.HealthzBindAddress}, {"metricsBindAddress", cfg.MetricsBindAddress}} {
			if ap, err := netip.ParseAddrPort(b.addr); err == nil && !ap.Addr().IsUnspecified() && family.Of(ap.Addr()) == other {
				out = append(out, fmt.Sprintf("cluster is %s but %s is %s", clusterType, b.field, other.Name))
			}
		}
	}
	return out
}
