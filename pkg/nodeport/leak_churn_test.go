package nodeport

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// TestLeakChurnRegistry: Services with NodePorts (some conflicting) come, change
// type and go; the registry ends empty each round.
func TestLeakChurnRegistry(t *testing.T) {
	r := New(klog.Background())
	for round := 0; round < 3; round++ {
		var svcs []*v1.Service
		for i := 0; i < 40; i++ {
			s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("s%d-%d", round, i), CreationTimestamp: metav1.NewTime(time.Unix(int64(i), 0))},
				Spec: v1.ServiceSpec{Type: v1.ServiceTypeNodePort, IPFamilies: []v1.IPFamily{[]v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}[i%2]},
					Ports: []v1.ServicePort{{Port: 80, NodePort: int32(30000 + i%25)}}}} // conflicts
			r.Update(s)
			svcs = append(svcs, s)
		}
		for _, s := range svcs {
			c := s.DeepCopy()
			c.Spec.Type = v1.ServiceTypeClusterIP
			r.Update(c)
			r.Update(s)
		}
		for _, s := range svcs {
			r.Delete(s)
		}
		if len(r.services) != 0 || len(r.keys) != 0 || len(r.reserved[nil]) != 0 {
			t.Errorf("round %d: services %d keys %d", round, len(r.services), len(r.keys))
		}
		for f, set := range r.reserved {
			if len(set) != 0 {
				t.Errorf("round %d: %s reserved %d", round, f, len(set))
			}
		}
	}
}
