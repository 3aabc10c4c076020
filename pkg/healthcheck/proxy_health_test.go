package healthcheck

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/metaproxier"
	"github.com/dsproxy/dsproxy/pkg/metrics"
)

// The metrics package counts probes.
var _ ProbeRecorder = (*metrics.Metrics)(nil)

var t0 = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// fakeProxy is a HealthFunc source and clock the tests move by hand.
type fakeProxy struct {
	mu     sync.Mutex
	now    time.Time
	status map[*family.Family]metaproxier.FamilyStatus
}

func newFakeProxy() *fakeProxy {
	return &fakeProxy{now: t0, status: map[*family.Family]metaproxier.FamilyStatus{}}
}

func (p *fakeProxy) Now() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.now
}

func (p *fakeProxy) Step(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.now = p.now.Add(d)
}

func (p *fakeProxy) Health() map[*family.Family]metaproxier.FamilyStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[*family.Family]metaproxier.FamilyStatus{}
	for f, s := range p.status {
		out[f] = s
	}
	return out
}

// set records f's state: healthy or not, last successful sync at lastSync.
func (p *fakeProxy) set(f *family.Family, healthy bool, lastSync time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.status[f] = metaproxier.FamilyStatus{
		Healthy: healthy,
		Running: true,
		Proxier: metaproxier.Health{Healthy: healthy, LastSync: lastSync},
	}
}

type fakeRecorder struct {
	mu      sync.Mutex
	healthz map[int]int
	livez   map[int]int
}

func (r *fakeRecorder) ObserveHealthz(code int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.healthz[code]++
}

func (r *fakeRecorder) ObserveLivez(code int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.livez[code]++
}

func makeNode(tweaks ...func(*v1.Node)) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
	for _, tw := range tweaks {
		tw(n)
	}
	return n
}

func tainted(key string) func(*v1.Node) {
	return func(n *v1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, v1.Taint{Key: key, Effect: v1.TaintEffectNoSchedule})
	}
}

func deleting(n *v1.Node) {
	ts := metav1.NewTime(t0)
	n.DeletionTimestamp = &ts
}

type probe struct {
	code   int
	header http.Header
	body   string
	health ProxyHealth
}

func get(t *testing.T, h http.Handler, path string) probe {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	p := probe{code: rec.Code, header: rec.Header(), body: rec.Body.String()}
	if err := json.Unmarshal(rec.Body.Bytes(), &p.health); err != nil {
		t.Fatalf("%s: body %q: %v", path, p.body, err)
	}
	if ct := p.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q", path, ct)
	}
	if v := p.header.Get("X-Content-Type-Options"); v != "nosniff" {
		t.Errorf("%s: X-Content-Type-Options %q", path, v)
	}
	return p
}

func newServer(p *fakeProxy, r ProbeRecorder) *ProxyHealthServer {
	return NewProxyHealthServer(ProxyHealthConfig{Health: p.Health, Now: p.Now, Recorder: r, Logger: logr.Discard()})
}

