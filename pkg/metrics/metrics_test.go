package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nfacct"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func newTest() (*Metrics, *fakeClock) {
	c := &fakeClock{t: epoch}
	return newMetrics(c.Now), c
}

// kubeProxyNames are the metric names (and types) kube-proxy v1.36 exposes that
// dsproxy must keep.
var kubeProxyNames = map[string]string{
	"kubeproxy_sync_proxy_rules_duration_seconds":              "histogram",
	"kubeproxy_sync_full_proxy_rules_duration_seconds":         "histogram",
	"kubeproxy_sync_partial_proxy_rules_duration_seconds":      "histogram",
	"kubeproxy_sync_proxy_rules_last_timestamp_seconds":        "gauge",
	"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds": "gauge",
	"kubeproxy_network_programming_duration_seconds":           "histogram",
	"kubeproxy_sync_proxy_rules_endpoint_changes_pending":      "gauge",
	"kubeproxy_sync_proxy_rules_endpoint_changes_total":        "counter",
	"kubeproxy_sync_proxy_rules_service_changes_pending":       "gauge",
	"kubeproxy_sync_proxy_rules_service_changes_total":         "counter",
	"kubeproxy_sync_proxy_rules_no_local_endpoints_total":      "gauge",
	"kubeproxy_proxy_healthz_total":                            "counter",
	"kubeproxy_proxy_livez_total":                              "counter",
	// iptables mode
	"kubeproxy_sync_proxy_rules_iptables_restore_failures_total":         "counter",
	"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total": "counter",
	"kubeproxy_sync_proxy_rules_iptables_total":                          "gauge",
	"kubeproxy_sync_proxy_rules_iptables_last":                           "gauge",
	// nftables mode
	"kubeproxy_sync_proxy_rules_nftables_sync_failures_total": "counter",
	// every mode
	"kubeproxy_conntrack_reconciler_sync_duration_seconds": "histogram",
	"kubeproxy_conntrack_reconciler_deleted_entries_total": "counter",
	"dsproxy_kernel_transaction_operations":                "histogram",
	"dsproxy_kernel_transactions_total":                    "counter",
	"dsproxy_resync_repairs_total":                         "counter",
	"dsproxy_sync_errors_total":                            "counter",
}

func TestNamesAndTypes(t *testing.T) {
	m, _ := newTest()
	// Touch every vector so that it exports a series.
	m.SyncDone(family.IPv4, true, time.Millisecond, proxier.SyncResult{Operations: 1, Transactions: 1, Repairs: 1}, errors.New("x"))
	m.SyncDone(family.IPv4, false, time.Millisecond, proxier.SyncResult{}, nil)
	m.SyncDone(family.IPv6, false, time.Millisecond, proxier.SyncResult{RestoreFailed: true, PartialRestore: true}, errors.New("x"))
	m.SyncDone(family.IPv6, true, time.Millisecond, proxier.SyncResult{RulesWritten: map[string]int{"nat": 1}, RulesTotal: map[string]int{"nat": 1}}, nil)
	m.SyncDone(family.IPv6, false, time.Millisecond, proxier.SyncResult{NFTablesFailed: true}, errors.New("x"))
	m.ConntrackCleared(family.IPv6, time.Millisecond, 1)
	m.SyncQueued(family.IPv4)
	m.ObserveProgramming(family.IPv4, epoch.Add(time.Second))
	m.SetNoLocalEndpoints(family.IPv4, 0, 0)
	m.ObserveHealthz(200)
	m.ObserveLivez(200)

	reg := prometheus.NewPedanticRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, mf := range mfs {
		got[mf.GetName()] = strings.ToLower(mf.GetType().String())
	}
	for name, typ := range kubeProxyNames {
		if got[name] != typ {
			t.Errorf("%s: type %q, want %q", name, got[name], typ)
		}
	}
	for name := range got {
		if _, ok := kubeProxyNames[name]; !ok {
			t.Errorf("unexpected metric %s", name)
		}
	}
	problems, err := promlint.NewWithMetricFamilies(mfs).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		// kube-proxy's names are kept as they are, lint or not.
		if strings.HasPrefix(p.Metric, "dsproxy_") {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	}
}

