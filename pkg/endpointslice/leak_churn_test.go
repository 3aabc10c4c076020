package endpointslice

import (
	"fmt"
	"testing"

	discovery "k8s.io/api/discovery/v1"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
)

// TestLeakChurnSliceCache: slices that come, change, move to another Service
// or become unusable, then go, leave the cache empty.
func TestLeakChurnSliceCache(t *testing.T) {
	f := family.IPv4
	c := NewCache(f)
	m := model.EndpointsMap{}
	for round := 0; round < 3; round++ {
		var objs []*discovery.EndpointSlice
		for i := 0; i < 50; i++ {
			es := slice(f, fmt.Sprintf("s%d-%d", round, i), 80, 1+i%9)
			es.Labels[discovery.LabelServiceName] = fmt.Sprintf("svc%d", i%10)
			c.Update(Ingest(es, "node-a"))
			objs = append(objs, es)
		}
		c.Checkout(m, false)
		for i, es := range objs {
			if i%3 == 0 { // move to another Service
				es.Labels[discovery.LabelServiceName] = fmt.Sprintf("other%d", i)
				c.Update(Ingest(es, "node-a"))
			}
			if i%5 == 0 { // becomes unusable
				bad := es.DeepCopy()
				bad.AddressType = "FQDN"
				c.Update(Ingest(bad, "node-a"))
			}
		}
		c.Checkout(m, round == 1)
		for _, es := range objs {
			c.Delete(Ingest(es, "node-a"))
		}
		c.Checkout(m, false)
		if len(c.byService) != 0 || len(c.owner) != 0 || len(c.dirty) != 0 || len(m) != 0 {
			t.Errorf("round %d: byService=%d owner=%d dirty=%d map=%d", round, len(c.byService), len(c.owner), len(c.dirty), len(m))
		}
	}
}
