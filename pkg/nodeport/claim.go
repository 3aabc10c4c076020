package nodeport

import (
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// skip says why one port of a Service claims nothing.
type skip struct{ field, reason string }

// claimOf returns what svc claims, or nil when it claims no NodePort. Only NodePort
// and LoadBalancer Services claim; ports with an unsupported protocol or a nodePort
// outside 1-65535 are skipped and reported, except nodePort 0 on a LoadBalancer with
// allocateLoadBalancerNodePorts false, which is the API's way of saying "none".
func claimOf(svc *v1.Service) (*claim, []skip) {
	if svc.Spec.Type != v1.ServiceTypeNodePort && svc.Spec.Type != v1.ServiceTypeLoadBalancer {
		return nil, nil
	}
	unallocated := svc.Spec.Type == v1.ServiceTypeLoadBalancer &&
		svc.Spec.AllocateLoadBalancerNodePorts != nil && !*svc.Spec.AllocateLoadBalancerNodePorts
	var keys []Key
	var skips []skip
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		proto := p.Protocol
		if proto == "" {
			proto = v1.ProtocolTCP // the API default
		}
		switch {
		case p.NodePort == 0 && unallocated:
		case proto != v1.ProtocolTCP && proto != v1.ProtocolUDP && proto != v1.ProtocolSCTP:
			skips = append(skips, skip{fmt.Sprintf("spec.ports[%d].protocol", i), fmt.Sprintf("unsupported protocol %q", p.Protocol)})
		case p.NodePort <= 0 || p.NodePort > 65535:
			skips = append(skips, skip{fmt.Sprintf("spec.ports[%d].nodePort", i), fmt.Sprintf("%d is out of range 1-65535", p.NodePort)})
		default:
			keys = append(keys, Key{Protocol: proto, Port: uint16(p.NodePort)})
		}
	}
	if len(keys) == 0 {
		return nil, skips
	}
	slices.SortFunc(keys, Key.Compare)
	return &claim{
		name:     types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name},
		created:  svc.CreationTimestamp.Time,
		families: familiesOf(svc),
		keys:     slices.Compact(keys),
	}, skips
}

// familiesOf returns the families svc serves, in family.All order: those named in
// spec.ipFamilies, or when it names none, those of spec.clusterIPs (spec.clusterIP
// when clusterIPs is empty). Unknown names and unparsable addresses are ignored; the
// result is empty when nothing is known.
func familiesOf(svc *v1.Service) []*family.Family {
	var out []*family.Family
	for _, f := range family.All {
		if slices.Contains(svc.Spec.IPFamilies, f.IPFamily) {
			out = append(out, f)
		}
	}
	if len(out) > 0 {
		return out
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 {
		ips = []string{svc.Spec.ClusterIP}
	}
	for _, f := range family.All {
		if slices.ContainsFunc(ips, func(s string) bool { _, ok := f.ParseAddr(s); return ok }) {
			out = append(out, f)
		}
	}
	return out
}
