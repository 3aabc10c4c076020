package healthcheck

import (
	"net/netip"

	"k8s.io/apimachinery/pkg/types"

	"github.com/dsproxy/dsproxy/pkg/model"
)

// FromState computes SyncServices' and SyncEndpoints' arguments from desired
// states (each read on its own sync goroutine or otherwise without a concurrent
// sync): one family's for that family's SyncEndpoints.
//
// services maps each Service with a healthCheckNodePort (LoadBalancer,
// externalTrafficPolicy Local) to that port. endpoints maps each of those Services
// to its ready local endpoints, counted as kube-proxy's LocalReadyEndpoints does:
// distinct endpoint addresses over all the Service's ports, ready ones only
// (terminating endpoints still serve traffic, but the check fails when a node has
// only those). Given several families' states, a dual-stack Service counts the
// endpoints of all of them.
func FromState(states ...*model.State) (services map[types.NamespacedName]uint16, endpoints map[types.NamespacedName]int) {
	services = map[types.NamespacedName]uint16{}
	addrs := map[types.NamespacedName]map[netip.Addr]struct{}{}
	for _, st := range states {
		if st == nil {
			continue
		}
		for _, ps := range st.Ports {
			if ps.HealthCheckNodePort == 0 {
				continue
			}
			nsn := ps.Name.NamespacedName
			services[nsn] = ps.HealthCheckNodePort
			set := addrs[nsn]
			if set == nil {
				set = map[netip.Addr]struct{}{}
				addrs[nsn] = set
			}
			for _, list := range [][]model.Endpoint{ps.Local, ps.HealthLocal} {
				for i := range list {
					if ep := &list[i]; ep.Ready && ep.Local {
						set[ep.Addr] = struct{}{}
					}
				}
			}
		}
	}
	endpoints = make(map[types.NamespacedName]int, len(addrs))
	for nsn, set := range addrs {
		endpoints[nsn] = len(set)
	}
	return services, endpoints
}
