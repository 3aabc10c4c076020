package metrics

import (
	"context"
	"math"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
)

// The rest_client_* metrics: client-go's request metrics, with the names, help
// texts, labels and buckets kube-proxy exports (component-base's
// metrics/prometheus/restclient), for dsproxy's API client. client-go reports
// into one process-wide set of hooks, installed once, at package init, so that
// the transports dsproxy builds before its Metrics are counted; every Metrics'
// registry serves the same collectors.
var (
	latencyBuckets = []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0}
	sizeBuckets    = []float64{64, 256, 512, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216}

	restRequestLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "rest_client_request_duration_seconds", Help: "Request latency in seconds. Broken down by verb, and host.",
		Buckets: latencyBuckets,
	}, []string{"verb", "host"})
	restRequestSize = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "rest_client_request_size_bytes", Help: "Request size in bytes. Broken down by verb and host.",
		Buckets: sizeBuckets,
	}, []string{"verb", "host"})
	restResponseSize = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "rest_client_response_size_bytes", Help: "Response size in bytes. Broken down by verb and host.",
		Buckets: sizeBuckets,
	}, []string{"verb", "host"})
	restRateLimiterLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "rest_client_rate_limiter_duration_seconds", Help: "Client side rate limiter latency in seconds. Broken down by verb, and host.",
		Buckets: latencyBuckets,
	}, []string{"verb", "host"})
	restRequestResult = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_requests_total", Help: "Number of HTTP requests, partitioned by status code, method, and host.",
	}, []string{"code", "method", "host"})
	restRequestRetry = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_request_retries_total", Help: "Number of request retries, partitioned by status code, verb, and host.",
	}, []string{"code", "verb", "host"})
	restExecPluginCertRotation = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "rest_client_exec_plugin_certificate_rotation_age",
		Help: "Histogram of the number of seconds the last auth exec plugin client certificate lived before being rotated. If auth exec plugin client certificates are unused, histogram will contain no data.",
		// 10 minutes, 30 minutes, 1 hour, 4 hours, 1 day, 1 week, 1, 3 and 6 months, 1 and 4 years
		Buckets: []float64{600, 1800, 3600, 14400, 86400, 604800, 2592000, 7776000, 15552000, 31104000, 124416000},
	})
	restExecPluginCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_exec_plugin_call_total",
		Help: "Number of calls to an exec plugin, partitioned by the type of event encountered (no_error, plugin_execution_error, plugin_not_found_error, client_internal_error) and an optional exit code. The exit code will be set to 0 if and only if the plugin call was successful.",
	}, []string{"code", "call_status"})
	restTransportCacheEntries = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "rest_client_transport_cache_entries", Help: "Number of transport entries in the internal cache.",
	})
	restTransportCreateCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_transport_create_calls_total",
		Help: "Number of calls to get a new transport, partitioned by the result of the operation hit: obtained from the cache, miss: created and added to the cache, miss-gc: recreated and added back to the cache after being garbage collected, uncacheable: created and not cached",
	}, []string{"result"})
	restTransportCAReloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_transport_ca_reload_total",
		Help: "Number of times a CA reload is attempted, partitioned by the result and reason for the reload attempt",
	}, []string{"result", "reason"})
	restTransportCertRotationGCCalls = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "rest_client_transport_cert_rotation_gc_calls_total",
		Help: "Number of times a cert rotation goroutine cancel func is called via GC cleanup of the associated transport",
	})
	restTransportCacheGCCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_transport_cache_gc_calls_total",
		Help: "Number of times a GC cleanup attempts to delete a transport cache entry, partitioned by the result: deleted, skipped",
	}, []string{"result"})

	// restCertExpiry is the exec plugin's client certificate expiry, nil
	// while it manages none.
	restCertExpiry struct {
		sync.Mutex
		t *time.Time
	}
	restExecPluginTTL = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "rest_client_exec_plugin_ttl_seconds",
		Help: "Gauge of the shortest TTL (time-to-live) of the client certificate(s) managed by the auth exec plugin. The value is in seconds until certificate expiry (negative if already expired). If auth exec plugins are unused or manage no TLS certificates, the value will be +INF.",
	}, func() float64 {
		restCertExpiry.Lock()
		defer restCertExpiry.Unlock()
		if restCertExpiry.t == nil {
			return math.Inf(1)
		}
		return time.Until(*restCertExpiry.t).Seconds()
	})

	restClientCollectors = []prometheus.Collector{
		restRequestLatency, restRequestSize, restResponseSize, restRateLimiterLatency, restRequestResult,
		restRequestRetry, restExecPluginCertRotation, restExecPluginCalls, restTransportCacheEntries,
		restTransportCreateCalls, restTransportCAReloads, restTransportCertRotationGCCalls,
		restTransportCacheGCCalls, restExecPluginTTL,
	}
)

