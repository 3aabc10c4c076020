package watch

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"sync"
	"sync/atomic"
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
	cidrs  []string
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
func (h *slowHandler) OnServiceUpdate(_, _ *v1.Service)                 {}
func (h *slowHandler) OnServiceDelete(*v1.Service)                      {}
func (h *slowHandler) OnEndpointSliceUpdate(_, _ *endpointslice.Object) {}
func (h *slowHandler) OnEndpointSliceDelete(*endpointslice.Object)      {}
func (h *slowHandler) OnNodeAdd(*v1.Node)                               {}
func (h *slowHandler) OnNodeUpdate(_, _ *v1.Node)                       {}
func (h *slowHandler) OnNodeDelete(*v1.Node)                            {}
func (h *slowHandler) OnServiceCIDRAdd(c *networkingv1.ServiceCIDR) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cidrs = append(h.cidrs, c.Name)
}
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

// serviceCIDRsPath is where client-go lists ServiceCIDRs.
const serviceCIDRsPath = "/apis/networking.k8s.io/v1/servicecidrs"

// cidrsAnswer serves the ServiceCIDRs' path with answer, and what answer
// leaves (returning false) and every other path from streams.
func cidrsAnswer(answer func(w http.ResponseWriter, r *http.Request) bool) func(streams http.Handler) http.Handler {
	return func(streams http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == serviceCIDRsPath && answer(w, r) {
				return
			}
			streams.ServeHTTP(w, r)
		})
	}
}

// TestStartServiceCIDRs: Start waits for the ServiceCIDRs' list like the
// others; when that list fails (no RBAC, an API server without ServiceCIDRs) or
// hangs, it returns without it, as kube-proxy's proxiers never wait for
// ServiceCIDRs, instead of leaving the proxy unprogrammed.
func TestStartServiceCIDRs(t *testing.T) {
	defer func(g time.Duration) { serviceCIDRGrace = g }(serviceCIDRGrace)
	objs := map[string][]runtime.Object{liststream.ServicesPath: {
		&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", ResourceVersion: "1"},
			Spec: v1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}}}}},
		liststream.EndpointSlicesPath: {&discovery.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "web-v4", ResourceVersion: "1", Labels: map[string]string{discovery.LabelServiceName: "web"}},
			AddressType: discovery.AddressTypeIPv4}}}
	var failed atomic.Int32
	for _, tc := range []struct {
		name  string
		serve func(streams http.Handler) http.Handler
		cidrs int           // delivered before Start returns
		grace time.Duration // serviceCIDRGrace
	}{
		{"listed", nil, 1, 300 * time.Millisecond},
		// A failure a retry may mend is retried within the grace (the
		// reflector's first backoff is 0.8-1.6 s).
		{"failing once", cidrsAnswer(func(w http.ResponseWriter, r *http.Request) bool {
			if failed.Add(1) > 1 {
				return false
			}
			http.Error(w, `etcdserver: request timed out`, http.StatusInternalServerError)
			return true
		}), 1, 10 * time.Second},
		{"not served", cidrsAnswer(func(w http.ResponseWriter, r *http.Request) bool {
			http.Error(w, `404 page not found`, http.StatusNotFound)
			return true
		}), 0, time.Minute},
		{"forbidden", cidrsAnswer(func(w http.ResponseWriter, r *http.Request) bool {
			http.Error(w, `servicecidrs.networking.k8s.io is forbidden`, http.StatusForbidden)
			return true
		}), 0, time.Minute},
		// A refusal that comes after a transient error, while the other
		// lists are still held, ends the wait as soon as they are in: the
		// earlier error does not take its place (the list then hangs, so no
		// later refusal could end the wait instead).
		{"timeout, then forbidden, before the Services list", func(streams http.Handler) http.Handler {
			var n atomic.Int32
			forbidden := make(chan struct{})
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch r.URL.Path {
				case serviceCIDRsPath:
					// Each attempt is a streaming list, then a LIST: the
					// reflector reports the LIST's error.
					if r.URL.Query().Get("watch") == "true" {
						select {
						case <-forbidden:
							<-r.Context().Done()
						default:
							http.Error(w, `etcdserver: request timed out`, http.StatusInternalServerError)
						}
						return
					}
					switch n.Add(1) {
					case 1:
						http.Error(w, `etcdserver: request timed out`, http.StatusInternalServerError)
					case 2:
						http.Error(w, `servicecidrs.networking.k8s.io is forbidden`, http.StatusForbidden)
						close(forbidden)
					default:
						<-r.Context().Done()
					}
					return
				case liststream.ServicesPath:
					<-forbidden
					time.Sleep(200 * time.Millisecond) // for the reflector to report the refusal
				}
				streams.ServeHTTP(w, r)
			})
		}, 0, time.Minute},
		{"hanging", cidrsAnswer(func(w http.ResponseWriter, r *http.Request) bool {
			<-r.Context().Done()
			return true
		}), 0, 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			serviceCIDRGrace = tc.grace
			all := maps.Clone(objs)
			all[serviceCIDRsPath] = []runtime.Object{&networkingv1.ServiceCIDR{
				ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", ResourceVersion: "1"},
				Spec:       networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16"}}}}
			streams, err := liststream.Encode(all)
			if err != nil {
				t.Fatal(err)
			}
			var hd http.Handler = streams
			if tc.serve != nil {
				hd = tc.serve(streams)
			}
			ts, rc := liststream.StartTLS(hd)
			t.Cleanup(ts.Close)
			c, err := kubeclient.New(rc)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeoutCause(t.Context(), 20*time.Second, fmt.Errorf("test deadline"))
			defer cancel()
			h := &slowHandler{slices: map[string]*endpointslice.Object{}}
			if err := Start(ctx, c, h, Options{ServiceCIDRs: true}); err != nil {
				t.Fatalf("Start: %v", err)
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			if len(h.svcs) != 1 || len(h.cidrs) != tc.cidrs {
				t.Errorf("Start returned with %d Services and ServiceCIDRs %v delivered, want 1 and %d", len(h.svcs), h.cidrs, tc.cidrs)
			}
		})
	}
}
