package proxier

import (
	"net/netip"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/conntrack"
	"github.com/dsproxy/dsproxy/pkg/model"
)

// staleFlows returns the conntrack filters that remove the UDP and SCTP flows a
// change of one service port made stale: flows DNATed to endpoints that no longer
// serve it, flows to frontends (ClusterIP, ExternalIPs, LoadBalancer VIPs, NodePort)
// that are gone, flows that were rejected while the port had no endpoints, and
// flows that went un-NATed to a frontend new to a serving port.
// Connection-oriented TCP needs none of this: its conntrack entries die with the
// connections. old or cur is nil for a port that is new or deleted.
//
// A port left with no serving endpoint keeps its flows, as in kube-proxy v1.36
// (its reconciler skips such Services: a change must not cut the flows it
// could keep, as it does not cut TCP connections): a single pod whose readiness
// probe fails a moment keeps its clients, and new flows are rejected meanwhile.
// Once the port serves again its flows to others than its serving endpoints go.
func staleFlows(old, cur *model.PortState) []conntrack.Filter {
	ps := cur
	if ps == nil {
		ps = old
	}
	if ps == nil {
		return nil // a port that came and went between two successful syncs
	}
	proto, ok := conntrack.ProtocolFor(ps.Protocol)
	if !ok || proto == conntrack.TCP {
		return nil
	}
	oldServing, curServing := serving(old), serving(cur)
	lost := slices.ContainsFunc(oldServing, func(a netip.AddrPort) bool { return !hasAddrPort(curServing, a) })
	gained := len(oldServing) == 0 && len(curServing) > 0
	oldFronts, curFronts := frontends(old), frontends(cur)
	var out []conntrack.Filter
	for _, fr := range oldFronts {
		kept := hasAddrPort(curFronts, fr)
		if kept && (!lost && !gained || len(curServing) == 0) {
			continue
		}
		keep := curServing
		if !kept {
			keep = nil
		}
		out = append(out, conntrack.ForStaleEndpoints(proto, fr.Addr(), fr.Port(), keep))
	}
	if len(curServing) > 0 {
		// A frontend new to a serving port (an ExternalIP, a load-balancer
		// VIP its controller assigned later, a NodePort) may carry flows that
		// went un-NATed before it was programmed; a client that keeps sending
		// would stay on them. kube-proxy's reconciler clears them too.
		for _, fr := range curFronts {
			if !hasAddrPort(oldFronts, fr) {
				out = append(out, conntrack.ForStaleEndpoints(proto, fr.Addr(), fr.Port(), curServing))
			}
		}
	}
	return out
}

// serving lists the endpoints whose flows stay: those a port's traffic may go to
// and every other serving one (a terminating endpoint that still serves, or one
// traffic policies or topology do not choose here), as kube-proxy keeps flows to
// every serving endpoint; sorted and without duplicates (a Service may have tens
// of thousands).
func serving(ps *model.PortState) []netip.AddrPort {
	if ps == nil {
		return nil
	}
	out := make([]netip.AddrPort, 0, len(ps.Cluster)+len(ps.Local)+len(ps.Serving))
	for _, list := range [][]model.Endpoint{ps.Cluster, ps.Local, ps.Serving} {
		for i := range list {
			out = append(out, list[i].AddrPort())
		}
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return slices.Compact(out)
}

// hasAddrPort reports whether the sorted list holds a.
func hasAddrPort(sorted []netip.AddrPort, a netip.AddrPort) bool {
	_, found := slices.BinarySearchFunc(sorted, a, netip.AddrPort.Compare)
	return found
}

// frontends lists the addresses and ports a port is reached at, sorted and without
// duplicates; a NodePort is an invalid address with the node port.
func frontends(ps *model.PortState) []netip.AddrPort {
	if ps == nil {
		return nil
	}
	out := []netip.AddrPort{netip.AddrPortFrom(ps.ClusterIP, ps.Port)}
	for _, a := range ps.ExternalIPs {
		out = append(out, netip.AddrPortFrom(a, ps.Port))
	}
	for _, a := range ps.LoadBalancerVIPs {
		out = append(out, netip.AddrPortFrom(a, ps.Port))
	}
	if ps.NodePort != 0 {
		out = append(out, netip.AddrPortFrom(netip.Addr{}, ps.NodePort))
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return slices.Compact(out)
}

// keepUnflushed remembers, for the ports a failed sync changed, their state
// before the first failed sync, for clearStaleFlows.
func (p *Proxier) keepUnflushed(changed []model.ServicePortName) {
	if p.cfg.Conntrack == nil {
		return
	}
	if p.unflushed == nil {
		p.unflushed = map[model.ServicePortName]*model.PortState{}
	}
	for _, name := range changed {
		if name.Protocol == v1.ProtocolTCP {
			continue // staleFlows has nothing to clear for TCP
		}
		if _, ok := p.unflushed[name]; !ok {
			p.unflushed[name] = p.state.Previous[name]
		}
	}
	// A port that did not exist before the failures and is gone again has no
	// flows to clear (staleFlows(nil, nil)): forgetting it bounds the map by the
	// ports that exist or existed before the failures, not by the churn since.
	for name, old := range p.unflushed {
		if old == nil && p.state.Ports[name] == nil {
			delete(p.unflushed, name)
		}
	}
}

// clearStaleFlows deletes the stale flows of the ports a sync changed, and of
// those earlier failed syncs changed (from their state before). Failures are
// logged: a stale UDP flow is a degraded service, not a reason to fail the sync.
func (p *Proxier) clearStaleFlows(changed []model.ServicePortName) {
	if p.cfg.Conntrack == nil {
		return
	}
	var filters []conntrack.Filter
	for _, name := range changed {
		old, failed := p.unflushed[name]
		if !failed {
			old = p.state.Previous[name]
		}
		delete(p.unflushed, name)
		filters = append(filters, staleFlows(old, p.state.Ports[name])...)
	}
	for name, old := range p.unflushed {
		filters = append(filters, staleFlows(old, p.state.Ports[name])...)
	}
	p.unflushed = nil
	if len(filters) == 0 {
		return
	}
	start := time.Now()
	n, err := p.cfg.Conntrack.Clear(p.cfg.Family, filters...)
	if o, ok := p.cfg.Observer.(ConntrackObserver); ok {
		o.ConntrackCleared(p.cfg.Family, time.Since(start), n)
	}
	if err != nil {
		klog.ErrorS(err, "Clearing stale conntrack entries", "ipFamily", p.cfg.Family.Name, "filters", len(filters))
		return
	}
	klog.V(2).InfoS("Cleared stale conntrack entries", "ipFamily", p.cfg.Family.Name, "entries", n, "filters", len(filters))
}
