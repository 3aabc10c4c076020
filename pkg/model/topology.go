package model

import (
	"slices"

	v1 "k8s.io/api/core/v1"
)

// NodeInfo is what endpoint selection needs to know about this node.
type NodeInfo struct {
	Name string
	// Zone is the node's topology.kubernetes.io/zone label.
	Zone string
}

// NodeInfoFrom extracts NodeInfo from a Node object; a nil node yields only name.
func NodeInfoFrom(name string, node *v1.Node) NodeInfo {
	ni := NodeInfo{Name: name}
	if node != nil {
		ni.Zone = node.Labels[v1.LabelTopologyZone]
	}
	return ni
}

// Selection is the endpoint choice for one service port on one node.
type Selection struct {
	// Cluster endpoints serve traffic that may go anywhere in the cluster, after
	// topology hints. Nil when the service port uses no cluster endpoints.
	Cluster []Endpoint
	// Local endpoints serve traffic restricted to this node (internal or external
	// traffic policy Local). Nil when the port uses no local endpoints.
	Local []Endpoint
	// HasAny is true when some endpoint anywhere could serve the port; a port with
	// traffic policy Local and no local endpoint then drops rather than rejects.
	HasAny bool
	// HealthLocal are the ready local endpoints of a port that has a health check
	// node port but uses no local endpoints in this family (no NodePort or external
	// address of the family: a load balancer without NodePorts before its status
	// names a VIP, or whose VIPs are of the other family): the health check counts
	// them, as kube-proxy counts every ready local endpoint of the Service. Nil
	// otherwise; Local holds them.
	HealthLocal []Endpoint
	// Serving, for a UDP or SCTP port, are all its serving endpoints (ready, or
	// terminating but still serving), whatever traffic policies and topology
	// choose: the conntrack cleanup keeps flows DNATed to them, as kube-proxy's
	// does, so a terminating endpoint's flows last while it serves. Nil for other
	// protocols.
	Serving []Endpoint
	// Endpoints, for a port with ExternalIPs or load-balancer IPs, is how many
	// endpoints it has in the family, whatever this node chooses: the same on
	// every node, so a bound on the external addresses served that grows with it
	// serves the same ones everywhere. 0 for other ports.
	Endpoints int
}

// Categorize chooses the endpoints of sp that this node sends traffic to. It is a pure
// function of its arguments and follows kube-proxy's CategorizeEndpoints:
//   - cluster endpoints are the ready endpoints that topology hints allow (same node
//     first when every ready endpoint has node hints and one is for this node, else
//     same zone when every ready endpoint has zone hints and one is for this zone,
//     else all ready endpoints);
//   - local endpoints are the ready endpoints on this node;
//   - when a category has no ready endpoint it falls back to serving-and-terminating
//     endpoints (KEP-1669), so connections drain instead of failing.
//
// eps must not be modified afterwards: results may share its backing array.
func Categorize(sp *ServicePort, eps []Endpoint, node NodeInfo) Selection {
	var sel Selection
	if len(eps) == 0 {
		return sel
	}
	if len(sp.ExternalIPs)+len(sp.LoadBalancerVIPs) > 0 {
		sel.Endpoints = len(eps)
	}
	if sp.Protocol == v1.ProtocolUDP || sp.Protocol == v1.ProtocolSCTP {
		sel.Serving = filter(eps, func(e *Endpoint) bool { return e.Serving || e.Ready })
	}
	if sp.UsesClusterEndpoints() {
		mode := topologyMode(eps, node)
		sel.Cluster = filter(eps, func(e *Endpoint) bool { return e.Ready && allowedByTopology(e, mode, node) })
		if len(sel.Cluster) == 0 {
			sel.Cluster = filter(eps, servingTerminating)
		}
		sel.HasAny = len(sel.Cluster) > 0
	}
	if !sp.UsesLocalEndpoints() {
		if sp.HealthCheckNodePort != 0 {
			sel.HealthLocal = filter(eps, func(e *Endpoint) bool { return e.Local && e.Ready })
		}
		return sel
	}
	sel.Local = filter(eps, func(e *Endpoint) bool { return e.Local && e.Ready })
	if len(sel.Local) == 0 {
		sel.Local = filter(eps, func(e *Endpoint) bool { return e.Local && servingTerminating(e) })
	}
	if !sel.HasAny {
		sel.HasAny = slices.ContainsFunc(eps, func(e Endpoint) bool { return e.Ready || servingTerminating(&e) })
	}
	return sel
}

func servingTerminating(e *Endpoint) bool { return e.Serving && e.Terminating }

type topology int

const (
	topologyNone topology = iota
	topologySameNode
	topologySameZone
)

// topologyMode decides which hints to honour. Hints are honoured only when every
// ready endpoint carries them and at least one matches this node or zone; otherwise
// following them could starve this node of endpoints. As in kube-proxy, a node
// without a zone label is in zone "": a hint for zone "" matches it.
func topologyMode(eps []Endpoint, node NodeInfo) topology {
	anyReady, allNode, forNode, allZone, forZone := false, true, false, true, false
	for i := range eps {
		e := &eps[i]
		if !e.Ready {
			continue
		}
		anyReady = true
		if len(e.NodeHints()) == 0 {
			allNode = false
		} else if slices.Contains(e.NodeHints(), node.Name) {
			forNode = true
		}
		if len(e.ZoneHints()) == 0 {
			allZone = false
		} else if slices.Contains(e.ZoneHints(), node.Zone) {
			forZone = true
		}
	}
	switch {
	case !anyReady:
		return topologyNone
	case allNode && forNode:
		return topologySameNode
	case allZone && forZone:
		return topologySameZone
	}
	return topologyNone
}

func allowedByTopology(e *Endpoint, mode topology, node NodeInfo) bool {
	switch mode {
	case topologySameNode:
		return slices.Contains(e.NodeHints(), node.Name)
	case topologySameZone:
		return slices.Contains(e.ZoneHints(), node.Zone)
	}
	return true
}

// filter returns the endpoints for which keep is true. When keep holds for all of
// them it returns eps itself, so the common case allocates nothing.
func filter(eps []Endpoint, keep func(*Endpoint) bool) []Endpoint {
	for i := range eps {
		if keep(&eps[i]) {
			continue
		}
		out := make([]Endpoint, i, len(eps)-1)
		copy(out, eps[:i])
		for j := i + 1; j < len(eps); j++ {
			if keep(&eps[j]) {
				out = append(out, eps[j])
			}
		}
		if len(out) == 0 {
			return nil
		}
		return out
	}
	return eps
}
