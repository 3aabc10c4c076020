package watch

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/dsproxy/dsproxy/internal/liststream"
	"github.com/dsproxy/dsproxy/pkg/endpointslice"
	"github.com/dsproxy/dsproxy/pkg/kubeclient"
)

// slowHandler records the Services and EndpointSlices it is given, taking delay
// over each slice, as a proxier busy with other work would.
type slowHandler struct {
	delay  time.Duration
	mu     sync.Mutex
	svcs   []string
	slices map[string]*endpointslice.Object
}

func (h *slowHandler) OnServiceAdd(s *v1.Service) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.svcs = append(h.svcs, s.Namespace+"/"+s.Name)
}
func (h *slowHandler) OnEndpointSliceAdd(o *endpointslice.Object) {
	time.Sleep(h.delay)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.slices[o.Name] = o
}
func (h *slowHandler) OnServiceUpdate(_, _ *v1.Service)                   {}
func (h *slowHandler) OnServiceDelete(*v1.Service)                        {}
func (h *slowHandler) OnEndpointSliceUpdate(_, _ *endpointslice.Object)   {}
func (h *slowHandler) OnEndpointSliceDelete(*endpointslice.Object)        {}
func (h *slowHandler) OnNodeAdd(*v1.Node)                                 {}
func (h *slowHandler) OnNodeUpdate(_, _ *v1.Node)                         {}
func (h *slowHandler) OnNodeDelete(*v1.Node)                              {}
func (h *slowHandler) OnServiceCIDRAdd(*networkingv1.ServiceCIDR)         {}
func (h *slowHandler) OnServiceCIDRUpdate(_, _ *networkingv1.ServiceCIDR) {}
func (h *slowHandler) OnServiceCIDRDelete(*networkingv1.ServiceCIDR)      {}

func startClient(t *testing.T, streams *liststream.Streams) *kubeclient.Client {
	t.Helper()
	ts, rc := liststream.StartTLS(streams)
	t.Cleanup(ts.Close)
	c, err := kubeclient.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestStartWaitsForHandlers: Start returns only once the handlers have had every
// object of the streamed initial lists, however slow they are, with slices
// parsed for their family and Services whole.
func TestStartWaitsForHandlers(t *testing.T) {
	const n = 40
	var svcs, slices []runtime.Object
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		svcs = append(svcs, &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: "1"},
			Spec: v1.ServiceSpec{ClusterIP: fmt.Sprintf("10.96.0.%d", i+1), Ports: []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}}}})
		slices = append(slices, &discovery.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name + "-v6", ResourceVersion: "1", Labels: map[string]string{discovery.LabelServiceName: name}},
			AddressType: discovery.AddressTypeIPv6,
			Ports:       []discovery.EndpointPort{{Name: ptr.To(""), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
			Endpoints:   []discovery.Endpoint{{Addresses: []string{fmt.Sprintf("fd00:64::%x", i+1)}, Conditions: discovery.EndpointConditions{Ready: ptr.To(true)}}},
		})
	}
	streams, err := liststream.Encode(map[string][]runtime.Object{liststream.ServicesPath: svcs, liststream.EndpointSlicesPath: slices})
	if err != nil {
		t.Fatal(err)
	}
	h := &slowHandler{delay: 5 * time.Millisecond, slices: map[string]*endpointslice.Object{}}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := Start(ctx, startClient(t, streams), h, Options{}); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.svcs) != n || len(h.slices) != n {
		t.Fatalf("Start returned with %d Services and %d EndpointSlices delivered, want %d of each", len(h.svcs), len(h.slices), n)
	}
	o := h.slices["svc-7-v6"]
	if o == nil || o.Err != nil || o.Slice == nil || len(o.Slice.Endpoints) != 1 || o.Slice.Endpoints[0].Addr.String() != "fd00:64::8" || o.Slice.Endpoints[0].Port != 8080 {
		t.Errorf("svc-7-v6 delivered as %+v", o)
	}
	if u := streams.Unexpected.Load(); u != 0 {
		t.Errorf("%d requests were not streaming lists", u)
	}
}

// TestStartGivesUpWithContext: when a list never completes (the server cannot
// stream EndpointSlices), Start returns the context's error instead of waiting on.
func TestStartGivesUpWithContext(t *testing.T) {
	streams, err := liststream.Encode(map[string][]runtime.Object{liststream.ServicesPath: {
		&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", ResourceVersion: "1"}}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeoutCause(t.Context(), time.Second, fmt.Errorf("test deadline"))
	defer cancel()
	h := &slowHandler{slices: map[string]*endpointslice.Object{}}
	err = Start(ctx, startClient(t, streams), h, Options{})
	if err == nil || ctx.Err() == nil {
		t.Fatalf("Start returned %v before its context ended", err)
	}
	if got := err.Error(); got != "waiting for informer caches: test deadline" {
		t.Errorf("error %q, want the context's cause", got)
	}
}
