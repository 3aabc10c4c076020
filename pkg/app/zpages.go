package app

import (
	"context"
	"encoding/json"
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

// installHealthz installs /healthz with kube-proxy's single ping check, which
// each request records in the SLI metrics unless ?exclude=ping, and
// /metrics/slis serving them (DELETE resets them).
func installHealthz(mux *listingMux) {
	slis.SLIMetricsWithReset{}.Install(mux)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		excluded := map[string]bool{}
		for _, name := range q["exclude"] {
			excluded[name] = true // as given: kube-proxy splits nothing
		}
		var out strings.Builder
		if excluded["ping"] {
			out.WriteString("[+]ping excluded: ok\n")
			delete(excluded, "ping")
		} else {
			_ = slis.ObserveHealthcheck(context.Background(), "ping", "healthz", slis.Success)
			out.WriteString("[+]ping ok\n")
		}
		if len(excluded) > 0 {
			var quoted []string
			for _, name := range slices.Sorted(maps.Keys(excluded)) {
				quoted = append(quoted, fmt.Sprintf("%q", name))
			}
			fmt.Fprintf(&out, "warn: some health checks cannot be excluded: no matches for %s\n", strings.Join(quoted, ","))
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if _, verbose := q["verbose"]; !verbose {
			_, _ = io.WriteString(w, "ok")
			return
		}
		_, _ = io.WriteString(w, out.String()+"healthz check passed\n")
	})
	mux.ServeMux.HandleFunc("/healthz/ping", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	})
}

// zpageFormat is what a /flagz or /statusz request accepts: the text page (no
// Accept header, text/plain, text/* or */*), the structured object as JSON
// (application/json;as=<kind>;v=v1beta1;g=config.k8s.io), or nothing (ok
// false: 406), as kube-proxy's negotiation answers (it also offers YAML and
// CBOR, and the deprecated v1alpha1).
func zpageFormat(r *http.Request, kind string) (asJSON, ok bool) {
	accept := strings.TrimSpace(r.Header.Get("Accept"))
	if accept == "" {
		return false, true
	}
	for _, clause := range strings.Split(accept, ",") {
		parts := strings.Split(clause, ";")
		params := map[string]string{}
		for _, p := range parts[1:] {
			if k, v, found := strings.Cut(strings.TrimSpace(p), "="); found {
				params[strings.ToLower(k)] = strings.Trim(v, `"`)
			}
		}
		switch mt := strings.ToLower(strings.TrimSpace(parts[0])); {
		case mt == "application/json" && params["as"] == kind && params["v"] == "v1beta1" && params["g"] == "config.k8s.io":
			return true, true
		case (mt == "text/plain" || mt == "text/*" || mt == "*/*") && params["as"] == "":
			return false, true
		}
	}
	return false, false
}

// writeZPage answers a /flagz or /statusz request with the text page or the
// structured object obj (its TypeMeta and ObjectMeta filled here).
func writeZPage(w http.ResponseWriter, r *http.Request, kind, text string, obj map[string]any) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	asJSON, ok := zpageFormat(r, kind)
	switch {
	case !ok:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusNotAcceptable)
		_, _ = fmt.Fprintf(w, "only the following media types are accepted: text/plain, application/json;as=%s;v=v1beta1;g=config.k8s.io\n", kind)
	case asJSON:
		obj["kind"], obj["apiVersion"] = kind, "config.k8s.io/v1beta1"
		obj["metadata"] = map[string]string{"name": kubeProxyComponent}
		b, err := json.Marshal(obj)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
	default:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, text)
	}
}

// installFlagz serves /flagz: every flag with its value, as parsed.
func installFlagz(mux *listingMux, flags map[string]string) {
	mux.HandleFunc("/flagz", func(w http.ResponseWriter, r *http.Request) {
		var b strings.Builder
		fmt.Fprintf(&b, "\n%s flagz\n%s\n\n", kubeProxyComponent, zpageWarning)
		for _, name := range slices.Sorted(maps.Keys(flags)) {
			fmt.Fprintf(&b, "%s=%s\n", name, flags[name])
		}
		writeZPage(w, r, "Flagz", b.String(), map[string]any{"flags": flags})
	})
}

// emulationVersion is the kube-proxy version whose behaviour dsproxy follows:
// /statusz names it where kube-proxy names the version it emulates (its own
// major.minor).
const emulationVersion = "1.36"

// installStatusz serves /statusz: start time, uptime, Go, binary and emulation versions
// and the top-level paths the mux listed before it, as kube-proxy's lists the
// paths installed before its statusz.
func installStatusz(mux *listingMux) {
	var top []string
	for _, p := range mux.listed {
		if parts := strings.Split(p, "/"); len(parts) >= 2 && parts[1] != "" {
			top = append(top, "/"+parts[1])
		}
	}
	slices.Sort(top)
	top = slices.Compact(top)
	mux.HandleFunc("/statusz", func(w http.ResponseWriter, r *http.Request) {
		up := max(0, int64(time.Since(processStart).Seconds()))
		text := fmt.Sprintf("\n%s statusz\n%s\n\nStarted: %s\nUp: %d hr %02d min %02d sec\nGo version: %s\nBinary version: %s\nEmulation version: %s\nPaths: %s\n",
			kubeProxyComponent, zpageWarning, processStart.Format(time.UnixDate), up/3600, (up/60)%60, up%60,
			runtime.Version(), html.EscapeString(Version()), emulationVersion, strings.Join(top, " "))
		writeZPage(w, r, "Statusz", text, map[string]any{"startTime": processStart.UTC().Format(time.RFC3339),
			"uptimeSeconds": up, "goVersion": runtime.Version(), "binaryVersion": Version(),
			"emulationVersion": emulationVersion, "paths": top})
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
