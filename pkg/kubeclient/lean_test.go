package kubeclient

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/randfill"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/dsproxy/dsproxy/pkg/endpointslice"
	"github.com/dsproxy/dsproxy/pkg/model"
)

// project is es as decodeEndpointSlice keeps it: the fields its doc comment lists.
func project(es *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	p := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: es.Name, Namespace: es.Namespace, ResourceVersion: es.ResourceVersion},
		AddressType: es.AddressType,
	}
	keep := func(m map[string]string, keys []string) map[string]string {
		var out map[string]string
		for _, k := range keys {
			if v, ok := m[k]; ok {
				if out == nil {
					out = map[string]string{}
				}
				out[k] = v
			}
		}
		return out
	}
	p.Labels = keep(es.Labels, sliceMeta.labels)
	p.Annotations = keep(es.Annotations, sliceMeta.annotations)
	for _, pt := range es.Ports {
		p.Ports = append(p.Ports, discoveryv1.EndpointPort{Name: pt.Name, Protocol: pt.Protocol, Port: pt.Port})
	}
	p.Endpoints = make([]discoveryv1.Endpoint, 0, len(es.Endpoints))
	for _, e := range es.Endpoints {
		var hints *discoveryv1.EndpointHints
		if e.Hints != nil {
			hints = &discoveryv1.EndpointHints{ForZones: e.Hints.ForZones, ForNodes: e.Hints.ForNodes}
		}
		p.Endpoints = append(p.Endpoints, discoveryv1.Endpoint{Addresses: e.Addresses, Conditions: e.Conditions, NodeName: e.NodeName, Hints: hints})
	}
	return p
}

// sliceFiller fills every field of an EndpointSlice (so that a field the lean
// decoder drops but Ingest reads would show), with the fields Ingest reads drawn
// from values that make it take each of its paths.
func sliceFiller(seed int64) *randfill.Filler {
	pick := func(c randfill.Continue, vals ...string) string { return vals[c.Intn(len(vals))] }
	return randfill.NewWithSeed(seed).NilChance(0.2).NumElements(0, 4).Funcs(
		func(es *discoveryv1.EndpointSlice, c randfill.Continue) {
			c.FillNoCustom(es)
			es.AddressType = discoveryv1.AddressType(pick(c, "IPv4", "IPv6", "IPv6", "IPv4", "FQDN", "bogus"))
			if c.Intn(5) > 0 {
				if es.Labels == nil {
					es.Labels = map[string]string{}
				}
				es.Labels[discoveryv1.LabelServiceName] = pick(c, "web", "db", "")
			}
			for _, l := range []string{model.LabelServiceProxyName, model.LabelHeadless} {
				if c.Intn(8) == 0 && es.Labels != nil {
					es.Labels[l] = c.String(3)
				}
			}
			if c.Intn(2) == 0 {
				if es.Annotations == nil {
					es.Annotations = map[string]string{}
				}
				es.Annotations[v1.EndpointsLastChangeTriggerTime] = pick(c, "2026-11-25T10:00:00.123456789Z", "junk", "")
			}
			if c.Intn(10) == 0 && es.Annotations != nil {
				es.Annotations[metav1.InitialEventsAnnotationKey] = "true"
			}
		},
		func(ep *discoveryv1.Endpoint, c randfill.Continue) {
			c.FillNoCustom(ep)
			for i := range ep.Addresses {
				ep.Addresses[i] = pick(c, "10.0.0.1", "10.0.0.2", "fd00::1", "fd00::2", "::ffff:10.0.0.3", "010.0.0.1", "fe80::1%eth0", c.String(5))
			}
			if ep.NodeName != nil && c.Intn(2) == 0 {
				ep.NodeName = ptr.To("node-a")
			}
		},
		func(p *discoveryv1.EndpointPort, c randfill.Continue) {
			c.FillNoCustom(p)
			if p.Port != nil && c.Intn(4) > 0 {
				*p.Port = int32(c.Intn(70000)) - 100
			}
			if p.Protocol != nil {
				*p.Protocol = v1.Protocol(pick(c, "TCP", "UDP", "SCTP", "ICMP"))
			}
		},
	)
}

