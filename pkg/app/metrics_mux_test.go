package app

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/klog/v2"

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
	cfg.Flags = map[string]string{"proxy-mode": "nftables", "masquerade-all": "true"}
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
		{off, "/healthz?verbose", 200, "[+]ping ok\nhealthz check passed"},
		{off, "/healthz/ping", 200, "ok"},
		{off, "/metrics/slis", 200, `kubernetes_healthcheck{name="ping",type="healthz"} 1`},
		{off, "/flagz", 200, "\nmasquerade-all=true\nproxy-mode=nftables\n"},
		{off, "/statusz", 200, "Paths: /configz /flagz /healthz /metrics /proxyMode\n"},
		{off, "/healthz?verbose&exclude=ping&exclude=nope", 200, "[+]ping excluded: ok\nwarn: some health checks cannot be excluded: no matches for \"nope\"\nhealthz check passed\n"},
		{off, "/statusz", 200, "Binary version: " + Version()},
		{off, "/statusz", 200, "\nEmulation version: 1.36\n"},
		{off, "/debug/flags/v", 404, ""},
		{off, "/proxyMode", 200, "nftables"},
		{off, "/metrics", 200, "kubeproxy_sync_proxy_rules"},
		{off, "/debug/pprof/", 404, ""},
		{off, "/debug/pprof/heap", 404, ""},
		{on, "/debug/pprof/", 200, "goroutine"},
		{on, "/debug/pprof/heap?debug=1", 200, "heap profile"},
		{on, "/debug/pprof/cmdline", 404, "Unknown profile"},
		{on, "/debug/pprof", 302, ""},
		{on, "/debug/flags", 200, "<tr>v<br>"},
		{on, "/debug/flags/v", 406, "unsupported http method"},
	} {
		code, body := get(tc.h, tc.path)
		if code != tc.code || !strings.Contains(body, tc.contains) {
			t.Errorf("GET %s: %d %.80q, want %d containing %q", tc.path, code, body, tc.code, tc.contains)
		}
	}
	// /flagz and /statusz answer text, their structured kind as JSON, and
	// refuse other media types, as kube-proxy's negotiation does.
	accept := func(path, accept string) (int, string, string) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("Accept", accept)
		off.ServeHTTP(rec, req)
		return rec.Code, rec.Header().Get("Content-Type"), rec.Body.String()
	}
	for _, tc := range []struct {
		path, accept, ctype, contains string
		code                          int
	}{
		{"/flagz", "*/*", "text/plain; charset=utf-8", "proxy-mode=nftables", 200},
		{"/flagz", "text/plain", "text/plain; charset=utf-8", "proxy-mode=nftables", 200},
		{"/flagz", "application/json;as=Flagz;v=v1beta1;g=config.k8s.io", "application/json", `"flags":{"masquerade-all":"true","proxy-mode":"nftables"}`, 200},
		{"/flagz", "application/json", "text/plain; charset=utf-8", "", 406},
		{"/statusz", "application/json;as=Statusz;v=v1beta1;g=config.k8s.io", "application/json", `"kind":"Statusz"`, 200},
		{"/statusz", "application/json;as=Statusz;v=v1beta1;g=config.k8s.io", "application/json", `"emulationVersion":"1.36"`, 200},
		{"/statusz", "application/json;as=Flagz;v=v1beta1;g=config.k8s.io", "text/plain; charset=utf-8", "", 406},
	} {
		code, ctype, body := accept(tc.path, tc.accept)
		if code != tc.code || ctype != tc.ctype || !strings.Contains(body, tc.contains) {
			t.Errorf("GET %s, Accept %s: %d %s %.120q; want %d %s containing %q", tc.path, tc.accept, code, ctype, body, tc.code, tc.ctype, tc.contains)
		}
	}
	// /flagz and /statusz go with their feature gates (on by default).
	gated := *cfg
	gated.FeatureGates = map[string]bool{"ComponentFlagz": false, "ComponentStatusz": false}
	for _, path := range []string{"/flagz", "/statusz"} {
		if code, _ := get(metricsMux(m, &gated), path); code != 404 {
			t.Errorf("GET %s with its gate off: %d, want 404", path, code)
		}
	}
	// With profiling, a PUT to /debug/flags/v sets the log verbosity.
	put := func(body string) (int, string) {
		rec := httptest.NewRecorder()
		on.ServeHTTP(rec, httptest.NewRequest(http.MethodPut, "/debug/flags/v", strings.NewReader(body)))
		return rec.Code, rec.Body.String()
	}
	defer put("0")
	if code, body := put("4"); code != 200 || !strings.Contains(body, "successfully set klog.logging.verbosity to 4") || !klog.V(4).Enabled() {
		t.Errorf("PUT /debug/flags/v 4: %d %q, V(4) enabled %v", code, body, klog.V(4).Enabled())
	}
	if code, _ := put("four"); code != 400 {
		t.Errorf("PUT /debug/flags/v four: %d, want 400", code)
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
