package nodeport

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// Primary is the --nodeport-addresses keyword for "the node's primary IP of each
// family". As in kube-proxy it must be the only value.
const Primary = "primary"

// Spec is the --nodeport-addresses setting as it applies to one family.
type Spec struct {
	Family *family.Family
	// Primary is set by the "primary" keyword; CIDRs is then empty.
	Primary bool
	// CIDRs are the family's prefixes, masked, sorted and deduplicated. Empty without
	// Primary means every local address of the family: as in kube-proxy, a family
	// without CIDRs of its own is not restricted by the other family's, and a
	// zero-length prefix (0.0.0.0/0, ::/0) makes the others irrelevant.
	CIDRs []netip.Prefix
}

// MatchAll reports whether s accepts NodePorts on every local address of s.Family
// (before Resolve considers a primary IP).
func (s Spec) MatchAll() bool { return !s.Primary && len(s.CIDRs) == 0 }

// String prints "primary", "all" or the CIDRs, for logs.
func (s Spec) String() string {
	switch {
	case s.Primary:
		return Primary
	case s.MatchAll():
		return "all"
	}
	strs := make([]string, len(s.CIDRs))
	for i, p := range s.CIDRs {
		strs[i] = p.String()
	}
	return strings.Join(strs, ",")
}

// ParseAddresses parses the values of --nodeport-addresses (CIDRs of either family,
// or the single keyword "primary") into one Spec for each family in family.All. It
// fails, naming the value, on anything else: an empty value, a bare address, an
// IPv4-mapped IPv6 prefix, a zone, "primary" together with other values. IPv4
// prefixes with leading zeros ("010.0.0.0/8") are rejected as ambiguous, where
// kube-proxy reads them as decimal.
func ParseAddresses(values []string) (map[*family.Family]Spec, error) {
	specs := make(map[*family.Family]Spec, len(family.All))
	for _, f := range family.All {
		specs[f] = Spec{Family: f}
	}
	if slices.Contains(values, Primary) {
		if len(values) != 1 {
			return nil, fmt.Errorf("--nodeport-addresses: %q can't be combined with other values %q", Primary, values)
		}
		for _, f := range family.All {
			specs[f] = Spec{Family: f, Primary: true}
		}
		return specs, nil
	}
	matchAll := map[*family.Family]bool{}
	for _, v := range values {
		p, err := parseCIDR(v)
		if err != nil {
			return nil, err
		}
		f := family.Of(p.Addr())
		s := specs[f]
		if p.Bits() == 0 {
			matchAll[f] = true
		}
		s.CIDRs = append(s.CIDRs, p.Masked())
		specs[f] = s
	}
	for _, f := range family.All {
		s := specs[f]
		if matchAll[f] {
			s.CIDRs = nil
		}
		slices.SortFunc(s.CIDRs, comparePrefix)
		s.CIDRs = slices.Compact(s.CIDRs)
		specs[f] = s
	}
	return specs, nil
}

func parseCIDR(v string) (netip.Prefix, error) {
	s := strings.TrimSpace(v)
	if s == "" {
		return netip.Prefix{}, fmt.Errorf("--nodeport-addresses: empty value is not a CIDR")
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("--nodeport-addresses: %q is not a valid CIDR: %w", v, err)
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("--nodeport-addresses: %q is an IPv4-mapped IPv6 CIDR; write it as IPv4", v)
	}
	return p, nil
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// AddrLister lists the addresses assigned to the node's interfaces. Addresses may be
// of either family; Resolve unmaps them and drops zones.
type AddrLister interface {
	InterfaceAddrs() ([]netip.Addr, error)
}

// AddrListerFunc adapts a function to AddrLister.
type AddrListerFunc func() ([]netip.Addr, error)

// InterfaceAddrs calls fn.
func (fn AddrListerFunc) InterfaceAddrs() ([]netip.Addr, error) { return fn() }

// SystemAddrs lists the host's interface addresses (of interfaces up or down, as
// kube-proxy does). It uses net.InterfaceAddrs, which on Linux is one netlink dump,
// rather than one dump per net.Interfaces entry: nodes have an interface per pod.
type SystemAddrs struct{}

// InterfaceAddrs implements AddrLister.
func (SystemAddrs) InterfaceAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		var ip net.IP
		switch v := a.(type) {
		case *net.IPNet:
			ip = v.IP
		case *net.IPAddr:
			ip = v.IP
		}
		if ip, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// Addresses are the local addresses of one family that accept NodePort traffic.
type Addresses struct {
	Family *family.Family
	// MatchAll means every local address of Family except loopback: the backend should
	// match "destination is local and not in Family.Loopback" (kube-proxy nftables:
	// "fib daddr type local" plus its noLocalhost check) rather than list Addrs,
	// which then only tells what is local now, link-local addresses aside.
	MatchAll bool
	// Addrs are sorted, unique, never loopback.
	Addrs []netip.Addr
	// Loopback are loopback addresses that an explicit CIDR matched. They are not
	// NodePort addresses: kube-proxy's nftables mode skips them with the error
	// "--nodeport-addresses includes localhost but localhost NodePorts are not
	// supported", and its iptables mode does the same for IPv6 (IPv4 localhost
	// NodePorts there need route_localnet). They are returned so the backend can say so.
	Loopback []netip.Addr
}

// Resolve returns the local addresses of s.Family that accept NodePort traffic.
// primary is the node's primary IP of s.Family and is used only with s.Primary. As in
// kube-proxy, "primary" becomes primary/32 (or /128) intersected with the local
// addresses, and when primary is not a usable address of the family (invalid, of the
// other family, unspecified or loopback, which is kube-proxy's "no node IP" value) the
// family falls back to MatchAll.
//
// A lister error is returned wrapped, naming the family, with zero Addresses.
func (s Spec) Resolve(l AddrLister, primary netip.Addr) (Addresses, error) {
	f := s.Family
	if f == nil || l == nil {
		return Addresses{}, errors.New("nodeport: Resolve needs a family and an AddrLister")
	}
	cidrs := s.CIDRs
	if s.Primary {
		cidrs = nil
		if p := primary.Unmap().WithZone(""); f.Contains(p) && !p.IsUnspecified() && !f.Loopback.Contains(p) {
			cidrs = []netip.Prefix{netip.PrefixFrom(p, f.BitLen)}
		}
	}
	local, err := l.InterfaceAddrs()
	if err != nil {
		return Addresses{}, fmt.Errorf("listing local %s addresses for NodePorts: %w", f, err)
	}
	out := Addresses{Family: f, MatchAll: len(cidrs) == 0}
	for _, a := range local {
		a = a.Unmap().WithZone("")
		if !f.Contains(a) || !(out.MatchAll || slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Contains(a) })) {
			continue
		}
		switch {
		case out.MatchAll && a.IsLinkLocalUnicast():
			// Every interface has its own (each pod's host-side veth): listed,
			// they would make every pod's arrival a node change, and no
			// backend serves NodePorts on them by address (the rules of
			// "every local address" match them by type).
		case !f.Loopback.Contains(a):
			out.Addrs = append(out.Addrs, a)
		case !out.MatchAll:
			out.Loopback = append(out.Loopback, a)
		}
	}
	slices.SortFunc(out.Addrs, netip.Addr.Compare)
	out.Addrs = slices.Compact(out.Addrs)
	slices.SortFunc(out.Loopback, netip.Addr.Compare)
	out.Loopback = slices.Compact(out.Loopback)
	return out, nil
}