func TestRegisterTwiceFails(t *testing.T) {
	m := New()
	reg := prometheus.NewRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	if err := m.Register(reg); err == nil {
		t.Fatal("second Register succeeded")
	}
	// Two Metrics are independent: no global state.
	if err := New().Register(prometheus.NewRegistry()); err != nil {
		t.Fatal(err)
	}
}

func TestSyncDone(t *testing.T) {
	m, clock := newTest()
	m.SyncDone(family.IPv4, true, 3*time.Millisecond, proxier.SyncResult{Operations: 40, Transactions: 2, Repairs: 5}, nil)
	clock.Step(10 * time.Second)
	m.SyncDone(family.IPv6, false, 20*time.Millisecond, proxier.SyncResult{Operations: 3, Transactions: 1}, nil)
	m.SyncDone(family.IPv6, false, 20*time.Millisecond, proxier.SyncResult{}, errors.New("netlink: EBUSY"))
	m.SyncDone(family.IPv6, true, time.Millisecond, proxier.SyncResult{}, fmt.Errorf("stopping: %w", context.Canceled))

	const want = `
# HELP kubeproxy_sync_full_proxy_rules_duration_seconds SyncProxyRules latency in seconds for full resyncs
# TYPE kubeproxy_sync_full_proxy_rules_duration_seconds histogram
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.001"} 0
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.002"} 0
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.004"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.008"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.016"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.032"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.064"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.128"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.256"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.512"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="1.024"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="2.048"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="4.096"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="8.192"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="16.384"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 0.003
kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.001"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.002"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.004"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.008"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.016"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.032"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.064"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.128"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.256"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.512"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="1.024"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="2.048"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="4.096"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="8.192"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="16.384"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="+Inf"} 1
kubeproxy_sync_full_proxy_rules_duration_seconds_sum{ip_family="IPv6"} 0.001
kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv6"} 1
# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds The last time proxy rules were successfully synced
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.767323045e+09
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 1.767323055e+09
# HELP dsproxy_kernel_transactions_total Kernel transactions committed by syncs
# TYPE dsproxy_kernel_transactions_total counter
dsproxy_kernel_transactions_total{ip_family="IPv4"} 2
dsproxy_kernel_transactions_total{ip_family="IPv6"} 1
# HELP dsproxy_resync_repairs_total Differences between kernel and expected state found and repaired by full syncs
# TYPE dsproxy_resync_repairs_total counter
dsproxy_resync_repairs_total{ip_family="IPv4"} 5
# HELP dsproxy_sync_errors_total Syncs that failed (and are retried as full syncs)
# TYPE dsproxy_sync_errors_total counter
dsproxy_sync_errors_total{ip_family="IPv6"} 1
`
	if err := collectAndCompare(m, strings.NewReader(want),
		"kubeproxy_sync_full_proxy_rules_duration_seconds",
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds",
		"dsproxy_kernel_transactions_total",
		"dsproxy_resync_repairs_total",
		"dsproxy_sync_errors_total"); err != nil {
		t.Error(err)
	}

	// Every sync, failed or not, is in the total histogram; partial ones in theirs.
	if got := collectAndCount(m.syncLatency); got != 2 {
		t.Errorf("sync_proxy_rules_duration_seconds series: %d, want 2", got)
	}
	for _, c := range []struct {
		h    *prometheus.HistogramVec
		fam  string
		want uint64
	}{
		{m.syncLatency, "IPv4", 1},
		{m.syncLatency, "IPv6", 3},
		{m.syncPartialLatency, "IPv6", 2},
		{m.kernelOps, "IPv4", 1},
		{m.kernelOps, "IPv6", 1},
	} {
		if got := histCount(t, c.h, c.fam); got != c.want {
			t.Errorf("%v{%s} count %d, want %d", c.h, c.fam, got, c.want)
		}
	}
	if got := histSum(t, m.kernelOps, "IPv4"); got != 40 {
		t.Errorf("kernel_transaction_operations{IPv4} sum %v, want 40", got)
	}
}

func histCount(t *testing.T, h *prometheus.HistogramVec, fam string) uint64 {
	t.Helper()
	return histogram(t, h, fam).GetSampleCount()
}

func histSum(t *testing.T, h *prometheus.HistogramVec, fam string) float64 {
	t.Helper()
	return histogram(t, h, fam).GetSampleSum()
}

