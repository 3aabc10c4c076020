package app

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/dsproxy/dsproxy/pkg/config"
	"github.com/dsproxy/dsproxy/pkg/metrics"
)

// The metrics server answers what kube-proxy's does; /debug/pprof only with
// profiling enabled.
func TestMetricsMux(t *testing.T) {
	get := func(h http.Handler, path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		b, _ := io.ReadAll(rec.Result().Body)
		return rec.Code, string(b)
	}
	m := metrics.New()
	off := metricsMux(m, config.ModeNFTables, false)
	on := metricsMux(m, config.ModeNFTables, true)
	for _, tc := range []struct {
		h        http.Handler
		path     string
		code     int
		contains string
	}{
		{off, "/healthz", 200, "ok"},
		{off, "/proxyMode", 200, "nftables"},
		{off, "/metrics", 200, "kubeproxy_sync_proxy_rules"},
		{off, "/debug/pprof/", 404, ""},
		{off, "/debug/pprof/heap", 404, ""},
		{on, "/debug/pprof/", 200, "goroutine"},
		{on, "/debug/pprof/heap?debug=1", 200, "heap profile"},
		{on, "/debug/pprof/cmdline", 200, ""},
	} {
		code, body := get(tc.h, tc.path)
		if code != tc.code || !strings.Contains(body, tc.contains) {
			t.Errorf("GET %s: %d %.80q, want %d containing %q", tc.path, code, body, tc.code, tc.contains)
		}
	}
	if _, body := get(off, "/proxyMode"); body != "nftables" {
		t.Errorf("/proxyMode = %q, want exactly the mode", body)
	}
}
