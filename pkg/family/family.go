// Package family describes an IP address family once, so that the rest of dsproxy
// can run one family-generic code path. Code outside this package and the
// pkg/proxier/ipv4 and pkg/proxier/ipv6 constructors should not switch on the family;
// it should read the difference from a *Family.
package family

import (
	"net/netip"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	netutils "k8s.io/utils/net"
)

// Family is the descriptor of one IP family. The two values, IPv4 and IPv6, are
// created once and compared by pointer.
type Family struct {
	// Name is "IPv4" or "IPv6", as in logs and the ip_family metric label.
	Name string
	// IPFamily is the Kubernetes spelling used in Service.spec.ipFamilies.
	IPFamily v1.IPFamily
	// AddressType is the EndpointSlice addressType this family consumes.
	AddressType discovery.AddressType
	// BitLen is 32 or 128.
	BitLen int
	// Loopback is 127.0.0.0/8 or ::1/128.
	Loopback netip.Prefix
	// Any is 0.0.0.0 or ::.
	Any netip.Addr
	// AnyPrefix is 0.0.0.0/0 or ::/0.
	AnyPrefix netip.Prefix
	// LinkLocal is 169.254.0.0/16 or fe80::/10.
	LinkLocal netip.Prefix
	// NFProto is the netfilter protocol family (NFPROTO_IPV4 = 2, NFPROTO_IPV6 = 10),
	// which is also the nftables table family "ip" / "ip6".
	NFProto uint8
	// NFTFamilyName is "ip" or "ip6".
	NFTFamilyName string
	// L4ProtoOffsetHeader names the network header protocol field: IPv4 "protocol",
	// IPv6 "nexthdr" (nftables meta l4proto is used by the backends for both).
	// ICMPRejectType and ICMPRejectCode make an ICMP "port unreachable" for the family:
	// ICMP type 3 code 3, ICMPv6 type 1 code 4.
	ICMPRejectType uint8
	ICMPRejectCode uint8
	// IPTablesCommand is "iptables" or "ip6tables".
	IPTablesCommand string
	// RouteLocalnetSysctl is the sysctl that lets packets to loopback addresses
	// be routed, which NodePorts on localhost need (kube-proxy's iptables mode
	// serves them for IPv4 only); "" for IPv6, which has none.
	RouteLocalnetSysctl string
	// SaddrOffset and DaddrOffset are the byte offsets of the source and destination
	// addresses in the network header; AddrLen is their length in bytes.
	SaddrOffset uint32
	DaddrOffset uint32
	AddrLen     uint32
}

// IPv4 and IPv6 are the two families.
var (
	IPv4 = &Family{
		Name:                "IPv4",
		IPFamily:            v1.IPv4Protocol,
		AddressType:         discovery.AddressTypeIPv4,
		BitLen:              32,
		Loopback:            netip.MustParsePrefix("127.0.0.0/8"),
		Any:                 netip.IPv4Unspecified(),
		AnyPrefix:           netip.MustParsePrefix("0.0.0.0/0"),
		LinkLocal:           netip.MustParsePrefix("169.254.0.0/16"),
		NFProto:             2,
		NFTFamilyName:       "ip",
		ICMPRejectType:      3,
		ICMPRejectCode:      3,
		IPTablesCommand:     "iptables",
		RouteLocalnetSysctl: "/proc/sys/net/ipv4/conf/all/route_localnet",
		SaddrOffset:         12,
		DaddrOffset:         16,
		AddrLen:             4,
	}
	IPv6 = &Family{
		Name:            "IPv6",
		IPFamily:        v1.IPv6Protocol,
		AddressType:     discovery.AddressTypeIPv6,
		BitLen:          128,
		Loopback:        netip.MustParsePrefix("::1/128"),
		Any:             netip.IPv6Unspecified(),
		AnyPrefix:       netip.MustParsePrefix("::/0"),
		LinkLocal:       netip.MustParsePrefix("fe80::/10"),
		NFProto:         10,
		NFTFamilyName:   "ip6",
		ICMPRejectType:  1,
		ICMPRejectCode:  4,
		IPTablesCommand: "ip6tables",
		SaddrOffset:     8,
		DaddrOffset:     24,
		AddrLen:         16,
	}
)

