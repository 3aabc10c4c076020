package app

import (
	"encoding/json"
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
	cfg := config.Default()
	cfg.ProxyMode, cfg.MasqueradeAll = config.ModeNFTables, true
	off := metricsMux(m, cfg)
	profiling := *cfg
	profiling.EnableProfiling = true
	on := metricsMux(m, &profiling)
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
	// /configz: the effective configuration as v1alpha1 under the group's name,
	// as kube-proxy's.
	_, body := get(off, "/configz")
	var cz map[string]struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Mode       string `json:"mode"`
		NFTables   struct {
			MasqueradeAll bool `json:"masqueradeAll"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(body), &cz); err != nil {
		t.Fatalf("/configz: %v: %s", err, body)
	}
	got, ok := cz["kubeproxy.config.k8s.io"]
	if !ok || got.APIVersion != "kubeproxy.config.k8s.io/v1alpha1" || got.Kind != "KubeProxyConfiguration" || got.Mode != "nftables" || !got.NFTables.MasqueradeAll {
		t.Errorf("/configz = %s", body)
	}
}
