// Package metrics holds dsproxy's Prometheus metrics.
//
// The kubeproxy_* metrics carry kube-proxy v1.36's names, help texts, label names
// and buckets (pkg/proxy/metrics in Kubernetes), so dashboards and alerts written
// for kube-proxy keep working; the dsproxy_* metrics are dsproxy's own. Help texts
// are kube-proxy's source strings: kube-proxy's exposition additionally prefixes
// them with its component-base stability marker ("[ALPHA] "), which dsproxy does
// not.
//
// Of kube-proxy's metrics, kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total
// is not exported: dsproxy's nftables mode removes what it no longer uses in the
// sync's own transaction, so such a failure is a sync failure
// (kubeproxy_sync_proxy_rules_nftables_sync_failures_total).
//
// Nothing is registered globally: New builds a Metrics, Register adds it to a
// prometheus.Registerer, and Handler serves a private registry holding it plus,
// as kube-proxy's /metrics, the Go collector with every runtime metric, the
// process collector, and client-go's rest_client_* metrics (restclient.go; its
// hooks are process-wide, installed at init). kubernetes_build_info is added
// by the caller, which knows the build (NewBuildInfoCollector).
package metrics

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

const (
	kubeProxySubsystem = "kubeproxy"
	dsproxyNamespace   = "dsproxy"
	labelFamily        = "ip_family"
	labelPolicy        = "traffic_policy"
	labelCode          = "code"
	labelTable         = "table"
)

// Traffic policy label values of kubeproxy_sync_proxy_rules_no_local_endpoints_total.
const (
	PolicyInternal = "internal"
	PolicyExternal = "external"
)

// syncBuckets are kube-proxy's sync latency buckets:
// metrics.ExponentialBuckets(0.001, 2, 15).
var syncBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// programmingBuckets are kube-proxy's network programming latency buckets.
var programmingBuckets = mergeBuckets(
	prometheus.LinearBuckets(0.25, 0.25, 2), // 0.25s, 0.50s
	prometheus.LinearBuckets(1, 1, 59),      // 1s, 2s, 3s, ... 59s
	prometheus.LinearBuckets(60, 5, 12),     // 60s, 65s, 70s, ... 115s
	prometheus.LinearBuckets(120, 30, 7),    // 2min, 2.5min, 3min, ..., 5min
)

// operationBuckets: 1, 4, 16, ... 262144 kernel operations per sync.
var operationBuckets = prometheus.ExponentialBuckets(1, 4, 10)

func mergeBuckets(bs ...[]float64) []float64 {
	var out []float64
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}

// Metrics holds every dsproxy metric. Its methods are safe for concurrent use. It
// implements proxier.Observer and prometheus.Collector.
type Metrics struct {
	syncLatency        *prometheus.HistogramVec
	syncFullLatency    *prometheus.HistogramVec
	syncPartialLatency *prometheus.HistogramVec
	lastSync           *prometheus.GaugeVec
	lastQueued         *prometheus.GaugeVec
	programming        *prometheus.HistogramVec
	endpointsPending   prometheus.Gauge
	endpointsTotal     prometheus.Counter
	servicesPending    prometheus.Gauge
	servicesTotal      prometheus.Counter
	noLocalEndpoints   *prometheus.GaugeVec
	healthzTotal       *prometheus.CounterVec
	livezTotal         *prometheus.CounterVec

	// iptables mode only (no series in other modes).
	iptRestoreFailures        *prometheus.CounterVec
	iptPartialRestoreFailures *prometheus.CounterVec
	iptRulesTotal             *prometheus.GaugeVec
	iptRulesLast              *prometheus.GaugeVec

	// nftables mode only.
	nftSyncFailures *prometheus.CounterVec

	conntrackLatency *prometheus.HistogramVec
	conntrackDeleted *prometheus.CounterVec

	kernelOps    *prometheus.HistogramVec
	transactions *prometheus.CounterVec
	repairs      *prometheus.CounterVec
	syncErrors   *prometheus.CounterVec

	collectors []prometheus.Collector
	registry   *prometheus.Registry

	// now is time.Now; tests replace it.
	now   func() time.Time
	start time.Time

	mu                 sync.Mutex
	endpointsPendingBy map[*family.Family]int
	servicesPendingBy  map[*family.Family]int
}

var (
	_ proxier.Observer     = (*Metrics)(nil)
	_ prometheus.Collector = (*Metrics)(nil)
)

