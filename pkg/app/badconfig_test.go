package app

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/dsproxy/dsproxy/pkg/config"
	"github.com/dsproxy/dsproxy/pkg/family"
)

// kube-proxy v1.36's checkBadConfig / checkBadIPConfig warnings, case by case
// as its server_test.go has them.
func TestBadConfig(t *testing.T) {
	v4, v6 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")
	both := map[*family.Family]netip.Addr{family.IPv4: v4, family.IPv6: v6}
	noV6 := map[*family.Family]netip.Addr{family.IPv4: v4, family.IPv6: netip.IPv6Loopback()}
	for _, tc := range []struct {
		name      string
		cfg       func(c *config.Config)
		primary   *family.Family
		ips       map[*family.Family]netip.Addr
		podCIDRs  []string
		dualStack bool
		want      []string
	}{
		{name: "primary, dual-stack node", cfg: func(c *config.Config) { c.NodePortAddresses = []string{"primary"} },
			primary: family.IPv4, ips: both, dualStack: true},
		{name: "nodePortAddresses unset", cfg: func(c *config.Config) { c.NodePortAddresses = nil },
			primary: family.IPv4, ips: both, dualStack: true,
			want: []string{"nodePortAddresses is unset; NodePort connections will be accepted on all local IPs. Consider using `--nodeport-addresses primary`"}},
		{name: "dual-stack cluster, IPv4 nodePortAddresses", cfg: func(c *config.Config) {
			c.NodePortAddresses = []string{"10.0.0.0/8"}
			c.ClusterCIDRs = []string{"10.64.0.0/16", "fd00:64::/56"}
		}, primary: family.IPv4, ips: both, dualStack: true,
			want: []string{"cluster appears to be dual-stack but nodePortAddresses contains only IPv4 addresses; NodePort connections will be accepted on all local IPv6 IPs"}},
		{name: "primary with no IPv6 node IP, dual-stack pod CIDRs", cfg: func(c *config.Config) { c.NodePortAddresses = []string{"primary"} },
			primary: family.IPv4, ips: noV6, podCIDRs: []string{"10.64.1.0/24", "fd00:64:0:1::/64"}, dualStack: true,
			want: []string{"cluster appears to be dual-stack but nodePortAddresses contains only IPv4 addresses; NodePort connections will be accepted on all local IPv6 IPs"}},
		{name: "IPv6-primary, IPv4 nodePortAddresses", cfg: func(c *config.Config) { c.NodePortAddresses = []string{"10.0.0.0/8"} },
			primary: family.IPv6, ips: both, dualStack: true,
			want: []string{"cluster appears to be IPv6-primary but nodePortAddresses contains only IPv4 addresses; NodePort connections will be accepted on all local IPv6 IPs"}},
		{name: "single-stack IPv4 with IPv6 CIDRs and bind addresses", cfg: func(c *config.Config) {
			c.NodePortAddresses = []string{"primary"}
			c.ClusterCIDRs = []string{"fd00:64::/56"}
			c.IPVS.ExcludeCIDRs = []string{"fd00:1::/64"}
			c.HealthzBindAddress = "[2001:db8::1]:10256"
			c.MetricsBindAddress = "[::]:10249"
		}, primary: family.IPv4, ips: map[*family.Family]netip.Addr{family.IPv4: v4}, podCIDRs: []string{"fd00:64:0:1::/64"},
			want: []string{
				"cluster is IPv4-only but clusterCIDRs contains only IPv6 addresses",
				"cluster is IPv4-only but node.spec.podCIDRs contains only IPv6 addresses",
				"cluster is IPv4-only but ipvs.excludeCIDRs contains only IPv6 addresses",
				"cluster is IPv4-only but healthzBindAddress is IPv6",
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := config.Default()
			tc.cfg(c)
			got := badConfig(c, tc.primary, tc.ips, tc.podCIDRs, tc.dualStack)
			if !slices.Equal(got, tc.want) {
				t.Errorf("badConfig:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}
