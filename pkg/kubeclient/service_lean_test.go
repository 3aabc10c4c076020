package kubeclient_test

import (
	"reflect"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/randfill"

	"github.com/dsproxy/dsproxy/pkg/kubeclient"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/watch"
)

// serviceFiller fills every field of a Service (so that a field the lean decoder
// drops but CompactService reads would show), the proxy's labels and the
// streamed list's end marker among the labels and annotations now and then.
func serviceFiller(seed int64) *randfill.Filler {
	return randfill.NewWithSeed(seed).NilChance(0.2).NumElements(0, 3).Funcs(
		func(s *v1.Service, c randfill.Continue) {
			c.FillNoCustom(s)
			for _, l := range []string{model.LabelServiceProxyName, model.LabelHeadless} {
				if c.Intn(4) == 0 {
					if s.Labels == nil {
						s.Labels = map[string]string{}
					}
					s.Labels[l] = c.String(3)
				}
			}
			if c.Intn(4) == 0 {
				if s.Annotations == nil {
					s.Annotations = map[string]string{}
				}
				s.Annotations["k8s.io/initial-events-end"] = "true"
			}
			if c.Intn(3) == 0 {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, NodePort: 30080})
			}
		},
	)
}

// randomService is the encoding of the Service serviceFiller(seed) fills.
func randomService(t testing.TB, seed int64) []byte {
	t.Helper()
	svc := &v1.Service{}
	serviceFiller(seed).Fill(svc)
	b, err := svc.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDecodeService: for Services with every field filled at random, CompactService
// cannot tell the lean decoder's result from the generated decoder's, and their
// expansions (what the handlers read) are equal.
func TestDecodeService(t *testing.T) {
	for seed := range int64(2000) {
		b := randomService(t, seed)
		full := &v1.Service{}
		if err := full.Unmarshal(b); err != nil {
			t.Fatal(err)
		}
		lean, err := kubeclient.DecodeService(b)
		if err != nil {
			t.Fatalf("seed %d: lean decoder fails where the generated one decodes: %v", seed, err)
		}
		got, want := watch.CompactService(lean), watch.CompactService(full)
		if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(got.Expand(), want.Expand()) {
			t.Fatalf("seed %d: CompactService of the lean decoding\n%#v\nof the generated one\n%#v", seed, got.Expand(), want.Expand())
		}
		if full.Annotations["k8s.io/initial-events-end"] != lean.Annotations["k8s.io/initial-events-end"] {
			t.Fatalf("seed %d: annotations %v, want the end marker of %v", seed, lean.Annotations, full.Annotations)
		}
		// The lean decoder may refuse what the generated one accepts, never
		// panic on a prefix.
		for i := range b {
			if _, err := kubeclient.DecodeService(b[:i]); err == nil && full.Unmarshal(b[:i]) != nil {
				t.Fatalf("seed %d: a %d-byte prefix the generated decoder refuses is accepted", seed, i)
			}
		}
	}
	if s, err := kubeclient.DecodeService(nil); err != nil || !reflect.DeepEqual(s, &v1.Service{}) {
		t.Errorf("empty: %#v, %v", s, err)
	}
}

// FuzzDecodeService: arbitrary bytes never panic the lean Service decoder, and
// whenever both decoders accept them CompactService cannot tell them apart.
func FuzzDecodeService(f *testing.F) {
	for seed := range int64(20) {
		f.Add(randomService(f, seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		lean, err := kubeclient.DecodeService(b)
		full := &v1.Service{}
		if err != nil || full.Unmarshal(b) != nil {
			return
		}
		if got, want := watch.CompactService(lean), watch.CompactService(full); !reflect.DeepEqual(got, want) {
			t.Fatalf("CompactService of the lean decoding\n%#v\nof the generated one\n%#v", got.Expand(), want.Expand())
		}
	})
}

var serviceSink *v1.Service

// BenchmarkDecodeService: one Service's decoding and CompactService, by the
// generated code and by the lean decoder, for a dual-stack NodePort Service as the
// API server returns bench/e2e's (allocated ClusterIPs and NodePort, defaults
// filled in, one managedFields entry), and the same as kubectl apply leaves it.
func BenchmarkDecodeService(b *testing.B) {
	ts := metav1.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "svc-1234", Namespace: "bench", UID: "0b6f4c5e-8a51-4a52-9d0e-6c3f0e3c1f10",
			ResourceVersion: "123456", CreationTimestamp: ts,
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "e2e.test", Operation: metav1.ManagedFieldsOperationUpdate,
				APIVersion: "v1", Time: &ts, FieldsType: "FieldsV1",
				FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{"f:internalTrafficPolicy":{},"f:ipFamilyPolicy":{},"f:ports":{".":{},"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},"f:name":{},"f:port":{},"f:protocol":{},"f:targetPort":{}}},"f:sessionAffinity":{},"f:type":{}}}`)}}}},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeNodePort, ClusterIP: "10.96.12.34", ClusterIPs: []string{"10.96.12.34", "fd00:96::1234"},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}, IPFamilyPolicy: ptr.To(v1.IPFamilyPolicyRequireDualStack),
			Ports:                 []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: 31234}},
			SessionAffinity:       v1.ServiceAffinityNone,
			ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyCluster, InternalTrafficPolicy: ptr.To(v1.ServiceInternalTrafficPolicyCluster)},
	}
	// As kubectl apply leaves a Service with a selector: the last applied
	// configuration in an annotation, a second field manager, labels.
	applied := svc.DeepCopy()
	applied.Labels = map[string]string{"app.kubernetes.io/name": "web", "app.kubernetes.io/part-of": "shop"}
	applied.Spec.Selector = map[string]string{"app.kubernetes.io/name": "web"}
	applied.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"apiVersion":"v1","kind":"Service","metadata":{"annotations":{},"labels":{"app.kubernetes.io/name":"web","app.kubernetes.io/part-of":"shop"},"name":"svc-1234","namespace":"bench"},"spec":{"ipFamilyPolicy":"RequireDualStack","ports":[{"name":"http","port":80,"protocol":"TCP","targetPort":8080}],"selector":{"app.kubernetes.io/name":"web"},"type":"NodePort"}}` + "\n"}
	applied.ManagedFields = append(applied.ManagedFields, metav1.ManagedFieldsEntry{Manager: "kubectl-client-side-apply",
		Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &ts, FieldsType: "FieldsV1",
		FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:annotations":{".":{},"f:kubectl.kubernetes.io/last-applied-configuration":{}},"f:labels":{".":{},"f:app.kubernetes.io/name":{},"f:app.kubernetes.io/part-of":{}}},"f:spec":{"f:selector":{}}}`)}})
	for _, c := range []struct {
		name string
		svc  *v1.Service
	}{{"load", svc}, {"applied", applied}} {
		data, err := c.svc.Marshal()
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name+"/generated", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				s := &v1.Service{}
				if err := s.Unmarshal(data); err != nil {
					b.Fatal(err)
				}
				watch.CompactService(s)
				serviceSink = s // on the heap, as the API client's decoder makes it
			}
		})
		b.Run(c.name+"/lean", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				s, err := kubeclient.DecodeService(data)
				if err != nil {
					b.Fatal(err)
				}
				watch.CompactService(s)
			}
		})
	}
}
