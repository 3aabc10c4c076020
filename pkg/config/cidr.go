package config

import (
	"fmt"
	"net/netip"
	"strings"

	netutils "k8s.io/utils/net"
)

// ParseCIDR parses a CIDR of the configuration (--cluster-cidr,
// --ipvs-exclude-cidrs) as kube-proxy does, with k8s.io/utils/net's sloppy parser:
// IPv4 octets with leading zeros are decimal ("010.244.0.0/16" is 10.244.0.0/16)
// and host bits are masked. An IPv4-mapped IPv6 CIDR ("::ffff:10.0.0.0/104") is
// refused: it would count as IPv6 while meaning IPv4 addresses.
func ParseCIDR(s string) (netip.Prefix, error) {
	_, n, err := netutils.ParseCIDRSloppy(strings.TrimSpace(s))
	if err != nil {
		return netip.Prefix{}, err
	}
	ones, _ := n.Mask.Size()
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, fmt.Errorf("invalid CIDR address: %s", s)
	}
	if len(n.IP) == 16 && a.Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%q is an IPv4-mapped IPv6 CIDR; write it as IPv4", s)
	}
	return netip.PrefixFrom(a.Unmap(), ones).Masked(), nil
}