func histogram(t *testing.T, h *prometheus.HistogramVec, fam string) interface {
	GetSampleCount() uint64
	GetSampleSum() float64
} {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(h)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "ip_family" && l.GetValue() == fam {
					return m.GetHistogram()
				}
			}
		}
	}
	t.Fatalf("no series for %s", fam)
	return nil
}

func TestSyncQueued(t *testing.T) {
	m, clock := newTest()
	m.SyncQueued(family.IPv6)
	clock.Step(1500 * time.Millisecond)
	m.SyncQueued(family.IPv4)
	const want = `
# HELP kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds The last time a sync of proxy rules was queued
# TYPE kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"} 1.7673230465e+09
kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv6"} 1.767323045e+09
`
	if err := collectAndCompare(m.lastQueued, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

func TestObserveProgramming(t *testing.T) {
	m, clock := newTest()
	trigger := epoch.Add(time.Second)
	clock.Step(2*time.Second + 100*time.Millisecond)
	m.ObserveProgramming(family.IPv4, trigger)                   // 1.1s
	m.ObserveProgramming(family.IPv4, time.Time{})               // ignored: no annotation
	m.ObserveProgramming(family.IPv4, epoch.Add(-time.Hour))     // ignored: before start
	m.ObserveProgramming(family.IPv6, trigger.Add(-time.Second)) // ignored: == start
	m.ObserveProgramming(family.IPv6, trigger.Add(time.Second))  // 0.1s
	if got := histCount(t, m.programming, "IPv4"); got != 1 {
		t.Errorf("IPv4 count %d, want 1", got)
	}
	if got := histSum(t, m.programming, "IPv4"); got < 1.099 || got > 1.101 {
		t.Errorf("IPv4 sum %v, want 1.1", got)
	}
	if got := histCount(t, m.programming, "IPv6"); got != 1 {
		t.Errorf("IPv6 count %d, want 1", got)
	}
	// kube-proxy's buckets: 0.25, 0.5, 1..59, 60..115 by 5, 120..300 by 30.
	if len(programmingBuckets) != 2+59+12+7 || programmingBuckets[0] != 0.25 ||
		programmingBuckets[2] != 1 || programmingBuckets[61] != 60 || programmingBuckets[len(programmingBuckets)-1] != 300 {
		t.Errorf("buckets %v", programmingBuckets)
	}
}

func TestTriggerTime(t *testing.T) {
	want := time.Date(2026, 5, 6, 7, 8, 9, 123000000, time.UTC)
	got, ok := TriggerTime(map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-05-06T07:08:09.123Z"})
	if !ok || !got.Equal(want) {
		t.Errorf("TriggerTime = %v, %v; want %v", got, ok, want)
	}
	if _, ok := TriggerTime(nil); ok {
		t.Error("missing annotation parsed")
	}
	if _, ok := TriggerTime(map[string]string{v1.EndpointsLastChangeTriggerTime: "yesterday"}); ok {
		t.Error("bad annotation parsed")
	}
}

func TestChanges(t *testing.T) {
	m, _ := newTest()
	m.SetEndpointChangesPending(family.IPv4, 3)
	m.SetEndpointChangesPending(family.IPv6, 2)
	m.SetServiceChangesPending(family.IPv6, 4)
	if got := toFloat64(m.endpointsPending); got != 5 {
		t.Errorf("endpoint changes pending %v, want 5", got)
	}
	m.SetEndpointChangesPending(family.IPv4, 0)
	if got := toFloat64(m.endpointsPending); got != 2 {
		t.Errorf("endpoint changes pending %v, want 2", got)
	}
	m.AddEndpointChanges(7)
	m.AddServiceChanges(1)
	m.AddServiceChanges(1)
	const want = `
# HELP kubeproxy_sync_proxy_rules_endpoint_changes_pending Pending proxy rules Endpoint changes
# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_pending gauge
kubeproxy_sync_proxy_rules_endpoint_changes_pending 2
# HELP kubeproxy_sync_proxy_rules_endpoint_changes_total Cumulative proxy rules Endpoint changes
# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_total counter
kubeproxy_sync_proxy_rules_endpoint_changes_total 7
# HELP kubeproxy_sync_proxy_rules_service_changes_pending Pending proxy rules Service changes
# TYPE kubeproxy_sync_proxy_rules_service_changes_pending gauge
kubeproxy_sync_proxy_rules_service_changes_pending 4
# HELP kubeproxy_sync_proxy_rules_service_changes_total Cumulative proxy rules Service changes
# TYPE kubeproxy_sync_proxy_rules_service_changes_total counter
kubeproxy_sync_proxy_rules_service_changes_total 2
`
	if err := collectAndCompare(m, strings.NewReader(want),
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending",
		"kubeproxy_sync_proxy_rules_endpoint_changes_total",
		"kubeproxy_sync_proxy_rules_service_changes_pending",
		"kubeproxy_sync_proxy_rules_service_changes_total"); err != nil {
		t.Error(err)
	}
}

func TestProbes(t *testing.T) {
	m, _ := newTest()
	m.ObserveHealthz(200)
	m.ObserveHealthz(503)
	m.ObserveHealthz(200)
	m.ObserveLivez(200)
	const want = `
# HELP kubeproxy_proxy_healthz_total Cumulative proxy healthz HTTP status
# TYPE kubeproxy_proxy_healthz_total counter
kubeproxy_proxy_healthz_total{code="200"} 2
kubeproxy_proxy_healthz_total{code="503"} 1
# HELP kubeproxy_proxy_livez_total Cumulative proxy livez HTTP status
# TYPE kubeproxy_proxy_livez_total counter
kubeproxy_proxy_livez_total{code="200"} 1
`
	if err := collectAndCompare(m, strings.NewReader(want),
		"kubeproxy_proxy_healthz_total", "kubeproxy_proxy_livez_total"); err != nil {
		t.Error(err)
	}
}

func port(name string, mut func(*model.ServicePort), sel model.Selection) *model.PortState {
	sp := &model.ServicePort{
		Name:      model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}, Protocol: v1.ProtocolTCP},
		ClusterIP: netip.MustParseAddr("10.0.0.1"),
		Port:      80,
		Protocol:  v1.ProtocolTCP,
	}
	mut(sp)
	return &model.PortState{ServicePort: sp, Selection: sel}
}

func TestNoLocalEndpoints(t *testing.T) {
	local := []model.Endpoint{{Addr: netip.MustParseAddr("10.1.0.1"), Port: 80, Ready: true, Local: true}}
	remote := []model.Endpoint{{Addr: netip.MustParseAddr("10.2.0.1"), Port: 80, Ready: true}}
	st := model.NewState()
	for _, ps := range []*model.PortState{
		// internal Local, endpoints elsewhere only: counted internal.
		port("itp", func(sp *model.ServicePort) { sp.InternalPolicyLocal = true }, model.Selection{HasAny: true}),
		// internal Local with a local endpoint: not counted.
		port("itp-ok", func(sp *model.ServicePort) { sp.InternalPolicyLocal = true }, model.Selection{Local: local, HasAny: true}),
		// external Local, endpoints elsewhere only: counted external.
		port("etp", func(sp *model.ServicePort) { sp.ExternalPolicyLocal = true; sp.NodePort = 30000 }, model.Selection{Cluster: remote, HasAny: true}),
		// both Local and none here: counted twice.
		port("both", func(sp *model.ServicePort) {
			sp.ExternalPolicyLocal = true
			sp.InternalPolicyLocal = true
			sp.NodePort = 30001
		}, model.Selection{HasAny: true}),
		// no endpoints at all: rejected, not counted.
		port("none", func(sp *model.ServicePort) { sp.InternalPolicyLocal = true; sp.ExternalPolicyLocal = true }, model.Selection{}),
		// Cluster policies: never counted.
		port("cluster", func(*model.ServicePort) {}, model.Selection{Cluster: remote, HasAny: true}),
	} {
		st.Ports[ps.Name] = ps
	}
	in, ex := NoLocalEndpoints(st)
	if in != 2 || ex != 2 {
		t.Errorf("NoLocalEndpoints = %d, %d; want 2, 2", in, ex)
	}
	m, _ := newTest()
	m.SetNoLocalEndpoints(family.IPv6, in, ex)
	m.SetNoLocalEndpoints(family.IPv4, 0, 1)
	const want = `
# HELP kubeproxy_sync_proxy_rules_no_local_endpoints_total Number of services with a Local traffic policy and no endpoints
# TYPE kubeproxy_sync_proxy_rules_no_local_endpoints_total gauge
kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"} 1
kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"} 0
kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="external"} 2
kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="internal"} 2
`
	if err := collectAndCompare(m.noLocalEndpoints, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

func TestHandler(t *testing.T) {
	m, _ := newTest()
	m.SyncDone(family.IPv4, false, time.Millisecond, proxier.SyncResult{}, nil)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for _, s := range []string{
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 1`,
		"# TYPE kubeproxy_sync_proxy_rules_endpoint_changes_pending gauge",
		"go_goroutines ",
		"process_",
	} {
		if !strings.Contains(string(body), s) {
			t.Errorf("/metrics lacks %q", s)
		}
	}
}

func TestConcurrent(t *testing.T) {
	m := New()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f := family.All[i%2]
			for j := range 100 {
				m.SyncDone(f, j%2 == 0, time.Millisecond, proxier.SyncResult{Operations: j, Transactions: 1}, nil)
				m.SetEndpointChangesPending(f, j)
				m.SetServiceChangesPending(f, j)
				m.SyncQueued(f)
			}
		}()
	}
	wg.Wait()
	if got := toFloat64(m.transactions.WithLabelValues("IPv4")); got != 400 {
		t.Errorf("IPv4 transactions %v, want 400", got)
	}
}

// TestIPTablesRuleMetrics: the iptables mode's rule counts and restore failures
// carry kube-proxy's labels and follow each sync.
func TestIPTablesRuleMetrics(t *testing.T) {
	m, _ := newTest()
	m.SyncDone(family.IPv6, true, time.Millisecond, proxier.SyncResult{
		RulesWritten: map[string]int{"nat": 30, "filter": 4}, RulesTotal: map[string]int{"nat": 30, "filter": 4}}, nil)
	m.SyncDone(family.IPv6, false, time.Millisecond, proxier.SyncResult{
		RulesWritten: map[string]int{"nat": 12, "filter": 4}, RulesTotal: map[string]int{"nat": 33, "filter": 4}}, nil)
	m.SyncDone(family.IPv4, false, time.Millisecond, proxier.SyncResult{RestoreFailed: true, PartialRestore: true}, errors.New("x"))
	m.SyncDone(family.IPv4, true, time.Millisecond, proxier.SyncResult{RestoreFailed: true}, errors.New("x"))
	want := `
# HELP kubeproxy_sync_proxy_rules_iptables_last Number of iptables rules written by kube-proxy in last sync
# TYPE kubeproxy_sync_proxy_rules_iptables_last gauge
kubeproxy_sync_proxy_rules_iptables_last{ip_family="IPv6",table="filter"} 4
kubeproxy_sync_proxy_rules_iptables_last{ip_family="IPv6",table="nat"} 12
# HELP kubeproxy_sync_proxy_rules_iptables_total Total number of iptables rules owned by kube-proxy
# TYPE kubeproxy_sync_proxy_rules_iptables_total gauge
kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv6",table="filter"} 4
kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv6",table="nat"} 33
# HELP kubeproxy_sync_proxy_rules_iptables_restore_failures_total Cumulative proxy iptables restore failures
# TYPE kubeproxy_sync_proxy_rules_iptables_restore_failures_total counter
kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"} 2
# HELP kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total Cumulative proxy iptables partial restore failures
# TYPE kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total counter
kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family="IPv4"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want),
		"kubeproxy_sync_proxy_rules_iptables_last", "kubeproxy_sync_proxy_rules_iptables_total",
		"kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
		"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total"); err != nil {
		t.Error(err)
	}
}

// The nftables failure counter counts failed syncs per family; the conntrack
// reconciler metrics time each round and add up the entries it deleted.
func TestNFTablesAndConntrackMetrics(t *testing.T) {
	m, _ := newTest()
	m.SyncDone(family.IPv4, true, time.Millisecond, proxier.SyncResult{NFTablesFailed: true}, errors.New("x"))
	m.SyncDone(family.IPv4, false, time.Millisecond, proxier.SyncResult{NFTablesFailed: true}, errors.New("x"))
	m.SyncDone(family.IPv6, false, time.Millisecond, proxier.SyncResult{}, nil)
	m.ConntrackCleared(family.IPv6, 3*time.Millisecond, 4)
	m.ConntrackCleared(family.IPv6, 20*time.Millisecond, 0)
	m.ConntrackCleared(family.IPv4, time.Millisecond/2, 2)
	want := `
# HELP kubeproxy_sync_proxy_rules_nftables_sync_failures_total Cumulative proxy nftables sync failures
# TYPE kubeproxy_sync_proxy_rules_nftables_sync_failures_total counter
kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"} 2
# HELP kubeproxy_conntrack_reconciler_deleted_entries_total Cumulative conntrack flows deleted by conntrack reconciler
# TYPE kubeproxy_conntrack_reconciler_deleted_entries_total counter
kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"} 2
kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv6"} 4
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want),
		"kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
		"kubeproxy_conntrack_reconciler_deleted_entries_total"); err != nil {
		t.Error(err)
	}
	h := m.conntrackLatency.WithLabelValues("IPv6").(prometheus.Histogram)
	var pb dto.Metric
	if err := h.Write(&pb); err != nil {
		t.Fatal(err)
	}
	if n, sum := pb.GetHistogram().GetSampleCount(), pb.GetHistogram().GetSampleSum(); n != 2 || sum < 0.0229 || sum > 0.0231 {
		t.Errorf("IPv6 conntrack latency: %d samples summing to %v s, want 2 summing to 0.023", n, sum)
	}
}

// The nfacct collector exports each counter that can be read, under kube-proxy's
// names, and skips the others.
func TestNFAcctCollector(t *testing.T) {
	acct := nfacct.NewFake()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewNFAcctCollector(acct))
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Fatalf("before the counters exist: %d series (%v), want 0", n, err)
	}
	if err := acct.Ensure(nfacct.CTStateInvalidDropped); err != nil {
		t.Fatal(err)
	}
	acct.Count(nfacct.CTStateInvalidDropped, 7, 420)
	want := `
# HELP kubeproxy_iptables_ct_state_invalid_dropped_packets_total packets dropped by iptables to work around conntrack problems
# TYPE kubeproxy_iptables_ct_state_invalid_dropped_packets_total counter
kubeproxy_iptables_ct_state_invalid_dropped_packets_total 7
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	if err := acct.Ensure(nfacct.LocalhostNodePortsAccepted); err != nil {
		t.Fatal(err)
	}
	acct.Count(nfacct.LocalhostNodePortsAccepted, 2, 120)
	want += `# HELP kubeproxy_iptables_localhost_nodeports_accepted_packets_total Number of packets accepted on nodeports of loopback interface
# TYPE kubeproxy_iptables_localhost_nodeports_accepted_packets_total counter
kubeproxy_iptables_localhost_nodeports_accepted_packets_total 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	acct.Err = errors.New("netlink: permission denied")
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Errorf("unreadable counters: %d series (%v), want 0", n, err)
	}
}

// TestBuildInfo: kubernetes_build_info as component-base exports it, 1 with the
// build in its labels; major and minor only from a vX.Y version.
func TestBuildInfo(t *testing.T) {
	for v, want := range map[string][2]string{"v1.36.3": {"1", "36"}, "v0.4.0-rc.1": {"0", "4"}, "(devel) 0123456789ab": {}, "v1": {}, "vx.y.z": {}} {
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(NewBuildInfoCollector(BuildInfo{GitVersion: v, GitCommit: "abc", GitTreeState: "clean", GoVersion: "go1.26.8", Compiler: "gc", Platform: "linux/amd64"}))
		mfs, err := reg.Gather()
		if err != nil || len(mfs) != 1 || mfs[0].GetName() != "kubernetes_build_info" || len(mfs[0].GetMetric()) != 1 {
			t.Fatalf("%s: gathered %v, %v", v, mfs, err)
		}
		m := mfs[0].GetMetric()[0]
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if m.GetGauge().GetValue() != 1 || labels["git_version"] != v || labels["major"] != want[0] || labels["minor"] != want[1] ||
			labels["git_commit"] != "abc" || labels["platform"] != "linux/amd64" || len(labels) != 9 {
			t.Errorf("%s: value %v, labels %v; want major %q minor %q", v, m.GetGauge().GetValue(), labels, want[0], want[1])
		}
	}
}
