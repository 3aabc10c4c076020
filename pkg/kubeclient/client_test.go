package kubeclient

import (
	"context"
	"encoding/pem"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/cbor"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

const protobuf = "application/vnd.kubernetes.protobuf"

// apiServer answers GETs with protobuf-encoded objects by path, and records the
// requests' paths and queries.
type apiServer struct {
	mu   sync.Mutex
	seen []string
	objs map[string]runtime.Object
}

func (s *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.seen = append(s.seen, r.URL.Path+"?"+r.URL.RawQuery)
	obj := s.objs[r.URL.Path]
	s.mu.Unlock()
	if obj == nil {
		http.NotFound(w, r)
		return
	}
	if !strings.Contains(r.Header.Get("Accept"), protobuf) {
		http.Error(w, "Accept: "+r.Header.Get("Accept"), http.StatusNotAcceptable)
		return
	}
	info, _ := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), protobuf)
	gvks, _, err := scheme.ObjectKinds(obj)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", protobuf)
	if err := codecs.EncoderForVersion(info.Serializer, gvks[0].GroupVersion()).Encode(obj, w); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// TestClient: each resource is listed from its group's path with the options
// tweaked, in protobuf (the clientset's default) without a configured content
// type, and decoded into its typed list; Node fetches one Node.
func TestClient(t *testing.T) {
	srv := &apiServer{objs: map[string]runtime.Object{
		"/api/v1/services": &v1.ServiceList{Items: []v1.Service{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
			Spec: v1.ServiceSpec{ClusterIPs: []string{"10.96.0.10", "fd00:96::10"}}}}},
		"/api/v1/nodes/node-1": &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
			Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.0.2.1"}}}},
		"/apis/discovery.k8s.io/v1/endpointslices": &discoveryv1.EndpointSliceList{Items: []discoveryv1.EndpointSlice{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-1"}, AddressType: discoveryv1.AddressTypeIPv6,
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"fd00:64::1"}}}}}},
		"/apis/networking.k8s.io/v1/servicecidrs": &networkingv1.ServiceCIDRList{Items: []networkingv1.ServiceCIDR{{
			ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16"}}}}},
	}}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	c, err := New(&rest.Config{Host: ts.URL, QPS: 100, Burst: 100})
	if err != nil {
		t.Fatal(err)
	}
	tweak := func(o *metav1.ListOptions) { o.LabelSelector = "!service.kubernetes.io/headless" }
	list := func(r Resource) runtime.Object {
		t.Helper()
		lw := c.ListWatch(r, tweak).(cache.ListerWatcherWithContext)
		obj, err := lw.ListWithContext(t.Context(), metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			t.Fatalf("list %s: %v", r, err)
		}
		return obj
	}
	if l, ok := list(Services).(*v1.ServiceList); !ok || len(l.Items) != 1 || l.Items[0].Name != "web" || len(l.Items[0].Spec.ClusterIPs) != 2 {
		t.Errorf("services: %#v", l)
	}
	if l, ok := list(EndpointSlices).(*discoveryv1.EndpointSliceList); !ok || len(l.Items) != 1 || l.Items[0].Endpoints[0].Addresses[0] != "fd00:64::1" {
		t.Errorf("endpointslices: %#v", l)
	}
	if l, ok := list(ServiceCIDRs).(*networkingv1.ServiceCIDRList); !ok || len(l.Items) != 1 || l.Items[0].Spec.CIDRs[0] != "10.96.0.0/16" {
		t.Errorf("servicecidrs: %#v", l)
	}
	n, err := c.Node(t.Context(), "node-1")
	if err != nil || n.Status.Addresses[0].Address != "192.0.2.1" {
		t.Errorf("node: %v %v", n, err)
	}
	if _, err := c.Node(t.Context(), "node-2"); err == nil {
		t.Error("node-2: no error for a missing Node")
	}
	want := "/api/v1/services?labelSelector=%21service.kubernetes.io%2Fheadless&resourceVersion=0"
	if !slices.Contains(srv.seen, want) {
		t.Errorf("requests %q, want one %q", srv.seen, want)
	}
	if _, ok := Services.Object().(*v1.Service); !ok || Services.String() != "services" || EndpointSlices.String() != "endpointslices.discovery.k8s.io" {
		t.Errorf("resource names: %s %s", Services, EndpointSlices)
	}
}

