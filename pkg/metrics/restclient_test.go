package metrics

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// TestRESTClientMetrics: requests through a client-go REST client appear in
// every Metrics' registry under kube-proxy's rest_client_* names and labels.
func TestRESTClientMetrics(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/missing") {
			http.Error(w, "no", http.StatusNotFound)
			return
		}
		_, _ = w.Write([]byte("{}"))
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	c, err := rest.UnversionedRESTClientFor(&rest.Config{Host: srv.URL,
		ContentConfig: rest.ContentConfig{NegotiatedSerializer: serializer.NewCodecFactory(runtime.NewScheme()).WithoutConversion()}})
	if err != nil {
		t.Fatal(err)
	}
	m := New()
	before200 := testutil.ToFloat64(restRequestResult.WithLabelValues("200", "GET", host))
	for range 2 {
		if err := c.Get().AbsPath("/ok").Do(context.Background()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.Get().AbsPath("/missing").Do(context.Background()).Error()
	if got := testutil.ToFloat64(restRequestResult.WithLabelValues("200", "GET", host)) - before200; got != 2 {
		t.Errorf("rest_client_requests_total{code=200,method=GET} went up by %v, want 2", got)
	}
	if got := testutil.ToFloat64(restRequestResult.WithLabelValues("404", "GET", host)); got != 1 {
		t.Errorf("rest_client_requests_total{code=404,method=GET} = %v, want 1", got)
	}
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "host" && l.GetValue() == host {
					found[mf.GetName()] = true
				}
			}
		}
	}
	for _, name := range []string{"rest_client_requests_total", "rest_client_request_duration_seconds",
		"rest_client_rate_limiter_duration_seconds", "rest_client_response_size_bytes"} {
		if !found[name] {
			t.Errorf("%s has no sample for host %s in the registry", name, host)
		}
	}
}