func marshal(t testing.TB, es *discoveryv1.EndpointSlice) []byte {
	t.Helper()
	b, err := es.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkLean decodes b with the generated code and the lean decoder and compares: the
// lean object is the projection of the generated one, and Ingest makes the same
// Object of both on a node named in the slices and on an unnamed one. Unless
// strict, the lean decoder may refuse what the generated code accepts (the client
// then falls back to the generated code: see TestLeanDecoder).
func checkLean(t *testing.T, b []byte, strict bool) {
	t.Helper()
	full := &discoveryv1.EndpointSlice{}
	fullErr := full.Unmarshal(b)
	lean, err := decodeEndpointSlice(b)
	switch {
	case fullErr != nil:
		return
	case err != nil && strict:
		t.Fatalf("lean decoder fails where the generated one decodes: %v", err)
	case err != nil:
		return
	}
	if want := project(full); !reflect.DeepEqual(lean, want) {
		t.Fatalf("lean decoding\n%#v\nwant the projection of the generated one\n%#v", lean, want)
	}
	for _, node := range []string{"node-a", ""} {
		if got, want := endpointslice.Ingest(lean, node), endpointslice.Ingest(full, node); !reflect.DeepEqual(got, want) {
			t.Fatalf("node %q: Ingest of the lean decoding\n%#v\nof the generated one\n%#v", node, got, want)
		}
	}
}

// TestDecodeEndpointSlice: for EndpointSlices with every field filled at random,
// the lean decoder keeps exactly the fields it names, and Ingest cannot tell its
// result from the generated decoder's.
func TestDecodeEndpointSlice(t *testing.T) {
	for seed := range int64(2000) {
		es := &discoveryv1.EndpointSlice{}
		sliceFiller(seed).Fill(es)
		checkLean(t, marshal(t, es), true)
		if t.Failed() {
			t.Fatalf("seed %d", seed)
		}
	}
}

// TestDecodeEndpointSliceMalformed: truncations and wrong wire types of an encoded
// slice are errors, never a panic; a kept field of the wrong wire type is refused.
func TestDecodeEndpointSliceMalformed(t *testing.T) {
	es := &discoveryv1.EndpointSlice{}
	sliceFiller(1).NilChance(0).NumElements(2, 2).Fill(es)
	b := marshal(t, es)
	for i := range b {
		// A cut between two fields is a shorter, valid slice: both decoders
		// must agree on it; any other cut is an error of both.
		checkLean(t, b[:i], true)
	}
	// addressType (4) as a varint.
	if _, err := decodeEndpointSlice(protowire.AppendVarint(protowire.AppendTag(nil, 4, protowire.VarintType), 1)); err == nil {
		t.Error("addressType as a varint: no error")
	}
	// A port whose port (3) is length-delimited.
	port := protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), []byte("80"))
	if _, err := decodeEndpointSlice(protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), port)); err == nil ||
		!strings.Contains(err.Error(), "ports[0]") {
		t.Errorf("port as bytes: error %v, want one naming ports[0]", err)
	}
}

// FuzzDecodeEndpointSlice: arbitrary bytes never panic the lean decoder, and
// whenever both decoders accept them they agree (checkLean); what only the
// generated code accepts (an out-of-range field number, which it truncates) is
// decoded by it (TestLeanDecoder).
func FuzzDecodeEndpointSlice(f *testing.F) {
	for seed := range int64(20) {
		es := &discoveryv1.EndpointSlice{}
		sliceFiller(seed).Fill(es)
		f.Add(marshal(f, es))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkLean(t, b, false)
	})
}

