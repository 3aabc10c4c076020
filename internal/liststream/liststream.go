// Package liststream serves, for tests and benchmarks, the informers' initial lists
// as a v1.36 API server streams them (WatchList): a watch with sendInitialEvents
// whose response is every object as an ADDED event in protobuf, then the bookmark
// that ends the initial events, then nothing until the client goes away.
package liststream

import (
	"bytes"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/client-go/rest"
)

// Protobuf is the API's protobuf media type.
const Protobuf = "application/vnd.kubernetes.protobuf"

// Paths of the resources Streams serves.
const (
	ServicesPath       = "/api/v1/services"
	EndpointSlicesPath = "/apis/discovery.k8s.io/v1/endpointslices"
)

var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

func init() {
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	for _, add := range []func(*runtime.Scheme) error{v1.AddToScheme, discovery.AddToScheme, networkingv1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
}

// Streams holds each path's response body, encoded once.
type Streams struct {
	byPath map[string][]byte
	// Unexpected counts requests that were not a streaming list of a known path
	// (a plain LIST is client-go's fallback when a server cannot stream).
	Unexpected atomic.Int64
}

// Encode encodes, per path, the objects (all of one group version) as a streamed
// initial list ending with a bookmark at resource version "2". Objects keep their
// own resource versions.
func Encode(objs map[string][]runtime.Object) (*Streams, error) {
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), Protobuf)
	if !ok {
		return nil, fmt.Errorf("no protobuf serializer")
	}
	s := &Streams{byPath: map[string][]byte{}}
	for path, list := range objs {
		if len(list) == 0 {
			return nil, fmt.Errorf("%s: no objects (the bookmark's kind comes from the first)", path)
		}
		gvks, _, err := scheme.ObjectKinds(list[0])
		if err != nil {
			return nil, err
		}
		objEnc := codecs.EncoderForVersion(info.Serializer, gvks[0].GroupVersion())
		bookmark, err := scheme.New(gvks[0])
		if err != nil {
			return nil, err
		}
		m, ok := bookmark.(metav1.Object)
		if !ok {
			return nil, fmt.Errorf("%s: %s has no metadata", path, gvks[0])
		}
		m.SetResourceVersion("2")
		m.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
		var out, raw bytes.Buffer
		enc := streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(&out), info.StreamSerializer.Serializer)
		event := func(typ string, o runtime.Object) error {
			raw.Reset()
			if err := objEnc.Encode(o, &raw); err != nil {
				return err
			}
			return enc.Encode(&metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Raw: raw.Bytes()}})
		}
		for _, o := range list {
			if err := event("ADDED", o); err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
		}
		if err := event("BOOKMARK", bookmark); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		s.byPath[path] = out.Bytes()
	}
	return s, nil
}

// Bytes is the size of every stream.
func (s *Streams) Bytes() int {
	n := 0
	for _, b := range s.byPath {
		n += len(b)
	}
	return n
}

// ServeHTTP writes a path's stream to a streaming list of it and keeps the watch
// open until the client goes away.
func (s *Streams) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	body, ok := s.byPath[r.URL.Path]
	if !ok || q.Get("watch") != "true" || q.Get("sendInitialEvents") != "true" {
		s.Unexpected.Add(1)
		http.Error(w, "not a streaming list: "+r.URL.String(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", Protobuf+";stream=watch")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
	w.(http.Flusher).Flush()
	<-r.Context().Done()
}

// StartTLS serves h over TLS and HTTP/2, as an API server does, and returns the
// server and a client config for it (protobuf, no client-side rate limit).
func StartTLS(h http.Handler) (*httptest.Server, *rest.Config) {
	ts := httptest.NewUnstartedServer(h)
	ts.EnableHTTP2 = true
	ts.StartTLS()
	rc := &rest.Config{Host: ts.URL, ContentConfig: rest.ContentConfig{ContentType: Protobuf}, QPS: -1,
		TLSClientConfig: rest.TLSClientConfig{CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw})}}
	return ts, rc
}
