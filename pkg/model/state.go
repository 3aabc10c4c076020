package model

import (
	"k8s.io/apimachinery/pkg/types"
)

// PortState is the desired state of one service port in one family on this node: the
// port and the endpoints its traffic goes to.
type PortState struct {
	*ServicePort
	Selection
}

// InternalEndpoints are the endpoints for traffic to the ClusterIP.
func (p *PortState) InternalEndpoints() []Endpoint {
	if p.InternalPolicyLocal {
		return p.Local
	}
	return p.Cluster
}

// ExternalEndpoints are the endpoints for traffic to NodePorts, ExternalIPs and
// LoadBalancer VIPs.
func (p *PortState) ExternalEndpoints() []Endpoint {
	if p.ExternalPolicyLocal {
		return p.Local
	}
	return p.Cluster
}

// Equal reports whether two port states program the same rules (including the
// nftables backend's bound on external addresses, which follows Endpoints).
func (p *PortState) Equal(o *PortState) bool {
	if p == nil || o == nil {
		return p == o
	}
	return p.ServicePort.Equal(o.ServicePort) && p.HasAny == o.HasAny && p.Endpoints == o.Endpoints &&
		EndpointsEqual(p.Cluster, o.Cluster) && EndpointsEqual(p.Local, o.Local) &&
		EndpointsEqual(p.HealthLocal, o.HealthLocal) && EndpointsEqual(p.Serving, o.Serving)
}

// State is the desired state of one family: every service port with its chosen
// endpoints. It is a pure function of a ServiceMap, an EndpointsMap and NodeInfo,
// kept up to date incrementally by Update.
type State struct {
	Ports map[ServicePortName]*PortState
	// Previous holds, after each Update, the former state of every port that Update
	// reported changed (nil for ports that are new), so a sync can clean up after
	// what went away (stale conntrack entries).
	Previous  map[ServicePortName]*PortState
	byService map[types.NamespacedName][]ServicePortName
}

// NewState returns an empty state.
func NewState() *State {
	return &State{
		Ports:     make(map[ServicePortName]*PortState),
		byService: make(map[types.NamespacedName][]ServicePortName),
	}
}

// Update recomputes the service ports of the Services in changed (every Service in
// svcs and in the state when full is set) and returns the names of the ports whose
// state changed, including ports that are gone. Only those need reprogramming.
func (s *State) Update(svcs ServiceMap, eps EndpointsMap, node NodeInfo, changed map[types.NamespacedName]bool, full bool) []ServicePortName {
	if full {
		changed = make(map[types.NamespacedName]bool, len(svcs)+len(s.byService))
		for nn := range svcs {
			changed[nn] = true
		}
		for nn := range s.byService {
			changed[nn] = true
		}
	}
	// A new map each time, not clear: after a full update it held every port, and
	// clearing a map costs its largest size, on every later update.
	s.Previous = make(map[ServicePortName]*PortState, len(changed))
	if len(s.Ports) == 0 && len(s.byService) == 0 {
		// The first update (a cold start) adds every port: maps sized once, not
		// grown and rehashed on the way (at least one port per Service).
		s.Ports = make(map[ServicePortName]*PortState, len(changed))
		s.byService = make(map[types.NamespacedName][]ServicePortName, len(changed))
	}
	var out []ServicePortName
	for nn := range changed {
		out = s.updateService(nn, svcs[nn], eps, node, out)
	}
	return out
}

func (s *State) updateService(nn types.NamespacedName, ports []*ServicePort, eps EndpointsMap, node NodeInfo, out []ServicePortName) []ServicePortName {
	old := s.byService[nn]
	names := old[:0:0]
	for _, sp := range ports {
		ps := &PortState{ServicePort: sp, Selection: Categorize(sp, eps[sp.Name], node)}
		if old := s.Ports[sp.Name]; !ps.Equal(old) {
			out = append(out, sp.Name)
			s.Previous[sp.Name] = old
		} else {
			// Unchanged: keep the state the backends were programmed from, so
			// that they and the model hold one copy.
			ps = old
		}
		s.Ports[sp.Name] = ps
		names = append(names, sp.Name)
	}
	// A Service may have thousands of ports (the API sets no limit): past a few,
	// look the old names up in a set, not in the list.
	var kept map[ServicePortName]bool
	if len(old) > 8 && len(names) > 8 {
		kept = make(map[ServicePortName]bool, len(names))
		for _, n := range names {
			kept[n] = true
		}
	}
	for _, name := range old {
		if kept != nil && !kept[name] || kept == nil && !containsName(names, name) {
			s.Previous[name] = s.Ports[name]
			delete(s.Ports, name)
			out = append(out, name)
		}
	}
	if len(names) == 0 {
		delete(s.byService, nn)
	} else {
		s.byService[nn] = names
	}
	return out
}

func containsName(names []ServicePortName, n ServicePortName) bool {
	for _, x := range names {
		if x == n {
			return true
		}
	}
	return false
}