// All lists the families in the order dsproxy reports them.
var All = []*Family{IPv4, IPv6}

// String returns the family's name.
func (f *Family) String() string { return f.Name }

// Contains reports whether a (after unmapping an IPv4-mapped IPv6 address) belongs to
// this family. The zero Addr belongs to no family.
func (f *Family) Contains(a netip.Addr) bool {
	return a.IsValid() && a.Unmap().BitLen() == f.BitLen
}

// ContainsPrefix reports whether p is a valid prefix of this family.
func (f *Family) ContainsPrefix(p netip.Prefix) bool {
	return p.IsValid() && p.Addr().BitLen() == f.BitLen
}

// Other returns the other family.
func (f *Family) Other() *Family {
	if f == IPv4 {
		return IPv6
	}
	return IPv4
}

// Of returns the family of a, or nil for the zero Addr. IPv4-mapped IPv6 addresses
// are IPv4: Kubernetes never hands them to a proxy on purpose, and treating them as
// IPv6 would program an IPv4 backend in the ip6 table.
func Of(a netip.Addr) *Family {
	if !a.IsValid() {
		return nil
	}
	if a.Unmap().Is4() {
		return IPv4
	}
	return IPv6
}

// ForIPFamily returns the family for a Kubernetes IPFamily, or nil.
func ForIPFamily(f v1.IPFamily) *Family {
	switch f {
	case v1.IPv4Protocol:
		return IPv4
	case v1.IPv6Protocol:
		return IPv6
	}
	return nil
}

// ForAddressType returns the family for an EndpointSlice addressType, or nil for FQDN
// and unknown types.
func ForAddressType(t discovery.AddressType) *Family {
	switch t {
	case discovery.AddressTypeIPv4:
		return IPv4
	case discovery.AddressTypeIPv6:
		return IPv6
	}
	return nil
}

// ParseAddr parses s as an address of this family, the way ParseIP reads it.
func (f *Family) ParseAddr(s string) (netip.Addr, bool) {
	a, ok := ParseIP(s)
	if !ok || a.BitLen() != f.BitLen {
		return netip.Addr{}, false
	}
	return a, true
}

// ParseIP parses an address of an API object as kube-proxy reads it
// (k8s.io/utils/net's sloppy parser): IPv4 octets with leading zeros are decimal
// ("010.001.002.003" is 10.1.2.3), and an IPv4-mapped IPv6 address is the IPv4
// address. The API server accepted those forms until v1.36's
// StrictIPCIDRValidation, so stored objects may hold them. A zone is refused.
func ParseIP(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return netip.Addr{}, false
		}
		return a.Unmap(), true
	}
	ip := netutils.ParseIPSloppy(s)
	if ip == nil {
		return netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(ip)
	return a.Unmap(), ok
}

// ParseCIDR parses a CIDR of an API object (loadBalancerSourceRanges) as kube-proxy
// reads it, like ParseIP: leading zeros are decimal, and an IPv4-mapped IPv6 CIDR
// of at least 96 bits is the IPv4 CIDR. The result is masked.
func ParseCIDR(s string) (netip.Prefix, bool) {
	if p, err := netip.ParsePrefix(s); err == nil && !p.Addr().Is4In6() {
		if p.Addr().Zone() != "" {
			return netip.Prefix{}, false
		}
		return p.Masked(), true
	}
	ip, n, err := netutils.ParseCIDRSloppy(s)
	if err != nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	ones, bits := n.Mask.Size()
	if !ok || ip == nil {
		return netip.Prefix{}, false
	}
	if bits == 128 && a.Is4In6() {
		if ones < 96 {
			return netip.Prefix{}, false
		}
		ones -= 96
	}
	return netip.PrefixFrom(a.Unmap(), ones).Masked(), true
}