// New creates the metrics. It registers nothing outside the Metrics' own registry.
func New() *Metrics {
	return newMetrics(time.Now)
}

func newMetrics(now func() time.Time) *Metrics {
	m := &Metrics{
		syncLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "sync_proxy_rules_duration_seconds",
			Help:      "SyncProxyRules latency in seconds",
			Buckets:   syncBuckets,
		}, []string{labelFamily}),
		syncFullLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "sync_full_proxy_rules_duration_seconds",
			Help:      "SyncProxyRules latency in seconds for full resyncs",
			Buckets:   syncBuckets,
		}, []string{labelFamily}),
		syncPartialLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "sync_partial_proxy_rules_duration_seconds",
			Help:      "SyncProxyRules latency in seconds for partial resyncs",
			Buckets:   syncBuckets,
		}, []string{labelFamily}),
		lastSync: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "sync_proxy_rules_last_timestamp_seconds",
			Help:      "The last time proxy rules were successfully synced",
		}, []string{labelFamily}),
		lastQueued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "sync_proxy_rules_last_queued_timestamp_seconds",
			Help:      "The last time a sync of proxy rules was queued",
		}, []string{labelFamily}),
		programming: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "network_programming_duration_seconds",
			Help:      "In Cluster Network Programming Latency in seconds",
			Buckets:   programmingBuckets,
		}, []string{labelFamily}),
		endpointsPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "sync_proxy_rules_endpoint_changes_pending",
			Help:      "Pending proxy rules Endpoint changes",
		}),
		endpointsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "sync_proxy_rules_endpoint_changes_total",
			Help:      "Cumulative proxy rules Endpoint changes",
		}),
		servicesPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "sync_proxy_rules_service_changes_pending",
			Help:      "Pending proxy rules Service changes",
		}),
		servicesTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "sync_proxy_rules_service_changes_total",
			Help:      "Cumulative proxy rules Service changes",
		}),
		noLocalEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "sync_proxy_rules_no_local_endpoints_total",
			Help:      "Number of services with a Local traffic policy and no endpoints",
		}, []string{labelPolicy, labelFamily}),
		healthzTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "proxy_healthz_total",
			Help:      "Cumulative proxy healthz HTTP status",
		}, []string{labelCode}),
		livezTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "proxy_livez_total",
			Help:      "Cumulative proxy livez HTTP status",
		}, []string{labelCode}),

		kernelOps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: dsproxyNamespace,
			Name:      "kernel_transaction_operations",
			Help:      "Kernel objects and elements added or removed by the transactions of one sync",
			Buckets:   operationBuckets,
		}, []string{labelFamily}),
		transactions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: dsproxyNamespace,
			Name:      "kernel_transactions_total",
			Help:      "Kernel transactions committed by syncs",
		}, []string{labelFamily}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: dsproxyNamespace,
			Name:      "resync_repairs_total",
			Help:      "Differences between kernel and expected state found and repaired by full syncs",
		}, []string{labelFamily}),
		syncErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: dsproxyNamespace,
			Name:      "sync_errors_total",
			Help:      "Syncs that failed (and are retried as full syncs)",
		}, []string{labelFamily}),
		iptRestoreFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "sync_proxy_rules_iptables_restore_failures_total",
			Help:      "Cumulative proxy iptables restore failures",
		}, []string{labelFamily}),
		iptPartialRestoreFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "sync_proxy_rules_iptables_partial_restore_failures_total",
			Help:      "Cumulative proxy iptables partial restore failures",
		}, []string{labelFamily}),
		iptRulesTotal: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "sync_proxy_rules_iptables_total",
			Help:      "Total number of iptables rules owned by kube-proxy",
		}, []string{labelTable, labelFamily}),
		iptRulesLast: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "sync_proxy_rules_iptables_last",
			Help:      "Number of iptables rules written by kube-proxy in last sync",
		}, []string{labelTable, labelFamily}),
		nftSyncFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "sync_proxy_rules_nftables_sync_failures_total",
			Help:      "Cumulative proxy nftables sync failures",
		}, []string{labelFamily}),
		conntrackLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "conntrack_reconciler_sync_duration_seconds",
			Help:      "ReconcileConntrackFlowsLatency latency in seconds",
			Buckets:   syncBuckets,
		}, []string{labelFamily}),
		conntrackDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Subsystem: kubeProxySubsystem,
			Name:      "conntrack_reconciler_deleted_entries_total",
			Help:      "Cumulative conntrack flows deleted by conntrack reconciler",
		}, []string{labelFamily}),

		now:                now,
		start:              now(),
		endpointsPendingBy: map[*family.Family]int{},
		servicesPendingBy:  map[*family.Family]int{},
	}
	m.collectors = []prometheus.Collector{
		m.syncLatency, m.syncFullLatency, m.syncPartialLatency, m.lastSync, m.lastQueued,
		m.programming, m.endpointsPending, m.endpointsTotal, m.servicesPending,
		m.servicesTotal, m.noLocalEndpoints, m.healthzTotal, m.livezTotal,
		m.kernelOps, m.transactions, m.repairs, m.syncErrors,
		m.iptRestoreFailures, m.iptPartialRestoreFailures, m.iptRulesTotal, m.iptRulesLast,
		m.nftSyncFailures, m.conntrackLatency, m.conntrackDeleted,
	}
	m.registry = prometheus.NewRegistry()
	m.registry.MustRegister(m,
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsAll)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.registry.MustRegister(restClientCollectors...)
	return m
}

