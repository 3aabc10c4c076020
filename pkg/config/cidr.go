package config

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// ParseCIDR parses a CIDR of the configuration (--cluster-cidr,
// --ipvs-exclude-cidrs) as kube-proxy does, with k8s.io/utils/net's sloppy parser
// (family.ParseCIDR): IPv4 octets with leading zeros are decimal ("010.244.0.0/16"
// is 10.244.0.0/16) and host bits are masked. Unlike in API objects, an
// IPv4-mapped IPv6 CIDR ("::ffff:10.0.0.0/104") is refused with a clear error: an
// operator can write it as IPv4.
func ParseCIDR(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%q is an IPv4-mapped IPv6 CIDR; write it as IPv4", s)
	}
	p, ok := family.ParseCIDR(s)
	if !ok {
		return netip.Prefix{}, fmt.Errorf("%q is not a valid CIDR", s)
	}
	return p, nil
}
