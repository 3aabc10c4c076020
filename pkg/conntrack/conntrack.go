// Package conntrack deletes stale connection-tracking entries over netlink, for the
// proxy's UDP and SCTP cleanup: when a service's endpoint goes away, or a service
// IP or NodePort gains its first endpoint, connectionless flows already in the
// conntrack table keep being NATed to the old destination (or keep being dropped)
// until they are deleted.
//
// A caller builds a list of Filters (ForIP, ForPort, ForNAT, ForPortNAT,
// ForStaleEndpoints) and hands them to Cleaner.Clear, which dumps the family's table
// once and deletes every entry matching any filter. Fake implements Cleaner in
// memory for unit tests of callers.
package conntrack

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// Protocol is an IP protocol number.
type Protocol uint8

// The protocols the proxy cleans up (TCP is included for completeness).
const (
	TCP  Protocol = 6
	UDP  Protocol = 17
	SCTP Protocol = 132
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case SCTP:
		return "sctp"
	}
	return fmt.Sprintf("proto-%d", uint8(p))
}

// ProtocolFor maps a Kubernetes protocol to its number.
func ProtocolFor(p v1.Protocol) (Protocol, bool) {
	switch p {
	case v1.ProtocolTCP:
		return TCP, true
	case v1.ProtocolUDP:
		return UDP, true
	case v1.ProtocolSCTP:
		return SCTP, true
	}
	return 0, false
}

// Flow is one conntrack entry: the original tuple (as sent by the client) and the
// reply tuple (as the reply is expected; after DNAT its source is the endpoint).
// Ports are zero for protocols without ports.
type Flow struct {
	Protocol Protocol
	OrigSrc  netip.AddrPort
	OrigDst  netip.AddrPort
	ReplySrc netip.AddrPort
	ReplyDst netip.AddrPort
	Zone     uint16
	Mark     uint32
}

func (f Flow) String() string {
	return fmt.Sprintf("%s %s->%s reply %s->%s", f.Protocol, f.OrigSrc, f.OrigDst, f.ReplySrc, f.ReplyDst)
}

// Family returns the flow's address family (nil for a zero Flow).
func (f Flow) Family() *family.Family { return family.Of(f.OrigDst.Addr()) }

// Filter selects conntrack entries of one protocol. Unset fields (zero Addr, zero
// port, empty list) are wildcards, but a filter must set at least one of OrigDst,
// OrigDstPort and ReplySrc: Clear refuses filters that would match a whole protocol.
type Filter struct {
	// Protocol is required.
	Protocol Protocol
	// OrigDst is the original destination address: a ClusterIP, external IP or
	// load-balancer IP (or, for NodePorts, a node address).
	OrigDst netip.Addr
	// OrigDstPort is the original destination port: the service port or NodePort.
	OrigDstPort uint16
	// ReplySrc is the reply's source address, i.e. the address the flow was DNATed
	// to: an endpoint IP.
	ReplySrc netip.Addr
	// ReplySrcPort is the reply's source port (the endpoint's target port).
	ReplySrcPort uint16
	// Keep exempts flows whose reply source (endpoint address and port) is listed:
	// flows already going to a serving endpoint.
	Keep []netip.AddrPort
	// keepSorted says Keep is sorted, without IPv4-mapped addresses, so Match
	// searches it instead of walking it (ForStaleEndpoints; a Service may have
	// tens of thousands of endpoints and flows).
	keepSorted bool
}

// ForIP matches flows sent to origDst (e.g. a ClusterIP whose UDP service gained its
// first endpoint, so earlier flows cached a "no endpoint" verdict). Like kube-proxy's
// ClearEntriesForIP.
func ForIP(proto Protocol, origDst netip.Addr) Filter {
	return Filter{Protocol: proto, OrigDst: origDst}
}

// ForPort matches flows sent to a destination port on any address (a NodePort).
// Like kube-proxy's ClearEntriesForPort.
func ForPort(proto Protocol, port uint16) Filter {
	return Filter{Protocol: proto, OrigDstPort: port}
}

// ForNAT matches flows sent to origDst and DNATed to dnatTo (an endpoint that went
// away). Like kube-proxy's ClearEntriesForNAT.
func ForNAT(proto Protocol, origDst, dnatTo netip.Addr) Filter {
	return Filter{Protocol: proto, OrigDst: origDst, ReplySrc: dnatTo}
}

// ForPortNAT matches flows sent to a port on any address (a NodePort) and DNATed to
// dnatTo. Like kube-proxy's ClearEntriesForPortNAT.
func ForPortNAT(proto Protocol, port uint16, dnatTo netip.Addr) Filter {
	return Filter{Protocol: proto, OrigDstPort: port, ReplySrc: dnatTo}
}

