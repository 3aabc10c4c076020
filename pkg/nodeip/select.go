package nodeip

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// Errors returned (wrapped) by Select and NodeIPs, and by IPs.Usable.
var (
	// ErrNodeIPNotFound: a specific --node-ip address is not among the addresses.
	ErrNodeIPNotFound = errors.New("the requested node IP is not available")
	// ErrNoFamilyAddress: an IPv4 / IPv6 keyword found no address of its family.
	ErrNoFamilyAddress = errors.New("no address of the requested family is available")
	// ErrNoAddresses: there is no InternalIP or ExternalIP address to choose from.
	ErrNoAddresses = errors.New("no usable node addresses")
	// ErrFamilyUnavailable: the node has no node IP of a family.
	ErrFamilyUnavailable = errors.New("IP family unavailable on this node")
)

// Mode says who wrote the node's addresses, which changes what "0.0.0.0" and "::"
// do (KEP-3705 "Current behavior").
type Mode uint8

const (
	// NoCloud: bare metal; kubelet set the addresses, or they come from local
	// interfaces. "0.0.0.0" / "::" sort the preferred family first.
	NoCloud Mode = iota
	// ExternalCloud: an external cloud provider set the addresses, in its order of
	// preference. "0.0.0.0" / "::" leave that order alone, as kubelet does not pass
	// them to the cloud provider.
	ExternalCloud
)

// Address is one InternalIP or ExternalIP entry of a Node's status.addresses.
type Address struct {
	Type v1.NodeAddressType
	Addr netip.Addr
}

// String returns e.g. "10.0.0.1 (InternalIP)".
func (a Address) String() string { return fmt.Sprintf("%s (%s)", a.Addr, a.Type) }

// addressTypes lists the IP address types in precedence order: a Node's primary IP
// is its first InternalIP, or its first ExternalIP if it has no InternalIP.
var addressTypes = []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP}

// ParseAddresses returns the InternalIP and ExternalIP entries of in, in order, as
// unmapped addresses without repeated (Type, Addr) pairs. Other types (Hostname,
// InternalDNS, ...) are ignored. Entries that do not parse, have a zone, or cannot be
// a node IP (loopback, link-local, ...) are left out, each with a reason in skipped.
func ParseAddresses(in []v1.NodeAddress) (out []Address, skipped []error) {
	for _, na := range in {
		if !slices.Contains(addressTypes, na.Type) {
			continue
		}
		a, err := netip.ParseAddr(na.Address)
		if err == nil && a.Zone() != "" {
			err = errors.New("a node address cannot have a zone")
		}
		if err == nil {
			a = a.Unmap()
			err = checkUsable(a)
		}
		if err != nil {
			skipped = append(skipped, fmt.Errorf("skipping %s %q: %w", na.Type, na.Address, err))
			continue
		}
		if ad := (Address{Type: na.Type, Addr: a}); !slices.Contains(out, ad) {
			out = append(out, ad)
		}
	}
	return out, skipped
}

// IPs is the outcome of node IP selection.
type IPs struct {
	// Primary is the node IP of the primary family; Secondary, if valid, is the
	// node IP of the other family.
	Primary, Secondary netip.Addr
	// Addresses are the node addresses after applying Spec, in order (the
	// "resulting node addresses" of KEP-3705's examples).
	Addresses []Address
	// Spec is the --node-ip value applied.
	Spec Spec
	// Source names where the addresses came from, for messages.
	Source string
	// Skipped holds a reason per unusable status.addresses entry.
	Skipped []error
}