// encode is obj in the API server's protobuf encoding.
func encode(t testing.TB, obj runtime.Object) []byte {
	t.Helper()
	info, _ := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), protobuf)
	gvks, _, err := scheme.ObjectKinds(obj)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := codecs.EncoderForVersion(info.Serializer, gvks[0].GroupVersion()).Encode(obj, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestLeanDecoder: through the client's negotiated protobuf decoder, an
// EndpointSlice and a Service come out lean and every other kind (lists, Nodes,
// Status) whole; what the lean decoder refuses is the generated code's to decode.
func TestLeanDecoder(t *testing.T) {
	info, ok := runtime.SerializerInfoForMediaType(newLeanNegotiator(codecs.WithoutConversion()).SupportedMediaTypes(), protobuf)
	if !ok {
		t.Fatal("no protobuf serializer")
	}
	dec := newLeanNegotiator(codecs.WithoutConversion()).DecoderToVersion(info.Serializer, discoveryv1.SchemeGroupVersion)
	es := &discoveryv1.EndpointSlice{}
	sliceFiller(7).NilChance(0).NumElements(2, 2).Fill(es)
	es.TypeMeta = metav1.TypeMeta{} // not on the wire inside a list
	es.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager"}}
	got, err := runtime.Decode(dec, encode(t, es))
	if err != nil {
		t.Fatal(err)
	}
	if want := project(es); !reflect.DeepEqual(got, want) {
		t.Errorf("EndpointSlice decoded as\n%#v\nwant\n%#v", got, want)
	}
	for _, obj := range []runtime.Object{
		&discoveryv1.EndpointSliceList{Items: []discoveryv1.EndpointSlice{*es}},
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", ManagedFields: es.ManagedFields}, Spec: v1.NodeSpec{PodCIDRs: []string{"10.64.0.0/24"}}},
		&metav1.Status{Status: metav1.StatusFailure, Message: "too old", Code: 410},
	} {
		got, err := runtime.Decode(dec, encode(t, obj))
		if err != nil {
			t.Fatalf("%T: %v", obj, err)
		}
		if !reflect.DeepEqual(got, obj) {
			t.Errorf("%T decoded as\n%#v\nwant it whole\n%#v", obj, got, obj)
		}
	}
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", ManagedFields: es.ManagedFields}, Spec: v1.ServiceSpec{ClusterIP: "10.96.0.1"}}
	if got, err := runtime.Decode(dec, encode(t, svc)); err != nil {
		t.Errorf("Service: %v", err)
	} else if s, ok := got.(*v1.Service); !ok || s.Name != "web" || s.Spec.ClusterIP != "10.96.0.1" || s.ManagedFields != nil {
		t.Errorf("Service decoded as %#v, want it lean", got)
	}
	// What the lean decoder refuses goes to the generated code: an error where it
	// fails too (an endpoint longer than what is left), the whole object where it
	// decodes (a field number beyond protobuf's range, which it truncates).
	for _, c := range []struct {
		raw  []byte
		want runtime.Object
	}{
		{raw: []byte{0x12, 0x05, 0x0a}},
		{raw: append([]byte{0xc8, 0xb3, 0xe6, 0x86, 0x8f, 0x30, 0x30}, marshal(t, es)...),
			want: func() runtime.Object { c := es.DeepCopy(); c.TypeMeta = metav1.TypeMeta{}; return c }()},
	} {
		unk := runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}, Raw: c.raw}
		data, err := unk.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		got, err := runtime.Decode(dec, append(protobufMagic, data...))
		if (err == nil) != (c.want != nil) || (c.want != nil && !reflect.DeepEqual(got, c.want)) {
			t.Errorf("raw %x: %#v, %v; want %#v", c.raw, got, err, c.want)
		}
	}
}