// ForStaleEndpoints matches flows sent to origDst:port whose reply source is not
// one of the serving endpoints: the reconcile kube-proxy's CleanStaleEntries does
// for a service IP. An invalid origDst makes it a NodePort filter (any address).
func ForStaleEndpoints(proto Protocol, origDst netip.Addr, port uint16, serving []netip.AddrPort) Filter {
	keep := make([]netip.AddrPort, 0, len(serving))
	for _, a := range serving {
		keep = append(keep, netip.AddrPortFrom(a.Addr().Unmap(), a.Port()))
	}
	slices.SortFunc(keep, netip.AddrPort.Compare)
	return Filter{Protocol: proto, OrigDst: origDst, OrigDstPort: port, Keep: slices.Compact(keep), keepSorted: true}
}

// Validate checks that the filter selects something narrower than a protocol and
// that its addresses belong to fam.
func (f Filter) Validate(fam *family.Family) error {
	if f.Protocol == 0 {
		return fmt.Errorf("conntrack filter %v: no protocol", f)
	}
	if !f.OrigDst.IsValid() && f.OrigDstPort == 0 && !f.ReplySrc.IsValid() {
		return fmt.Errorf("conntrack filter %v: matches every %s flow; set OrigDst, OrigDstPort or ReplySrc", f, f.Protocol)
	}
	for _, a := range []netip.Addr{f.OrigDst, f.ReplySrc} {
		if a.IsValid() && !fam.Contains(a) {
			return fmt.Errorf("conntrack filter %v: address %s is not %s", f, a, fam)
		}
	}
	for _, k := range f.Keep {
		if !fam.Contains(k.Addr()) {
			return fmt.Errorf("conntrack filter %v: keep %s is not %s", f, k, fam)
		}
	}
	return nil
}

// Match reports whether the flow is selected by the filter. It does not apply the
// "at least one field" rule of Validate.
func (f Filter) Match(fl Flow) bool {
	if fl.Protocol != f.Protocol {
		return false
	}
	if f.OrigDst.IsValid() && fl.OrigDst.Addr().Unmap() != f.OrigDst.Unmap() {
		return false
	}
	if f.OrigDstPort != 0 && fl.OrigDst.Port() != f.OrigDstPort {
		return false
	}
	if f.ReplySrc.IsValid() && fl.ReplySrc.Addr().Unmap() != f.ReplySrc.Unmap() {
		return false
	}
	if f.ReplySrcPort != 0 && fl.ReplySrc.Port() != f.ReplySrcPort {
		return false
	}
	if f.keepSorted {
		src := netip.AddrPortFrom(fl.ReplySrc.Addr().Unmap(), fl.ReplySrc.Port())
		_, kept := slices.BinarySearchFunc(f.Keep, src, netip.AddrPort.Compare)
		return !kept
	}
	for _, k := range f.Keep {
		if k.Addr().Unmap() == fl.ReplySrc.Addr().Unmap() && k.Port() == fl.ReplySrc.Port() {
			return false
		}
	}
	return true
}

func (f Filter) String() string {
	var b strings.Builder
	b.WriteString(f.Protocol.String())
	if f.OrigDst.IsValid() {
		fmt.Fprintf(&b, " orig-dst=%s", f.OrigDst)
	}
	if f.OrigDstPort != 0 {
		fmt.Fprintf(&b, " orig-dport=%d", f.OrigDstPort)
	}
	if f.ReplySrc.IsValid() {
		fmt.Fprintf(&b, " reply-src=%s", f.ReplySrc)
	}
	if f.ReplySrcPort != 0 {
		fmt.Fprintf(&b, " reply-sport=%d", f.ReplySrcPort)
	}
	if len(f.Keep) > 0 {
		fmt.Fprintf(&b, " keep=%v", f.Keep)
	}
	return b.String()
}

// matchAny reports whether any filter matches.
func matchAny(filters []Filter, fl Flow) bool {
	for _, f := range filters {
		if f.Match(fl) {
			return true
		}
	}
	return false
}

func validateAll(fam *family.Family, filters []Filter) error {
	if fam == nil {
		return fmt.Errorf("conntrack: nil family")
	}
	for _, f := range filters {
		if err := f.Validate(fam); err != nil {
			return err
		}
	}
	return nil
}

// Cleaner deletes conntrack entries.
type Cleaner interface {
	// Clear deletes every entry of the family that matches at least one filter,
	// with a single dump of the table, and returns how many it deleted. An entry
	// that disappears between the dump and its deletion is not an error. With no
	// filters it does nothing. It returns an error without touching the table if a
	// filter is invalid (see Filter.Validate). After a partial failure (an
	// interrupted dump, a failed delete) it has still deleted what it could.
	Clear(fam *family.Family, filters ...Filter) (int, error)
	// List returns the family's entries.
	List(fam *family.Family) ([]Flow, error)
}
