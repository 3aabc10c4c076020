package watch

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

func TestStripForProxy(t *testing.T) {
	managed := []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply,
		FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{"f:ports":{}}}`)}}}
	for _, tc := range []struct {
		name     string
		in, want any
	}{{
		name: "Service: managedFields and last-applied go, other annotations and the spec stay",
		in: &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", ManagedFields: managed,
			Annotations: map[string]string{LastAppliedAnnotation: `{"big":"json"}`, "keep": "me"}},
			Spec: v1.ServiceSpec{ClusterIP: "10.96.0.10"}},
		want: &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", Annotations: map[string]string{"keep": "me"}},
			Spec: v1.ServiceSpec{ClusterIP: "10.96.0.10"}},
	}, {
		name: "EndpointSlice: the trigger-time annotation stays",
		in: &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "e", ManagedFields: managed,
			Annotations: map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-25T00:00:00Z"}},
			AddressType: discovery.AddressTypeIPv6, Endpoints: []discovery.Endpoint{{Addresses: []string{"fd00::1"}}}},
		want: &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "e",
			Annotations: map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-25T00:00:00Z"}},
			AddressType: discovery.AddressTypeIPv6, Endpoints: []discovery.Endpoint{{Addresses: []string{"fd00::1"}}}},
	}, {
		name: "only last-applied: no empty annotation map left behind",
		in:   &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{LastAppliedAnnotation: "{}"}}},
		want: &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}},
	}, {
		name: "not an object: passed through",
		in:   cache.DeletedFinalStateUnknown{Key: "ns/x"},
		want: cache.DeletedFinalStateUnknown{Key: "ns/x"},
	}, {
		name: "nil passes through",
		in:   nil,
		want: nil,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := StripForProxy(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}