// TestCollectionsOverHTTP1: against a TLS server that speaks HTTP/2, LISTs and
// streaming lists (watches with sendInitialEvents) go over HTTP/1.1, resumed
// watches and single objects over HTTP/2; the HTTP/1.1 connections are dialled
// with TCP keepalive (15 s idle, 5 s apart, 3 probes).
func TestCollectionsOverHTTP1(t *testing.T) {
	srv := &apiServer{objs: map[string]runtime.Object{
		"/apis/discovery.k8s.io/v1/endpointslices": &discoveryv1.EndpointSliceList{},
		"/api/v1/nodes/node-1":                     &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}},
	}}
	var mu sync.Mutex
	proto := map[string]int{}
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		kind := "get"
		switch {
		case q.Get("watch") == "true" && q.Get("sendInitialEvents") == "true":
			kind = "streaming list"
		case q.Get("watch") == "true":
			kind = "watch"
		case r.URL.Path == "/apis/discovery.k8s.io/v1/endpointslices":
			kind = "list"
		}
		mu.Lock()
		proto[kind] = r.ProtoMajor
		mu.Unlock()
		srv.ServeHTTP(w, r)
	}))
	ts.EnableHTTP2 = true
	ts.StartTLS()
	defer ts.Close()
	// With client-go's dialer, and with one of the config's own (kept).
	for _, dial := range []func(context.Context, string, string) (net.Conn, error){nil, (&net.Dialer{}).DialContext} {
		mu.Lock()
		clear(proto)
		mu.Unlock()
		c, err := New(&rest.Config{Host: ts.URL, ContentConfig: rest.ContentConfig{ContentType: protobuf}, Dial: dial,
			TLSClientConfig: rest.TLSClientConfig{CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw})}})
		if err != nil {
			t.Fatal(err)
		}
		lw := c.ListWatch(EndpointSlices, nil).(cache.ListerWatcherWithContext)
		if _, err := lw.ListWithContext(t.Context(), metav1.ListOptions{ResourceVersion: "0"}); err != nil {
			t.Fatal(err)
		}
		for _, o := range []metav1.ListOptions{
			{SendInitialEvents: ptr.To(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true},
			{ResourceVersion: "5", AllowWatchBookmarks: true},
		} {
			w, err := lw.WatchWithContext(t.Context(), o)
			if err != nil {
				t.Fatal(err)
			}
			w.Stop()
		}
		if _, err := c.Node(t.Context(), "node-1"); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		if want := map[string]int{"list": 1, "streaming list": 1, "watch": 2, "get": 2}; !maps.Equal(proto, want) {
			t.Errorf("own dialer %v: HTTP major versions %v, want %v", dial != nil, proto, want)
		}
		mu.Unlock()
	}

	conn, err := listDialer.DialContext(t.Context(), "tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	if err := raw.Control(func(fd uintptr) {
		for name, opt := range map[string][2]int{"SO_KEEPALIVE": {syscall.SOL_SOCKET, syscall.SO_KEEPALIVE},
			"TCP_KEEPIDLE": {syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE}, "TCP_KEEPINTVL": {syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL},
			"TCP_KEEPCNT": {syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT}} {
			v, err := syscall.GetsockoptInt(int(fd), opt[0], opt[1])
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			got[name] = v
		}
	}); err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"SO_KEEPALIVE": 1, "TCP_KEEPIDLE": 15, "TCP_KEEPINTVL": 5, "TCP_KEEPCNT": 3}; !maps.Equal(got, want) {
		t.Errorf("keepalive of a list connection %v, want %v", got, want)
	}
}

// allowCBOR is client-go's feature gates with ClientsAllowCBOR on.
type allowCBOR struct{}

func (allowCBOR) Enabled(key clientfeatures.Feature) bool {
	return key == clientfeatures.ClientsAllowCBOR
}

// TestCBOR: with client-go's ClientsAllowCBOR gate (KUBE_FEATURE_ClientsAllowCBOR)
// and --kube-api-content-type=application/cbor, a server answering in CBOR is
// understood, as by kube-proxy's generated clientset; before, every list failed
// ("serializer for application/cbor doesn't exist") and no informer synced.
func TestCBOR(t *testing.T) {
	saved := clientfeatures.FeatureGates()
	clientfeatures.ReplaceFeatureGates(allowCBOR{})
	t.Cleanup(func() { clientfeatures.ReplaceFeatureGates(saved) })

	enc := cbor.NewSerializer(scheme, scheme)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("Accept"), "application/cbor") {
			http.Error(w, "Accept: "+r.Header.Get("Accept"), http.StatusNotAcceptable)
			return
		}
		w.Header().Set("Content-Type", "application/cbor")
		list := &v1.ServiceList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceList"},
			Items: []v1.Service{{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
				Spec: v1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}}}}
		if err := enc.Encode(list, w); err != nil {
			t.Error(err)
		}
	}))
	defer srv.Close()
	c, err := New(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: "application/cbor"}})
	if err != nil {
		t.Fatal(err)
	}
	obj, err := c.ListWatch(Services, nil).(cache.ListerWatcherWithContext).ListWithContext(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("listing Services in CBOR: %v", err)
	}
	list, ok := obj.(*v1.ServiceList)
	if !ok || len(list.Items) != 1 || list.Items[0].Name != "web" || list.Items[0].Spec.Ports[0].Port != 80 {
		t.Fatalf("listed %#v", obj)
	}
}
