package watch

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networking "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/dsproxy/dsproxy/pkg/endpointslice"
	"github.com/dsproxy/dsproxy/pkg/family"
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

// The informers' transform turns an EndpointSlice into its ingested form for the
// node (local endpoints marked, the trigger time parsed, only the identity kept of
// the metadata), is idempotent on that form, and strips everything else.
func TestForProxy(t *testing.T) {
	tr := ForProxy("node-a")
	es := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-abc", ResourceVersion: "42", UID: "u-1",
			Labels:      map[string]string{discovery.LabelServiceName: "web", discovery.LabelManagedBy: "x"},
			Annotations: map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-11-25T01:02:03Z"}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080))}},
		Endpoints: []discovery.Endpoint{
			{Addresses: []string{"10.64.0.2"}, NodeName: ptr.To("node-b"), TargetRef: &v1.ObjectReference{Kind: "Pod", Name: "p2"}},
			{Addresses: []string{"10.64.0.1"}, NodeName: ptr.To("node-a")},
		},
	}
	got, err := tr(es)
	if err != nil {
		t.Fatal(err)
	}
	o, ok := got.(*endpointslice.Object)
	if !ok {
		t.Fatalf("transform gave %T, want *endpointslice.Object", got)
	}
	if o.Namespace != "ns" || o.Name != "web-abc" || o.ResourceVersion != "42" {
		t.Errorf("identity %s/%s@%s, want ns/web-abc@42", o.Namespace, o.Name, o.ResourceVersion)
	}
	if m, err := meta.Accessor(o); err != nil || m.GetName() != "web-abc" || m.GetNamespace() != "ns" || m.GetResourceVersion() != "42" || m.GetUID() != "" {
		t.Errorf("meta.Accessor: %v, %v", m, err)
	}
	if key, err := cache.MetaNamespaceKeyFunc(o); err != nil || key != "ns/web-abc" {
		t.Errorf("informer key %q (%v), want ns/web-abc", key, err)
	}
	// The object is its own accessor: computing a key allocates no ObjectMeta.
	if n := testing.AllocsPerRun(100, func() { _, _ = meta.Accessor(o) }); n != 0 {
		t.Errorf("meta.Accessor allocates %v times per call", n)
	}
	if o.Family != family.IPv4 || o.Err != nil || o.Slice == nil {
		t.Fatalf("family %v, err %v, slice %v", o.Family, o.Err, o.Slice)
	}
	if o.Slice.Service != (types.NamespacedName{Namespace: "ns", Name: "web"}) {
		t.Errorf("service %v", o.Slice.Service)
	}
	var eps []string
	for _, e := range o.Slice.Endpoints {
		eps = append(eps, fmt.Sprintf("%v local=%v", e.AddrPort(), e.Local))
	}
	if want := []string{"10.64.0.1:8080 local=true", "10.64.0.2:8080 local=false"}; !slices.Equal(eps, want) {
		t.Errorf("endpoints %q, want %q", eps, want)
	}
	if want := time.Date(2026, 11, 25, 1, 2, 3, 0, time.UTC); !o.Trigger.Equal(want) {
		t.Errorf("trigger %v, want %v", o.Trigger, want)
	}
	if again, _ := tr(o); again != o {
		t.Errorf("transforming the ingested form again gave %v", again)
	}
	if c, ok := o.DeepCopyObject().(*endpointslice.Object); !ok || c == o || c.Slice != o.Slice || c.Name != o.Name {
		t.Errorf("DeepCopyObject gave %#v", c)
	}

	// An FQDN slice is kept (so its deletion is seen) with the reason it is unusable.
	fqdn, _ := tr(&discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "f"}, AddressType: discovery.AddressTypeFQDN})
	if o := fqdn.(*endpointslice.Object); o.Family != nil || o.Err == nil || o.Name != "f" {
		t.Errorf("FQDN slice: %+v", o)
	}
	// A Service becomes its compact form, the same on a second pass.
	svc, _ := tr(&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", Annotations: map[string]string{LastAppliedAnnotation: "{}"}}})
	if s, ok := svc.(*Service); !ok || s.Name != "s" {
		t.Errorf("Service transformed into %#v", svc)
	} else if again, _ := tr(s); again != s {
		t.Errorf("transforming the compact Service again gave %v", again)
	}
	// Other objects are stripped as before.
	cidr, _ := tr(&networking.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "c", Annotations: map[string]string{LastAppliedAnnotation: "{}"}}})
	if c := cidr.(*networking.ServiceCIDR); c.Annotations != nil {
		t.Errorf("ServiceCIDR not stripped: %v", c.Annotations)
	}
}
