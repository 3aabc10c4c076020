// Package nodeip is dsproxy's shared address-selection package: the proxy's node IP
// per family is derived here and nowhere else.
//
// It implements the --node-ip syntax of KEP-3705 (a single IP, a dual-stack pair in
// either order, "0.0.0.0" / "::") plus the original draft's "IPv4" / "IPv6" keywords;
// the primary / secondary node IP rules of KEP-1664 applied to a Node's
// status.addresses; and status.hostIPs per KEP-2681. Without a Node object, node IP
// candidates come from local interfaces.
package nodeip

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// Kind says what one element of a --node-ip value asks for.
type Kind uint8

const (
	// KindAddr is a specific address that the node must have.
	KindAddr Kind = iota + 1
	// KindAny is "0.0.0.0" or "::": no specific address. With an external cloud
	// provider the cloud's order stands (kubelet never passes these on); otherwise
	// addresses of the family are preferred, with the other family as fallback.
	KindAny
	// KindFamily is the "IPv4" or "IPv6" keyword: any one address of the family,
	// which the node must have.
	KindFamily
)

// Element is one comma-separated element of a --node-ip value.
type Element struct {
	Kind   Kind
	Family *family.Family
	// Addr is the address for KindAddr, Family.Any for KindAny, and zero for
	// KindFamily.
	Addr netip.Addr
}

// String returns the element in --node-ip syntax.
func (e Element) String() string {
	if e.Kind == KindFamily {
		return e.Family.Name
	}
	return e.Addr.String()
}

// Spec is a parsed --node-ip value. The zero Spec means the flag is unset. A Spec
// made by ParseNodeIP has at most two elements, at most one per family, and a
// KindAny element only on its own. Specs are comparable with ==.
type Spec struct {
	elems [2]Element
	n     int
}

// ParseNodeIP parses a --node-ip value. "" is the unset flag (the zero Spec).
// Otherwise s holds one or two comma-separated elements (surrounding spaces are
// ignored), each an IP address or the keyword IPv4 / IPv6 (any letter case). A pair
// needs one element per family and may not use "0.0.0.0" or "::". Zones,
// IPv4-mapped IPv6 addresses, and loopback, link-local or multicast addresses are
// rejected. The error quotes the offending value.
func ParseNodeIP(s string) (Spec, error) {
	if s == "" {
		return Spec{}, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > 2 {
		return Spec{}, fmt.Errorf("invalid --node-ip %q: %d values; at most 2 (one IPv4 and one IPv6)", s, len(parts))
	}
	var spec Spec
	for i, p := range parts {
		e, err := parseElement(strings.TrimSpace(p))
		if err != nil {
			return Spec{}, fmt.Errorf("invalid --node-ip %q: value %d: %w", s, i+1, err)
		}
		spec.elems[i] = e
	}
	spec.n = len(parts)
	if err := spec.checkPair(); err != nil {
		return Spec{}, fmt.Errorf("invalid --node-ip %q: %w", s, err)
	}
	return spec, nil
}

func parseElement(p string) (Element, error) {
	if p == "" {
		return Element{}, errors.New("empty value")
	}
	for _, f := range family.All {
		if strings.EqualFold(p, f.Name) {
			return Element{Kind: KindFamily, Family: f}, nil
		}
	}
	a, err := netip.ParseAddr(p)
	switch {
	case err != nil:
		return Element{}, fmt.Errorf("%q is neither an IP address nor IPv4/IPv6: %w", p, err)
	case a.Zone() != "":
		return Element{}, fmt.Errorf("%q has a zone; a node IP cannot have one", p)
	case a.Is4In6():
		return Element{}, fmt.Errorf("%q is an IPv4-mapped IPv6 address; write %q", p, a.Unmap().String())
	case a.IsUnspecified():
		return Element{Kind: KindAny, Family: family.Of(a), Addr: a}, nil
	}
	if err := checkUsable(a); err != nil {
		return Element{}, fmt.Errorf("%q: %w", p, err)
	}
	return Element{Kind: KindAddr, Family: family.Of(a), Addr: a}, nil
}

// checkPair enforces the dual-stack rules on a two-element spec.
func (s Spec) checkPair() error {
	if s.n != 2 {
		return nil
	}
	a, b := s.elems[0], s.elems[1]
	if a.Family == b.Family {
		return fmt.Errorf("%q and %q are both %s; a dual-stack pair needs one IPv4 and one IPv6 value", a.String(), b.String(), a.Family)
	}
	for _, e := range s.elems {
		if e.Kind == KindAny {
			return fmt.Errorf("%q (any %s address) is only allowed on its own; use %q in a dual-stack pair", e.String(), e.Family, e.Family.Name)
		}
	}
	return nil
}

// checkUsable returns why a cannot be a node IP (as kubelet's validateNodeIP does),
// or nil. Only global unicast addresses qualify.
func checkUsable(a netip.Addr) error {
	f := family.Of(a)
	switch {
	case f == nil:
		return errors.New("not an IP address")
	case a.IsUnspecified():
		return errors.New("the unspecified address cannot be a node IP")
	case f.Loopback.Contains(a):
		return errors.New("a loopback address cannot be a node IP")
	case f.LinkLocal.Contains(a):
		return errors.New("a link-local address cannot be a node IP")
	case a.IsMulticast():
		return errors.New("a multicast address cannot be a node IP")
	case !a.IsGlobalUnicast():
		return errors.New("a non-unicast address cannot be a node IP")
	}
	return nil
}

// String returns s in --node-ip syntax; ParseNodeIP(s.String()) == s.
func (s Spec) String() string {
	parts := make([]string, s.n)
	for i, e := range s.Elements() {
		parts[i] = e.String()
	}
	return strings.Join(parts, ",")
}

// Elements returns the elements in order: the first decides the primary family.
func (s Spec) Elements() []Element { return s.elems[:s.n] }

// IsZero reports whether s is the unset flag.
func (s Spec) IsZero() bool { return s.n == 0 }

// For returns the element for family f, if s has one.
func (s Spec) For(f *family.Family) (Element, bool) {
	for _, e := range s.Elements() {
		if e.Family == f {
			return e, true
		}
	}
	return Element{}, false
}

// SingleStack returns the element of a one-keyword spec ("IPv4" or "IPv6"), which
// asks for a single-stack node.
func (s Spec) SingleStack() (Element, bool) { return s.singleStack() }

func (s Spec) singleStack() (Element, bool) {
	if s.n == 1 && s.elems[0].Kind == KindFamily {
		return s.elems[0], true
	}
	return Element{}, false
}
