package model

import (
	"encoding/json"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// FuzzServicePorts feeds arbitrary Services through both families and checks that
// every port produced is well-formed and of the family.
func FuzzServicePorts(f *testing.F) {
	for _, fam := range family.All {
		b, _ := json.Marshal(svcFor(fam, dualStack))
		f.Add(b)
	}
	f.Add([]byte(`{"metadata":{"name":"a"},"spec":{"type":"LoadBalancer","clusterIPs":["::ffff:1.2.3.4","1.2.3.4"],"externalIPs":["1.2.3.4","zz"],"loadBalancerSourceRanges":["0.0.0.0/0","::/0","1.2.3.4/40"],"sessionAffinity":"ClientIP","sessionAffinityConfig":{"clientIP":{"timeoutSeconds":-5}},"ports":[{"port":80,"nodePort":99999},{"port":-1}]},"status":{"loadBalancer":{"ingress":[{"ip":"1.1.1.1","ipMode":"Proxy"},{"ip":"::1"}]}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var svc v1.Service
		if json.Unmarshal(data, &svc) != nil {
			return
		}
		for _, fam := range family.All {
			ports, _ := ServicePorts(fam, &svc)
			seen := map[ServicePortName]bool{}
			for _, sp := range ports {
				if seen[sp.Name] {
					t.Fatalf("duplicate port %s", sp.Name)
				}
				seen[sp.Name] = true
				if !fam.Contains(sp.ClusterIP) || sp.Port == 0 {
					t.Fatalf("bad port %s", sp)
				}
				for _, a := range append(append([]netip.Addr{}, sp.ExternalIPs...), sp.LoadBalancerVIPs...) {
					if !fam.Contains(a) {
						t.Fatalf("%s: address %s of the wrong family", sp, a)
					}
				}
				for _, p := range sp.SourceRanges {
					if !fam.ContainsPrefix(p) || p.Bits() == 0 || p != p.Masked() {
						t.Fatalf("%s: bad source range %s", sp, p)
					}
				}
				if sp.AffinitySeconds > maxAffinitySeconds {
					t.Fatalf("%s: affinity %d", sp, sp.AffinitySeconds)
				}
			}
		}
	})
}