func init() {
	clientmetrics.Register(clientmetrics.RegisterOpts{
		ClientCertExpiry:             restExpiry{},
		ClientCertRotationAge:        restDuration{restExecPluginCertRotation},
		RequestLatency:               restLatency{restRequestLatency},
		RequestSize:                  restSize{restRequestSize},
		ResponseSize:                 restSize{restResponseSize},
		RateLimiterLatency:           restLatency{restRateLimiterLatency},
		RequestResult:                restResult{restRequestResult},
		ExecPluginCalls:              restCalls{restExecPluginCalls},
		RequestRetry:                 restRetry{restRequestRetry},
		TransportCacheEntries:        restGauge{restTransportCacheEntries},
		TransportCreateCalls:         restCounter1{restTransportCreateCalls},
		TransportCAReloads:           restCounter2{restTransportCAReloads},
		TransportCertRotationGCCalls: restCounter0{restTransportCertRotationGCCalls},
		TransportCacheGCCalls:        restCounter1{restTransportCacheGCCalls},
	})
}

type restExpiry struct{}

func (restExpiry) Set(t *time.Time) {
	restCertExpiry.Lock()
	restCertExpiry.t = t
	restCertExpiry.Unlock()
}

type restDuration struct{ h prometheus.Histogram }

func (d restDuration) Observe(v time.Duration) { d.h.Observe(v.Seconds()) }

type restLatency struct{ h *prometheus.HistogramVec }

func (l restLatency) Observe(_ context.Context, verb string, u url.URL, v time.Duration) {
	l.h.WithLabelValues(verb, u.Host).Observe(v.Seconds())
}

type restSize struct{ h *prometheus.HistogramVec }

func (s restSize) Observe(_ context.Context, verb, host string, size float64) {
	s.h.WithLabelValues(verb, host).Observe(size)
}

type restResult struct{ c *prometheus.CounterVec }

func (r restResult) Increment(_ context.Context, code, method, host string) {
	r.c.WithLabelValues(code, method, host).Inc()
}

type restRetry struct{ c *prometheus.CounterVec }

func (r restRetry) IncrementRetry(_ context.Context, code, method, host string) {
	r.c.WithLabelValues(code, method, host).Inc()
}

type restCalls struct{ c *prometheus.CounterVec }

func (r restCalls) Increment(exitCode int, status string) {
	r.c.WithLabelValues(strconv.Itoa(exitCode), status).Inc()
}

type restGauge struct{ g prometheus.Gauge }

func (r restGauge) Observe(v int) { r.g.Set(float64(v)) }

type restCounter0 struct{ c prometheus.Counter }

func (r restCounter0) Increment() { r.c.Inc() }

type restCounter1 struct{ c *prometheus.CounterVec }

func (r restCounter1) Increment(v string) { r.c.WithLabelValues(v).Inc() }

type restCounter2 struct{ c *prometheus.CounterVec }

func (r restCounter2) Increment(a, b string) { r.c.WithLabelValues(a, b).Inc() }
