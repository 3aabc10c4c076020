package endpointslice

import (
	"encoding/json"
	"slices"
	"testing"

	discovery "k8s.io/api/discovery/v1"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
)

// FuzzIngest feeds arbitrary EndpointSlices (decoded from JSON, as a hostile API
// server could send them) through both families' caches and checks the invariants
// every sync relies on.
func FuzzIngest(f *testing.F) {
	for _, fam := range family.All {
		b, _ := json.Marshal(slice(fam, "a", 80, 1, 2, 3))
		f.Add(b, uint8(0))
	}
	f.Add([]byte(`{"metadata":{"name":"x","namespace":"n","labels":{"kubernetes.io/service-name":"s"}},"addressType":"IPv6","endpoints":[{"addresses":["::ffff:1.2.3.4"]},{"addresses":["1.2.3.4"]},{"addresses":[]}],"ports":[{"name":"","port":0},{"port":65536},{"name":"a","port":1,"protocol":"SCTP"}]}`), uint8(1))
	f.Add([]byte(`{"metadata":{"name":"x","namespace":"n","labels":{"kubernetes.io/service-name":"s"}},"addressType":"IPv4","endpoints":[{"addresses":["010.1.2.3"]},{"addresses":["10.1.2.3"],"conditions":{"ready":false,"serving":true,"terminating":true}}],"ports":[{"name":"a","port":5}]}`), uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, op uint8) {
		var es discovery.EndpointSlice
		if json.Unmarshal(data, &es) != nil {
			return
		}
		for _, fam := range family.All {
			c := NewCache(fam)
			m := model.EndpointsMap{}
			c.Update(Ingest(&es, "node-a"))
			if op&1 == 1 {
				c.Delete(Ingest(&es, "node-a"))
			}
			c.Checkout(m, false)
			checkEndpointsMap(t, fam, m)
			full := model.EndpointsMap{}
			c.Checkout(full, true)
			if len(full) != len(m) {
				t.Fatalf("full checkout has %d ports, incremental %d", len(full), len(m))
			}
		}
	})
}

func checkEndpointsMap(t *testing.T, fam *family.Family, m model.EndpointsMap) {
	t.Helper()
	for name, eps := range m {
		if len(eps) == 0 {
			t.Fatalf("%s: empty endpoint list kept", name)
		}
		if !slices.IsSortedFunc(eps, model.CompareEndpoints) {
			t.Fatalf("%s: endpoints not sorted", name)
		}
		for i, e := range eps {
			if !fam.Contains(e.Addr) || e.Addr.Is4In6() || e.Addr.Zone() != "" {
				t.Fatalf("%s: address %v is not a plain %s address", name, e.Addr, fam)
			}
			if e.Port == 0 {
				t.Fatalf("%s: port 0", name)
			}
			if i > 0 && eps[i-1].AddrPort() == e.AddrPort() {
				t.Fatalf("%s: duplicate %s", name, e.AddrPort())
			}
		}
	}
}
