// Package model is dsproxy's per-family view of the cluster: service ports, their
// endpoints, the endpoint choice each node makes, and trackers that say what changed.
//
// Everything here is pure Go with no kernel access. One instance of each tracker
// serves one IP family; the same code serves both families, parameterised by a
// *family.Family. Addresses are netip values.
package model

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ServicePortName identifies one port of one Service, as kube-proxy's ServicePortName
// does: the Service's namespace and name, the port's name and its protocol.
type ServicePortName struct {
	types.NamespacedName
	Port     string
	Protocol v1.Protocol
}

// String prints "ns/name:port/proto" (":port" omitted for an unnamed port).
func (n ServicePortName) String() string {
	s := n.Namespace + "/" + n.Name
	if n.Port != "" {
		s += ":" + n.Port
	}
	return s + "/" + string(n.Protocol)
}

// Compare orders names for deterministic output.
func (n ServicePortName) Compare(o ServicePortName) int {
	return cmp.Or(cmp.Compare(n.Namespace, o.Namespace), cmp.Compare(n.Name, o.Name),
		cmp.Compare(n.Port, o.Port), cmp.Compare(n.Protocol, o.Protocol))
}

// ServicePort is one port of one Service as a single family serves it. Every address
// in it belongs to that family.
type ServicePort struct {
	Name      ServicePortName
	ClusterIP netip.Addr
	Port      uint16
	Protocol  v1.Protocol
	// NodePort is 0 when the port has none.
	NodePort uint16
	// ExternalIPs and LoadBalancerVIPs are sorted and deduplicated. LoadBalancerVIPs
	// holds only ingress IPs with ipMode VIP (or unset).
	ExternalIPs      []netip.Addr
	LoadBalancerVIPs []netip.Addr
	// SourceRanges are the Service's loadBalancerSourceRanges of this family, masked.
	// Empty means any source; a zero-length prefix among them also means any source.
	SourceRanges        []netip.Prefix
	ExternalPolicyLocal bool
	InternalPolicyLocal bool
	// HealthCheckNodePort is set for LoadBalancer Services with
	// externalTrafficPolicy Local.
	HealthCheckNodePort uint16
	// AffinitySeconds is the ClientIP session affinity timeout; 0 means no affinity.
	AffinitySeconds     uint32
	TrafficDistribution string
}

// String identifies the service port in logs.
func (sp *ServicePort) String() string {
	return sp.Name.String() + " " + netip.AddrPortFrom(sp.ClusterIP, sp.Port).String()
}

// ExternallyAccessible reports whether the port is reachable from outside the
// cluster: through a NodePort, an ExternalIP or a LoadBalancer VIP.
func (sp *ServicePort) ExternallyAccessible() bool {
	return sp.NodePort != 0 || len(sp.ExternalIPs) != 0 || len(sp.LoadBalancerVIPs) != 0
}

// UsesClusterEndpoints reports whether some traffic to the port may go to any
// endpoint in the cluster.
func (sp *ServicePort) UsesClusterEndpoints() bool {
	return !sp.InternalPolicyLocal || sp.ExternallyAccessible()
}

// UsesLocalEndpoints reports whether some traffic to the port is restricted to
// endpoints on this node.
func (sp *ServicePort) UsesLocalEndpoints() bool {
	return sp.InternalPolicyLocal || (sp.ExternalPolicyLocal && sp.ExternallyAccessible())
}

// Equal reports whether two service ports would program the same rules.
func (sp *ServicePort) Equal(o *ServicePort) bool {
	if sp == nil || o == nil {
		return sp == o
	}
	return sp.Name == o.Name && sp.ClusterIP == o.ClusterIP && sp.Port == o.Port &&
		sp.Protocol == o.Protocol && sp.NodePort == o.NodePort &&
		slices.Equal(sp.ExternalIPs, o.ExternalIPs) &&
		slices.Equal(sp.LoadBalancerVIPs, o.LoadBalancerVIPs) &&
		slices.Equal(sp.SourceRanges, o.SourceRanges) &&
		sp.ExternalPolicyLocal == o.ExternalPolicyLocal &&
		sp.InternalPolicyLocal == o.InternalPolicyLocal &&
		sp.HealthCheckNodePort == o.HealthCheckNodePort &&
		sp.AffinitySeconds == o.AffinitySeconds &&
		sp.TrafficDistribution == o.TrafficDistribution
}