// Select applies spec to addrs (a node's addresses in preference order) as KEP-3705
// describes, and derives the node IPs:
//   - unset, "0.0.0.0", "::": all addresses stay; in NoCloud mode "0.0.0.0" / "::"
//     stably move the named family first. The primary is the first InternalIP (else
//     ExternalIP) and the secondary the first InternalIP (else ExternalIP) of the
//     other family (KEP-1664).
//   - a specific address must be present (else ErrNodeIPNotFound) and becomes its
//     family's node IP; a keyword takes the first address of its family by the same
//     InternalIP-over-ExternalIP rule (else ErrNoFamilyAddress). The chosen
//     addresses come first, in spec order, and the first is the primary. Other
//     addresses of a chosen one's type are dropped, and so are InternalIPs when an
//     ExternalIP was chosen, since they would take precedence over it. Addresses of
//     other types survive, so a single IP can still give a dual-stack node; a lone
//     keyword instead drops the other family (single-stack).
//
// An empty result is ErrNoAddresses. The output has no repeated (Type, Addr) pair
// unless addrs has, and holds only addresses from addrs.
func Select(addrs []Address, spec Spec, mode Mode) (IPs, error) {
	ips := IPs{Spec: spec}
	switch {
	case spec.IsZero() || spec.elems[0].Kind == KindAny:
		ips.Addresses = slices.Clone(addrs)
		if !spec.IsZero() && mode == NoCloud {
			preferFamily(ips.Addresses, spec.elems[0].Family)
		}
		ips.Primary, ips.Secondary = PrimaryNodeIPs(ips.Addresses)
	default:
		var picks []netip.Addr
		var err error
		if ips.Addresses, picks, err = enforce(addrs, spec); err != nil {
			return IPs{Spec: spec}, err
		}
		ips.Primary = picks[0]
		ips.Secondary = first(ips.Addresses, spec.elems[0].Family.Other()).Addr
		if len(picks) == 2 {
			ips.Secondary = picks[1]
		}
	}
	if !ips.Primary.IsValid() {
		return ips, fmt.Errorf("%w: no InternalIP or ExternalIP address", ErrNoAddresses)
	}
	return ips, nil
}

// enforce applies a spec with specific addresses or keywords; picks are the chosen
// node IPs in spec order.
func enforce(addrs []Address, spec Spec) ([]Address, []netip.Addr, error) {
	var out []Address
	var picks []netip.Addr
	dropRank := -1 // types of this rank or better are exclusive to the chosen addresses
	for _, e := range spec.Elements() {
		chosen, err := match(addrs, e)
		if err != nil {
			return nil, nil, err
		}
		for _, c := range chosen {
			if !slices.Contains(out, c) {
				out = append(out, c)
			}
			dropRank = max(dropRank, slices.Index(addressTypes, c.Type))
		}
		picks = append(picks, chosen[0].Addr)
	}
	only, single := spec.singleStack()
	for _, a := range addrs {
		if slices.Index(addressTypes, a.Type) <= dropRank || (single && !only.Family.Contains(a.Addr)) {
			continue
		}
		out = append(out, a)
	}
	return out, picks, nil
}

