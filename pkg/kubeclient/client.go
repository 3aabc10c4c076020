// Package kubeclient is dsproxy's API client: REST clients for the three API
// groups the proxy reads (core/v1, discovery.k8s.io/v1, networking.k8s.io/v1),
// over a scheme of only those groups.
//
// client-go's clientset would do, but its scheme registers every built-in API
// group (55 packages of types, their protobuf descriptors and conversions), and
// their init functions touch binary pages that then stay resident. Measured on
// dsproxy at 10k Services: binary 44.5 -> 29 MB, resident binary pages 25 -> 17
// MB, RSS once programmed 112 -> 103 MiB. For a DaemonSet on every node that is
// memory for nothing.
//
// EndpointSlices and Services in protobuf are decoded by lean decoders of the
// client's own (lean.go) that keep only the fields the proxy reads.
package kubeclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/flowcontrol"
)

// scheme holds the proxy's API groups and the meta types every group serves
// (lists' metadata, Status, WatchEvent).
var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

func init() {
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	for _, add := range []func(*runtime.Scheme) error{v1.AddToScheme, discoveryv1.AddToScheme, networkingv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
}

// Resource is one kind of object the proxy watches.
type Resource struct {
	group    int // index into Client.groups
	resource string
	object   runtime.Object // an empty object of the kind, for the informer
}

// The resources dsproxy watches.
var (
	Services       = Resource{groupCore, "services", &v1.Service{}}
	Nodes          = Resource{groupCore, "nodes", &v1.Node{}}
	EndpointSlices = Resource{groupDiscovery, "endpointslices", &discoveryv1.EndpointSlice{}}
	ServiceCIDRs   = Resource{groupNetworking, "servicecidrs", &networkingv1.ServiceCIDR{}}
)

const (
	groupCore = iota
	groupDiscovery
	groupNetworking
	numGroups
)

// Object returns an empty object of r's kind.
func (r Resource) Object() runtime.Object { return r.object.DeepCopyObject() }

// String names the resource as the API does ("endpointslices.discovery.k8s.io").
func (r Resource) String() string {
	if g := groupVersions[r.group].Group; g != "" {
		return r.resource + "." + g
	}
	return r.resource
}

var groupVersions = [numGroups]schema.GroupVersion{
	groupCore:       v1.SchemeGroupVersion,
	groupDiscovery:  discoveryv1.SchemeGroupVersion,
	groupNetworking: networkingv1.SchemeGroupVersion,
}

// Client reaches the API server for the proxy's resources. Every call shares one
// HTTP client and one rate limiter (QPS and Burst of the config), as a clientset's
// group clients do.
type Client struct {
	groups [numGroups]rest.Interface
	// lists are the same clients over HTTP/1.1 (see listConfig), for the
	// requests that carry a whole collection: LISTs and streaming lists.
	lists [numGroups]rest.Interface
}

// listConfig returns rc for the requests that carry whole collections: the
// informers' initial lists (WatchList streams, and LISTs where a server cannot
// stream). Go's HTTP/2 moves a large response through more goroutine handoffs
// and flow-control updates than HTTP/1.1 on both ends: the initial lists of
// 10k dual-stack Services from a v1.36 API server on this project's 2-core VM
// took 0.51 s over HTTP/1.1 against 0.69 s over HTTP/2 (medians of eight
// alternating rounds), with kube-apiserver's CPU 0.43 s against 0.53 s and the
// client's 0.51 s against 0.68 s (bench/README.md, TestListTransports).
// Those connections are used until the stream's watch ends (5-10 min) and the
// reflector resumes it, over HTTP/2 again. HTTP/1.1 has no HTTP/2 PING health
// check, so their TCP keepalive notices a dead API server within 30 s (client-go
// pings an HTTP/2 connection idle for 30 s and gives up 15 s later).
//
// A dialer rc brings is kept (its keepalive is its own). It returns nil when rc
// brings its own transport (whose protocols are its own) or, with DISABLE_HTTP2
// set, needs no second client.
func listConfig(rc *rest.Config) *rest.Config {
	if rc.Transport != nil || os.Getenv("DISABLE_HTTP2") != "" {
		return nil
	}
	lc := rest.CopyConfig(rc)
	lc.TLSClientConfig.NextProtos = []string{"http/1.1"}
	if lc.Dial == nil {
		lc.Dial = listDialer.DialContext
	}
	return lc
}

var listDialer = &net.Dialer{
	Timeout:         30 * time.Second,
	KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3},
}