func TestHealthzBody(t *testing.T) {
	p := newFakeProxy()
	s := newServer(p, nil)
	s.SetNode(makeNode())
	p.set(family.IPv4, true, t0.Add(-3*time.Second))
	p.set(family.IPv6, true, t0.Add(-time.Second))
	h := s.Handler()

	// Healthy: lastUpdated is the current time, as in kube-proxy.
	got := get(t, h, "/healthz")
	const want200 = `{"lastUpdated":"2026-03-04T05:06:07Z","currentTime":"2026-03-04T05:06:07Z","nodeEligible":true,"healthy":true,` +
		`"status":{"IPv4":{"lastUpdated":"2026-03-04T05:06:04Z","healthy":true},"IPv6":{"lastUpdated":"2026-03-04T05:06:06Z","healthy":true}}}`
	if got.code != http.StatusOK || got.body != want200 {
		t.Errorf("healthy /healthz = %d %s\nwant 200 %s", got.code, got.body, want200)
	}

	// IPv6 unhealthy: lastUpdated is the latest successful sync of any family.
	p.Step(5 * time.Minute)
	p.set(family.IPv6, false, t0.Add(-time.Second))
	got = get(t, h, "/healthz")
	const want503 = `{"lastUpdated":"2026-03-04T05:06:06Z","currentTime":"2026-03-04T05:11:07Z","nodeEligible":true,"healthy":false,` +
		`"status":{"IPv4":{"lastUpdated":"2026-03-04T05:06:04Z","healthy":true},"IPv6":{"lastUpdated":"2026-03-04T05:06:06Z","healthy":false}}}`
	if got.code != http.StatusServiceUnavailable || got.body != want503 {
		t.Errorf("unhealthy /healthz = %d %s\nwant 503 %s", got.code, got.body, want503)
	}

	// /livez never carries nodeEligible.
	got = get(t, h, "/livez")
	if got.code != http.StatusServiceUnavailable || strings.Contains(got.body, "nodeEligible") {
		t.Errorf("unhealthy /livez = %d %s", got.code, got.body)
	}

	// A family that has not synced yet reads as updated when its sync loop
	// started, as kube-proxy marks it at SyncLoop's start.
	p.mu.Lock()
	p.status[family.IPv6] = metaproxier.FamilyStatus{Healthy: false, Running: true,
		Proxier: metaproxier.Health{Started: t0.Add(2 * time.Second)}}
	p.mu.Unlock()
	got = get(t, h, "/healthz")
	const wantStarted = `{"lastUpdated":"2026-03-04T05:06:09Z","currentTime":"2026-03-04T05:11:07Z","nodeEligible":true,"healthy":false,` +
		`"status":{"IPv4":{"lastUpdated":"2026-03-04T05:06:04Z","healthy":true},"IPv6":{"lastUpdated":"2026-03-04T05:06:09Z","healthy":false}}}`
	if got.body != wantStarted {
		t.Errorf("/healthz before IPv6's first sync = %s\nwant %s", got.body, wantStarted)
	}
}

func TestHealthzTransitions(t *testing.T) {
	p := newFakeProxy()
	rec := &fakeRecorder{healthz: map[int]int{}, livez: map[int]int{}}
	s := newServer(p, rec)
	h := s.Handler()
	s.SetNode(makeNode())

	check := func(step string, healthz, livez int) {
		t.Helper()
		hz, lz := get(t, h, "/healthz"), get(t, h, "/livez")
		if hz.code != healthz || lz.code != livez {
			t.Errorf("%s: /healthz %d /livez %d, want %d %d", step, hz.code, lz.code, healthz, livez)
		}
		if hz.health.CurrentTime != p.Now() || lz.health.CurrentTime != p.Now() {
			t.Errorf("%s: currentTime %v %v, want %v", step, hz.health.CurrentTime, lz.health.CurrentTime, p.Now())
		}
		if hz.code == http.StatusOK && !hz.health.LastUpdated.Equal(p.Now()) {
			t.Errorf("%s: 200 with lastUpdated %v, want now", step, hz.health.LastUpdated)
		}
	}

	// No families yet: healthy, as kube-proxy before its proxiers register.
	check("no families", 200, 200)
	p.set(family.IPv4, true, time.Time{})
	p.set(family.IPv6, true, time.Time{})
	check("starting", 200, 200)
	p.Step(time.Second)
	p.set(family.IPv4, true, p.Now())
	p.set(family.IPv6, true, p.Now())
	check("synced", 200, 200)

	// A family whose queued change has waited too long turns unhealthy...
	p.Step(3 * time.Minute)
	p.set(family.IPv4, false, t0.Add(time.Second))
	check("IPv4 late", 503, 503)
	hz := get(t, h, "/healthz")
	if hz.health.Status[v1.IPv4Protocol].Healthy || !hz.health.Status[v1.IPv6Protocol].Healthy {
		t.Errorf("per-family status %+v", hz.health.Status)
	}
	if !hz.health.LastUpdated.Equal(t0.Add(time.Second)) {
		t.Errorf("503 lastUpdated %v, want the last sync %v", hz.health.LastUpdated, t0.Add(time.Second))
	}
	// ...and healthy again once it syncs.
	p.Step(time.Second)
	p.set(family.IPv4, true, p.Now())
	check("IPv4 recovered", 200, 200)

	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.healthz[200] != 4 || rec.healthz[503] != 2 || rec.livez[200] != 4 || rec.livez[503] != 1 {
		t.Errorf("recorded healthz %v livez %v", rec.healthz, rec.livez)
	}
}