// match returns the addresses that element e (KindAddr or KindFamily) chooses.
func match(addrs []Address, e Element) ([]Address, error) {
	if e.Kind == KindFamily {
		if a := first(addrs, e.Family); a.Addr.IsValid() {
			return []Address{a}, nil
		}
		return nil, fmt.Errorf("%w: no %s address among %v", ErrNoFamilyAddress, e.Family, addrs)
	}
	var out []Address
	for _, a := range addrs {
		if a.Addr == e.Addr {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s is not among %v", ErrNodeIPNotFound, e.Addr, addrs)
	}
	return out, nil
}

// PrimaryNodeIPs applies KEP-1664's rule to addrs: the primary node IP is the first
// InternalIP, or the first ExternalIP if there is no InternalIP; the secondary is
// the same rule restricted to the other family. Either may be the zero Addr.
func PrimaryNodeIPs(addrs []Address) (primary, secondary netip.Addr) {
	primary = first(addrs, nil).Addr
	if f := family.Of(primary); f != nil {
		secondary = first(addrs, f.Other()).Addr
	}
	return primary, secondary
}

// first returns the first InternalIP of family f (any family if f is nil), else
// the first such ExternalIP, else the zero Address.
func first(addrs []Address, f *family.Family) Address {
	for _, t := range addressTypes {
		for _, a := range addrs {
			if a.Type == t && (f == nil || f.Contains(a.Addr)) {
				return a
			}
		}
	}
	return Address{}
}

// preferFamily stably moves the addresses of f to the front.
func preferFamily(addrs []Address, f *family.Family) {
	rank := func(a Address) int {
		if f.Contains(a.Addr) {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(addrs, func(a, b Address) int { return cmp.Compare(rank(a), rank(b)) })
}

// For returns the node IP of family f, or the zero Addr.
func (n IPs) For(f *family.Family) netip.Addr {
	for _, a := range []netip.Addr{n.Primary, n.Secondary} {
		if f.Contains(a) {
			return a
		}
	}
	return netip.Addr{}
}

// PrimaryFamily returns the family of the primary node IP, or nil if there is none.
func (n IPs) PrimaryFamily() *family.Family { return family.Of(n.Primary) }

// HostIPs returns the node's status.hostIPs per KEP-2681: [Primary, Secondary],
// without an invalid Secondary.
func (n IPs) HostIPs() []netip.Addr { return HostIPs(n.Primary, n.Secondary) }

// Usable returns nil if the node has a node IP of family f, and otherwise an error
// wrapping ErrFamilyUnavailable that says why, for the log line of a daemon going
// single-stack.
func (n IPs) Usable(f *family.Family) error {
	if n.For(f).IsValid() {
		return nil
	}
	if e, ok := n.Spec.singleStack(); ok {
		return fmt.Errorf("%w: %s: --node-ip %q asks for a single-stack %s node", ErrFamilyUnavailable, f, n.Spec, e.Family)
	}
	src := n.Source
	if src == "" {
		src = "the node's addresses"
	}
	if n.Spec.IsZero() {
		return fmt.Errorf("%w: no %s address in %s", ErrFamilyUnavailable, f, src)
	}
	return fmt.Errorf("%w: no %s address left in %s after --node-ip %q", ErrFamilyUnavailable, f, src, n.Spec)
}

// String describes the node IPs, e.g. "dual-stack IPv6-primary abcd::1234,5.6.7.8".
func (n IPs) String() string {
	switch {
	case !n.Primary.IsValid():
		return "no node IP"
	case !n.Secondary.IsValid():
		return fmt.Sprintf("single-stack %s %s", n.PrimaryFamily(), n.Primary)
	}
	return fmt.Sprintf("dual-stack %s-primary %s,%s", n.PrimaryFamily(), n.Primary, n.Secondary)
}

// HostIPs builds a pod's status.hostIPs per KEP-2681 from candidate addresses,
// primary first: entry 0 is the first valid address (status.hostIP), and after it
// only the first address of the other family, so duplicates are gone and there is
// at most one address per family. Invalid and zoned addresses are skipped;
// IPv4-mapped ones are unmapped.
func HostIPs(addrs ...netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if !a.IsValid() || a.Zone() != "" {
			continue
		}
		a = a.Unmap()
		if !slices.ContainsFunc(out, func(o netip.Addr) bool { return family.Of(o) == family.Of(a) }) {
			out = append(out, a)
		}
	}
	return out
}

// Options configures NodeIPs.
type Options struct {
	Mode Mode
	// Interfaces, in NoCloud mode, supplies the candidates when the Node is nil or
	// lists no usable InternalIP / ExternalIP. It is never used in ExternalCloud
	// mode, where only the cloud provider's addresses count.
	Interfaces InterfaceLister
}

// NodeIPs returns the proxy's node IPs: Select applied to node's status.addresses,
// or, in NoCloud mode without usable addresses, to LocalAddresses(opts.Interfaces).
// A nil node is allowed. Unusable status.addresses entries are reported in
// IPs.Skipped, also on error.
func NodeIPs(node *v1.Node, spec Spec, opts Options) (IPs, error) {
	var addrs []Address
	var skipped []error
	source := "no Node object"
	if node != nil {
		addrs, skipped = ParseAddresses(node.Status.Addresses)
		source = fmt.Sprintf("node %q status.addresses", node.Name)
	}
	fail := IPs{Spec: spec, Source: source, Skipped: skipped}
	if len(addrs) == 0 {
		switch {
		case opts.Mode == ExternalCloud:
			return fail, fmt.Errorf("%w: %s: the external cloud provider has not set any", ErrNoAddresses, source)
		case opts.Interfaces == nil:
			return fail, fmt.Errorf("%w: %s, and no interface lister", ErrNoAddresses, source)
		}
		var err error
		if addrs, err = LocalAddresses(opts.Interfaces); err != nil {
			return fail, err
		}
		source = "local interfaces"
	}
	ips, err := Select(addrs, spec, opts.Mode)
	ips.Source, ips.Skipped = source, skipped
	if err != nil {
		return ips, fmt.Errorf("--node-ip %q on %s: %w", spec, source, err)
	}
	return ips, nil
}