// Register adds the metrics to r, for a program that serves its own registry. It
// is not needed for Handler.
func (m *Metrics) Register(r prometheus.Registerer) error {
	return r.Register(m)
}

// Registry is the private registry Handler serves; other packages may register
// their collectors in it to appear on the same /metrics.
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// Handler serves the metrics, with the Go and process collectors, for /metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{ErrorLog: errorLogger{}})
}

type errorLogger struct{}

func (errorLogger) Println(v ...any) { klog.ErrorS(nil, "Serving metrics", "error", v) }

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors {
		c.Collect(ch)
	}
}

// SyncDone implements proxier.Observer. Like kube-proxy it observes the duration of
// every sync, successful or not, in the total histogram and in the full or partial
// one, and sets the last-sync timestamp on success. It also counts the sync's
// kernel transactions, operations and repairs, and its error. A sync interrupted by
// shutdown (context.Canceled) is not counted as an error.
func (m *Metrics) SyncDone(f *family.Family, full bool, d time.Duration, res proxier.SyncResult, err error) {
	fam := f.Name
	m.syncLatency.WithLabelValues(fam).Observe(d.Seconds())
	if full {
		m.syncFullLatency.WithLabelValues(fam).Observe(d.Seconds())
	} else {
		m.syncPartialLatency.WithLabelValues(fam).Observe(d.Seconds())
	}
	if res.Transactions > 0 {
		m.transactions.WithLabelValues(fam).Add(float64(res.Transactions))
		m.kernelOps.WithLabelValues(fam).Observe(float64(res.Operations))
	}
	if res.Repairs > 0 {
		m.repairs.WithLabelValues(fam).Add(float64(res.Repairs))
	}
	if res.RestoreFailed {
		m.iptRestoreFailures.WithLabelValues(fam).Inc()
		if res.PartialRestore {
			m.iptPartialRestoreFailures.WithLabelValues(fam).Inc()
		}
	}
	if res.NFTablesFailed {
		m.nftSyncFailures.WithLabelValues(fam).Inc()
	}
	for table, n := range res.RulesWritten {
		m.iptRulesLast.WithLabelValues(table, fam).Set(float64(n))
	}
	for table, n := range res.RulesTotal {
		m.iptRulesTotal.WithLabelValues(table, fam).Set(float64(n))
	}
	switch {
	case err == nil:
		setTime(m.lastSync.WithLabelValues(fam), m.now())
	case !errors.Is(err, context.Canceled):
		m.syncErrors.WithLabelValues(fam).Inc()
	}
}

// ConntrackCleared implements proxier.ConntrackObserver: kube-proxy's conntrack
// reconciler metrics. kube-proxy dumps the conntrack table after every sync;
// dsproxy only after a sync whose changes can leave stale UDP or SCTP entries, so
// the histogram counts those rounds.
func (m *Metrics) ConntrackCleared(f *family.Family, d time.Duration, deleted int) {
	m.conntrackLatency.WithLabelValues(f.Name).Observe(d.Seconds())
	m.conntrackDeleted.WithLabelValues(f.Name).Add(float64(deleted))
}

