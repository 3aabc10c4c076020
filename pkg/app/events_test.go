package app

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/types"
)

type fakePoster struct {
	mu     sync.Mutex
	events []*eventsv1.Event
	err    error
}

func (f *fakePoster) PostEvent(_ context.Context, ev *eventsv1.Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, ev)
	return f.err
}

// The Events carry kube-proxy's reasons and types, regard the Node (in the
// default namespace, as client-go puts cluster-scoped objects' Events) or the
// Service, and name dsproxy as the reporting controller.
func TestEvents(t *testing.T) {
	p := &fakePoster{}
	r := newRecorder(p, "node-a")
	r.now = func() time.Time { return time.Unix(1700000000, 5) }
	r.starting("dsproxy v1, nftables mode")
	r.healthCheckFailed(types.NamespacedName{Namespace: "web", Name: "lb"}, 32000, errors.New("address already in use"))
	r.serverFailed("healthz", errors.New("listen tcp :10256: address already in use"))
	r.serverFailed("metrics", errors.New("boom"))
	r.flush(5 * time.Second)
	want := []struct{ ns, kind, name, typ, reason, note string }{
		{"default", "Node", "node-a", "Normal", "Starting", "dsproxy v1, nftables mode"},
		{"web", "Service", "lb", "Warning", "FailedToStartServiceHealthcheck", `node node-a failed to start healthcheck "web/lb" on port 32000: address already in use`},
		{"default", "Node", "node-a", "Warning", "FailedToStartProxierHealthcheck", "listen tcp :10256: address already in use"},
		{"default", "Node", "node-a", "Warning", "FailedToStartMetricServer", "boom"},
	}
	if len(p.events) != len(want) {
		t.Fatalf("%d events, want %d", len(p.events), len(want))
	}
	for _, w := range want {
		found := false
		for _, ev := range p.events {
			if ev.Namespace == w.ns && ev.Regarding.Kind == w.kind && ev.Regarding.Name == w.name && ev.Type == w.typ &&
				ev.Reason == w.reason && ev.Note == w.note && ev.ReportingController == "dsproxy" &&
				ev.ReportingInstance == "dsproxy-node-a" && strings.HasPrefix(ev.Name, w.name+".") && !ev.EventTime.IsZero() {
				found = true
			}
		}
		if !found {
			t.Errorf("no event %+v in %+v", w, p.events)
		}
	}
	// Without an API client there is no recorder, and nothing breaks.
	var none *recorder
	none.starting("x")
	none.healthCheckFailed(types.NamespacedName{Name: "x"}, 1, errors.New("x"))
	none.serverFailed("metrics", errors.New("x"))
	none.flush(time.Second)
}