// TestWatchLean: a watch of EndpointSlices in protobuf gets lean slices, a
// bookmark that keeps the streamed list's end marker, and an ERROR's Status.
func TestWatchLean(t *testing.T) {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1", ResourceVersion: "5",
			Labels:        map[string]string{discoveryv1.LabelServiceName: "web", "app": "web"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager"}}},
		AddressType: discoveryv1.AddressTypeIPv6,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"fd00:64::1"}, Zone: ptr.To("a"),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}}},
	}
	bookmark := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "6",
		Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
	status := &metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonExpired}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/apis/discovery.k8s.io/v1/endpointslices" || r.URL.Query().Get("watch") != "true" {
			http.NotFound(w, r)
			return
		}
		info, _ := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), protobuf)
		w.Header().Set("Content-Type", protobuf+";stream=watch")
		enc := streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(w), info.StreamSerializer.Serializer)
		for _, ev := range []struct {
			typ watch.EventType
			obj runtime.Object
		}{{watch.Added, es}, {watch.Bookmark, bookmark}, {watch.Error, status}} {
			if err := enc.Encode(&metav1.WatchEvent{Type: string(ev.typ), Object: runtime.RawExtension{Raw: encode(t, ev.obj)}}); err != nil {
				t.Error(err)
			}
		}
	}))
	defer ts.Close()
	c, err := New(&rest.Config{Host: ts.URL})
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.ListWatch(EndpointSlices, nil).(cache.ListerWatcherWithContext).WatchWithContext(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	want := []watch.Event{{Type: watch.Added, Object: project(es)}, {Type: watch.Bookmark, Object: project(bookmark)}, {Type: watch.Error, Object: status}}
	for i, wantEv := range want {
		select {
		case ev := <-w.ResultChan():
			if !reflect.DeepEqual(ev, wantEv) {
				t.Errorf("event %d:\n%#v\nwant\n%#v", i, ev, wantEv)
			}
			if m, ok := ev.Object.(metav1.Object); ok && ev.Type == watch.Bookmark && m.GetAnnotations()[metav1.InitialEventsAnnotationKey] != "true" {
				t.Errorf("bookmark lost %s: %#v", metav1.InitialEventsAnnotationKey, ev.Object)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("event %d: none", i)
		}
	}
}

// benchSlice is an EndpointSlice of 10 endpoints as the API server sends it: as
// bench/e2e's load creates them (controller false), or as the EndpointSlice
// controller writes them, with owner, trigger time and each endpoint's targetRef
// and zone.
func benchSlice(controller bool) *discoveryv1.EndpointSlice {
	ts := metav1.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "svc-1234-ipv4", Namespace: "bench", UID: "0b6f4c5e-8a51-4a52-9d0e-6c3f0e3c1f10",
			ResourceVersion: "123456", Generation: 1, CreationTimestamp: ts,
			Labels: map[string]string{discoveryv1.LabelServiceName: "svc-1234", discoveryv1.LabelManagedBy: "bench"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "e2e.test", Operation: metav1.ManagedFieldsOperationUpdate,
				APIVersion: "discovery.k8s.io/v1", Time: &ts, FieldsType: "FieldsV1",
				FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:addressType":{},"f:endpoints":{},"f:metadata":{"f:labels":{".":{},"f:endpointslice.kubernetes.io/managed-by":{},"f:kubernetes.io/service-name":{}}},"f:ports":{}}`)}}}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	if controller {
		es.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-11-25T10:00:00Z"}
		es.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "svc-1234",
			UID: "5a1d8c1e-2b3c-4d5e-8f90-a1b2c3d4e5f6", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	}
	for j := range 10 {
		ep := discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.64.%d.%d", j, j+1)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(fmt.Sprintf("node-%d", j))}
		if controller {
			ep.Zone = ptr.To("zone-a")
			ep.TargetRef = &v1.ObjectReference{Kind: "Pod", Namespace: "bench", Name: fmt.Sprintf("web-7d4b9c8f6d-%05d", j),
				UID: types.UID(fmt.Sprintf("0b6f4c5e-8a51-4a52-9d0e-6c3f0e3c%04d", j))}
		}
		es.Endpoints = append(es.Endpoints, ep)
	}
	return es
}

var sliceSink *discoveryv1.EndpointSlice

// BenchmarkDecodeEndpointSlice: one slice's decoding and Ingest, by the generated
// code and by the lean decoder, for the bench's slices and the controller's.
func BenchmarkDecodeEndpointSlice(b *testing.B) {
	for _, controller := range []bool{false, true} {
		name := "load"
		if controller {
			name = "controller"
		}
		data := marshal(b, benchSlice(controller))
		b.Run(name+"/generated", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				es := &discoveryv1.EndpointSlice{}
				if err := es.Unmarshal(data); err != nil {
					b.Fatal(err)
				}
				endpointslice.Ingest(es, "node-1")
				sliceSink = es // on the heap, as the API client's decoder makes it
			}
		})
		b.Run(name+"/lean", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				es, err := decodeEndpointSlice(data)
				if err != nil {
					b.Fatal(err)
				}
				endpointslice.Ingest(es, "node-1")
			}
		})
	}
}