// SyncQueued sets kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds of f to
// now. kube-proxy does this whenever a change triggers a sync.
func (m *Metrics) SyncQueued(f *family.Family) {
	setTime(m.lastQueued.WithLabelValues(f.Name), m.now())
}

func setTime(g prometheus.Gauge, t time.Time) {
	g.Set(float64(t.UnixNano()) / 1e9)
}

// ObserveProgramming records one network programming latency for f: the time from
// triggerTime, an EndpointSlice's endpoints.kubernetes.io/last-change-trigger-time
// (see TriggerTime), to now. Call it after the sync that programmed the change
// succeeded, once per trigger time the sync consumed. Like kube-proxy it ignores a
// zero time and times from before the Metrics were created (changes that happened
// before this process started). Unlike kube-proxy, which drops the times a failed
// sync took, the proxier keeps them for the sync that programs the change, so a
// retry's wait is in the latency.
func (m *Metrics) ObserveProgramming(f *family.Family, triggerTime time.Time) {
	if triggerTime.IsZero() || !triggerTime.After(m.start) {
		return
	}
	m.programming.WithLabelValues(f.Name).Observe(m.now().Sub(triggerTime).Seconds())
}

// TriggerTime parses the endpoints.kubernetes.io/last-change-trigger-time annotation
// of an EndpointSlice. ok is false if it is missing or malformed.
func TriggerTime(annotations map[string]string) (t time.Time, ok bool) {
	s, found := annotations[v1.EndpointsLastChangeTriggerTime]
	if !found {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, false
	}
	return t, true
}

// SetEndpointChangesPending records f's number of EndpointSlice changes not yet
// synced. kube-proxy's gauge has no family label; dsproxy publishes the sum over the
// families.
func (m *Metrics) SetEndpointChangesPending(f *family.Family, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.endpointsPending.Set(float64(setSum(m.endpointsPendingBy, f, n)))
}

// SetServiceChangesPending records f's number of Service changes not yet synced;
// the gauge is the sum over the families.
func (m *Metrics) SetServiceChangesPending(f *family.Family, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.servicesPending.Set(float64(setSum(m.servicesPendingBy, f, n)))
}

func setSum(by map[*family.Family]int, f *family.Family, n int) int {
	by[f] = n
	sum := 0
	for _, v := range by {
		sum += v
	}
	return sum
}

// AddEndpointChanges counts n EndpointSlice events (kube-proxy counts each event
// its endpoints tracker receives, changed or not).
func (m *Metrics) AddEndpointChanges(n int) { m.endpointsTotal.Add(float64(n)) }

// AddServiceChanges counts n Service events. A dual-stack kube-proxy counts each
// Service event once per family (each family's tracker counts it); call this per
// family proxier to match.
func (m *Metrics) AddServiceChanges(n int) { m.servicesTotal.Add(float64(n)) }

// SetNoLocalEndpoints sets kubeproxy_sync_proxy_rules_no_local_endpoints_total of
// f: the service ports whose internal (external) traffic policy is Local and that
// have endpoints, but none on this node. NoLocalEndpoints computes the counts.
func (m *Metrics) SetNoLocalEndpoints(f *family.Family, internal, external int) {
	m.noLocalEndpoints.WithLabelValues(PolicyInternal, f.Name).Set(float64(internal))
	m.noLocalEndpoints.WithLabelValues(PolicyExternal, f.Name).Set(float64(external))
}

// NoLocalEndpoints counts, as kube-proxy's iptables and nftables proxiers do, the
// service ports of st that have endpoints somewhere (some would otherwise be
// rejected) but whose Local internal or external traffic policy finds none on this
// node, so that traffic is dropped.
func NoLocalEndpoints(st *model.State) (internal, external int) {
	for _, ps := range st.Ports {
		if !ps.HasAny || len(ps.Local) > 0 {
			continue
		}
		if ps.InternalPolicyLocal {
			internal++
		}
		if ps.ExternalPolicyLocal {
			external++
		}
	}
	return internal, external
}

// ObserveHealthz counts one /healthz response (kubeproxy_proxy_healthz_total).
func (m *Metrics) ObserveHealthz(code int) {
	m.healthzTotal.WithLabelValues(strconv.Itoa(code)).Inc()
}

// ObserveLivez counts one /livez response (kubeproxy_proxy_livez_total).
func (m *Metrics) ObserveLivez(code int) {
	m.livezTotal.WithLabelValues(strconv.Itoa(code)).Inc()
}