// Endpoint is one backend of one service port, merged from the EndpointSlices of
// that Service and family.
type Endpoint struct {
	Addr netip.Addr
	Port uint16
	// Ready, Serving and Terminating are the EndpointSlice conditions with the API's
	// defaults applied (nil ready and serving mean true, nil terminating false).
	Ready       bool
	Serving     bool
	Terminating bool
	// Local is true when the endpoint's nodeName is this node. The nodeName and
	// zone themselves are not kept: nothing the proxy programs depends on them
	// beyond Local and the hints, as in kube-proxy (40 bytes an endpoint, not 72).
	Local bool
	// NoNodeName is true when the slice names no node for the endpoint (a
	// hand-made or mirrored slice): it may be a pod on this node, so the
	// nftables and iptables modes masquerade it reaching itself, as
	// kube-proxy masquerades every endpoint reaching itself. It is not Local.
	NoNodeName bool
	// Hints are the slice's topology hints; nil when the endpoint has none. One
	// pointer rather than two slices: endpoints are the model's most numerous
	// values (200k at 10k Services), and nearly all have no hints.
	Hints *Hints
}

// Hints are an endpoint's topology hints, each list sorted and without duplicates.
type Hints struct {
	Zones, Nodes []string
}

// ZoneHints returns the zones the endpoint is hinted for (nil: none).
func (e *Endpoint) ZoneHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Zones
}

// NodeHints returns the nodes the endpoint is hinted for (nil: none).
func (e *Endpoint) NodeHints() []string {
	if e.Hints == nil {
		return nil
	}
	return e.Hints.Nodes
}

// AddrPort returns the endpoint's address and port.
func (e *Endpoint) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.Addr, e.Port) }

// String prints the endpoint as "addr:port" ("[addr]:port" for IPv6).
func (e *Endpoint) String() string { return e.AddrPort().String() }

// Equal reports whether two endpoints are the same in every field.
func (e *Endpoint) Equal(o *Endpoint) bool {
	return e.Addr == o.Addr && e.Port == o.Port && e.Ready == o.Ready &&
		e.Serving == o.Serving && e.Terminating == o.Terminating && e.Local == o.Local &&
		e.NoNodeName == o.NoNodeName && slices.Equal(e.ZoneHints(), o.ZoneHints()) && slices.Equal(e.NodeHints(), o.NodeHints())
}

// CompareEndpoints orders endpoints by address, then port.
func CompareEndpoints(a, b Endpoint) int {
	if c := a.Addr.Compare(b.Addr); c != 0 {
		return c
	}
	return int(a.Port) - int(b.Port)
}

// EndpointsEqual reports whether two endpoint lists are equal element by element.
func EndpointsEqual(a, b []Endpoint) bool {
	return slices.EqualFunc(a, b, func(x, y Endpoint) bool { return x.Equal(&y) })
}

// SkipError says why one object, or one part of it, was left out. Ingestion returns
// these instead of failing: one bad object never stops the others.
type SkipError struct {
	Object string // "Service ns/name", "EndpointSlice ns/name"
	Field  string // the field path that was bad, e.g. "spec.ports[2].port"
	Reason string
}

func (e *SkipError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s skipped: %s", e.Object, e.Reason)
	}
	return fmt.Sprintf("%s: %s skipped: %s", e.Object, e.Field, e.Reason)
}

func skipf(object, field, format string, args ...any) *SkipError {
	return &SkipError{Object: object, Field: field, Reason: fmt.Sprintf(format, args...)}
}

func indexField(prefix string, i int, suffix string) string {
	return prefix + "[" + strconv.Itoa(i) + "]" + suffix
}

// ProtoNumber is the IP protocol number of a Service protocol (TCP 6, UDP 17,
// SCTP 132), 0 for any other.
func ProtoNumber(p v1.Protocol) uint8 {
	switch p {
	case v1.ProtocolTCP:
		return 6
	case v1.ProtocolUDP:
		return 17
	case v1.ProtocolSCTP:
		return 132
	}
	return 0
}