func TestNodeEligibility(t *testing.T) {
	p := newFakeProxy()
	p.set(family.IPv4, true, t0)
	s := newServer(p, nil)
	h := s.Handler()
	for _, c := range []struct {
		name     string
		node     *v1.Node
		set      bool
		eligible bool
	}{
		{name: "node not seen yet", eligible: false},
		{name: "plain node", node: makeNode(), set: true, eligible: true},
		{name: "other taint", node: makeNode(tainted("other")), set: true, eligible: true},
		{name: "to be deleted by autoscaler", node: makeNode(tainted("other"), tainted(ToBeDeletedTaint)), set: true, eligible: false},
		{name: "taint removed", node: makeNode(), set: true, eligible: true},
		{name: "being deleted", node: makeNode(deleting), set: true, eligible: false},
		{name: "forgotten", node: nil, set: true, eligible: false},
	} {
		if c.set {
			s.SetNode(c.node)
		}
		if got := s.NodeEligible(); got != c.eligible {
			t.Errorf("%s: NodeEligible %v, want %v", c.name, got, c.eligible)
		}
		hz := get(t, h, "/healthz")
		wantCode := http.StatusOK
		if !c.eligible {
			wantCode = http.StatusServiceUnavailable
		}
		if hz.code != wantCode || hz.health.NodeEligible == nil || *hz.health.NodeEligible != c.eligible || !hz.health.Healthy {
			t.Errorf("%s: /healthz %d %s", c.name, hz.code, hz.body)
		}
		// /livez ignores the node.
		if lz := get(t, h, "/livez"); lz.code != http.StatusOK || lz.health.NodeEligible != nil {
			t.Errorf("%s: /livez %d %s", c.name, lz.code, lz.body)
		}
	}
}

func TestSetNodeDoesNotRetain(t *testing.T) {
	s := newServer(newFakeProxy(), nil)
	n := makeNode()
	s.SetNode(n)
	tainted(ToBeDeletedTaint)(n) // the caller's object changes afterwards
	if !s.NodeEligible() {
		t.Error("SetNode retained the Node")
	}
}

func TestServeAndStop(t *testing.T) {
	p := newFakeProxy()
	p.set(family.IPv4, true, t0)
	s := newServer(p, nil)
	s.SetNode(makeNode(tainted(ToBeDeletedTaint)))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, l) }()

	base := "http://" + l.Addr().String()
	for path, want := range map[string]int{"/healthz": 503, "/livez": 200, "/other": 404} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve returned %v after cancel", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not stop")
	}
	if _, err := http.Get(base + "/livez"); err == nil {
		t.Error("still serving after stop")
	}
}

func TestRun(t *testing.T) {
	s := newServer(newFakeProxy(), nil)
	// A bad address fails at once.
	if err := s.Run(context.Background(), "256.0.0.1:1"); err == nil {
		t.Error("Run on a bad address succeeded")
	}
	// An address in use fails at once.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := s.Run(context.Background(), l.Addr().String()); err == nil {
		t.Error("Run on an address in use succeeded")
	}
	// Run stops cleanly.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, "127.0.0.1:0") }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not stop")
	}
}
