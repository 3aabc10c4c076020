package app

import (
	"context"
	"fmt"
	"html"
	"io"
	"maps"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"time"

	"k8s.io/component-base/logs"
	"k8s.io/component-base/metrics/prometheus/slis"

	"github.com/dsproxy/dsproxy/pkg/config"
)

// The metrics server's pages other than /metrics, /configz and /proxyMode, as
// kube-proxy v1.36's serveMetrics installs them: /healthz with its ping check
// (and /healthz/ping), /metrics/slis (the health checks' SLI metrics),
// /flagz and /statusz (feature gates ComponentFlagz and ComponentStatusz, beta
// and on by default in v1.36), and with profiling /debug/flags/v, which sets
// the log verbosity at run time.

// processStart is when the process started (near enough: package init).
var processStart = time.Now()

const zpageWarning = "Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only."

// listingMux records the paths kube-proxy's mux lists (statusz names them);
// unlisted ones go straight to the ServeMux.
type listingMux struct {
	*http.ServeMux
	listed []string
}

func (m *listingMux) Handle(path string, h http.Handler) {
	m.ServeMux.Handle(path, h)
	m.listed = append(m.listed, path)
}

func (m *listingMux) HandleFunc(path string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(path, http.HandlerFunc(h))
}

// gateOn reports whether feature gate name is on in cfg, given its default.
func gateOn(cfg *config.Config, name string, def bool) bool {
	if on, ok := cfg.FeatureGates[name]; ok {
		return on
	}
	return def
}

// installHealthz installs /healthz with kube-proxy's single ping check, which
// each request records in the SLI metrics, and /metrics/slis serving them
// (DELETE resets them).
func installHealthz(mux *listingMux) {
	slis.SLIMetricsWithReset{}.Install(mux)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		_ = slis.ObserveHealthcheck(context.Background(), "ping", "healthz", slis.Success)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if _, verbose := r.URL.Query()["verbose"]; !verbose {
			_, _ = io.WriteString(w, "ok")
			return
		}
		_, _ = io.WriteString(w, "[+]ping ok\nhealthz check passed\n")
	})
	mux.ServeMux.HandleFunc("/healthz/ping", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})
}

// installFlagz serves /flagz: every flag with its value, as parsed.
func installFlagz(mux *listingMux, flags map[string]string) {
	mux.HandleFunc("/flagz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		var b strings.Builder
		fmt.Fprintf(&b, "\n%s flagz\n%s\n\n", kubeProxyComponent, zpageWarning)
		for _, name := range slices.Sorted(maps.Keys(flags)) {
			fmt.Fprintf(&b, "%s=%s\n", name, flags[name])
		}
		_, _ = io.WriteString(w, b.String())
	})
}

// installStatusz serves /statusz: start time, uptime, Go and binary versions
// and the top-level paths the mux lists (read when served, so paths installed
// after it count).
func installStatusz(mux *listingMux) {
	mux.HandleFunc("/statusz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		up := int64(time.Since(processStart).Seconds())
		var top []string
		for _, p := range mux.listed {
			if parts := strings.Split(p, "/"); len(parts) >= 2 && parts[1] != "" {
				top = append(top, "/"+parts[1])
			}
		}
		slices.Sort(top)
		top = slices.Compact(top)
		_, _ = fmt.Fprintf(w, "\n%s statusz\n%s\n\nStarted: %s\nUp: %d hr %02d min %02d sec\nGo version: %s\nBinary version: %s\nPaths: %s\n",
			kubeProxyComponent, zpageWarning, processStart.Format(time.UnixDate), up/3600, (up/60)%60, up%60,
			runtime.Version(), html.EscapeString(Version()), strings.Join(top, " "))
	})
}

// installDebugFlags serves /debug/flags (an index) and /debug/flags/v, where a
// PUT of a number sets the log verbosity, as kube-proxy's with profiling on.
func installDebugFlags(mux *http.ServeMux) {
	index := func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "<html>\n<head>\n<title>/debug/flags/</title>\n</head>\n<body>\n/debug/flags/<br>\n<br>\nflags:<br>\n<table>\n<tr>v<br>\n</table>\n<br>\nfull flags configurable<br>\n</body>\n</html>\n")
	}
	mux.HandleFunc("/debug/flags", index)
	mux.HandleFunc("/debug/flags/", index)
	mux.HandleFunc("/debug/flags/v", func(w http.ResponseWriter, r *http.Request) {
		plain := func(code int, text string) {
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(code)
			_, _ = fmt.Fprintln(w, text)
		}
		if r.Method != http.MethodPut {
			plain(http.StatusNotAcceptable, "unsupported http method")
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 64))
		if err != nil {
			plain(http.StatusBadRequest, "error reading request body: "+err.Error())
			return
		}
		msg, err := logs.GlogSetter(string(body))
		if err != nil {
			plain(http.StatusBadRequest, err.Error())
			return
		}
		plain(http.StatusOK, msg)
	})
}

// kubeProxyComponent names the component on /flagz and /statusz.
const kubeProxyComponent = "dsproxy"