// New returns a client for the API server rc describes. rc's ContentType (for
// example protobuf) and AcceptContentTypes are used as given.
func New(rc *rest.Config) (*Client, error) {
	rc = rest.CopyConfig(rc)
	if rc.UserAgent == "" {
		rc.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	if rc.RateLimiter == nil && rc.QPS > 0 {
		if rc.Burst <= 0 {
			return nil, fmt.Errorf("burst is required to be greater than 0 when RateLimiter is not set and QPS is set to greater than 0")
		}
		rc.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(rc.QPS, rc.Burst)
	}
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		return nil, err
	}
	lc := hc
	if l := listConfig(rc); l != nil {
		if lc, err = rest.HTTPClientFor(l); err != nil {
			return nil, err
		}
	}
	c := &Client{}
	for g, gv := range groupVersions {
		gc := rest.CopyConfig(rc)
		gc.GroupVersion = &gv
		gc.APIPath = "/apis"
		if gv.Group == "" {
			gc.APIPath = "/api"
		}
		// With client-go's ClientsAllowCBOR gate, CBOR too, as kube-proxy's
		// generated clientset (--kube-api-content-type=application/cbor).
		gc.NegotiatedSerializer = newLeanNegotiator(rest.CodecFactoryForGeneratedClient(scheme, codecs).WithoutConversion())
		if c.groups[g], err = rest.RESTClientForConfigAndClient(gc, hc); err != nil {
			return nil, fmt.Errorf("API client for %s: %w", gv, err)
		}
		if c.lists[g], err = rest.RESTClientForConfigAndClient(gc, lc); err != nil {
			return nil, fmt.Errorf("API client for %s: %w", gv, err)
		}
	}
	return c, nil
}

// ListWatch returns the lister-watcher of every object of r (in all namespaces),
// with tweak applied to each request's options. It supports streaming lists (the
// reflector's WatchList), as a clientset's does. LISTs and streaming lists go
// over HTTP/1.1 (listConfig), resumed watches over the shared HTTP/2 connection.
func (c *Client) ListWatch(r Resource, tweak func(*metav1.ListOptions)) cache.ListerWatcher {
	rc, lc := c.groups[r.group], c.lists[r.group]
	opts := func(o metav1.ListOptions) *metav1.ListOptions {
		if tweak != nil {
			tweak(&o)
		}
		return &o
	}
	// As a clientset's requests: protobuf unless the config names a content
	// type, and the server-side timeout also bounds the request.
	req := func(rc rest.Interface, o *metav1.ListOptions) *rest.Request {
		var timeout time.Duration
		if o.TimeoutSeconds != nil {
			timeout = time.Duration(*o.TimeoutSeconds) * time.Second
		}
		return rc.Get().UseProtobufAsDefaultIfPreferred(true).Resource(r.resource).
			VersionedParams(o, metav1.ParameterCodec).Timeout(timeout)
	}
	list := func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return req(lc, opts(o)).Do(ctx).Get()
	}
	watchFn := func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.Watch = true
		if o.SendInitialEvents != nil && *o.SendInitialEvents {
			return req(lc, opts(o)).Watch(ctx)
		}
		return req(rc, opts(o)).Watch(ctx)
	}
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc:  list,
		WatchFuncWithContext: watchFn,
	}, rc)
}

// Node fetches the Node called name.
func (c *Client) Node(ctx context.Context, name string) (*v1.Node, error) {
	n := &v1.Node{}
	err := c.groups[groupCore].Get().UseProtobufAsDefaultIfPreferred(true).Resource(Nodes.resource).Name(name).Do(ctx).Into(n)
	if err != nil {
		return nil, err
	}
	return n, nil
}

// PostEvent creates an events.k8s.io/v1 Event in its namespace. It is sent as
// JSON: the client's codecs decode only what the proxy watches.
func (c *Client) PostEvent(ctx context.Context, ev *eventsv1.Event) error {
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return c.groups[groupCore].Post().AbsPath("/apis/events.k8s.io/v1/namespaces", ev.Namespace, "events").
		Body(body).SetHeader("Content-Type", "application/json").Do(ctx).Error()
}
