package metaproxier

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dsproxy/dsproxy/pkg/endpointslice"
	"github.com/dsproxy/dsproxy/pkg/family"
)

// recorder is a FamilyProxier that records the events it receives; the fan-out is
// what the tests examine, so a call recorder is the right fake here.
type recorder struct {
	fam *family.Family

	mu       sync.Mutex
	events   []string
	cidrs    [][]netip.Prefix
	panics   bool                              // every handler and Health panic
	health   Health                            // returned by Health
	runs     []func(ctx context.Context) error // Run's behaviour per call; the last repeats
	runCalls int
	onEvent  func() // called after recording an event (e.g. to trigger a sync)
}

func newRecorder(f *family.Family) *recorder {
	return &recorder{fam: f, health: Health{Healthy: true}}
}

func (r *recorder) record(op string, obj interface{ GetName() string }) {
	r.mu.Lock()
	panics, onEvent := r.panics, r.onEvent
	if !panics {
		r.events = append(r.events, op+" "+obj.GetName())
	}
	r.mu.Unlock()
	if panics {
		panic(fmt.Sprintf("%s handler bug", r.fam))
	}
	if onEvent != nil {
		onEvent()
	}
}

// take returns and clears the recorded events.
func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events
	r.events = nil
	return ev
}

// takeCIDRs returns and clears the recorded OnServiceCIDRsChanged lists.
func (r *recorder) takeCIDRs() [][]netip.Prefix {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.cidrs
	r.cidrs = nil
	return c
}

func (r *recorder) runCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runCalls
}

func (r *recorder) Family() *family.Family { return r.fam }

func (r *recorder) OnServiceAdd(s *v1.Service)       { r.record("ServiceAdd", s) }
func (r *recorder) OnServiceUpdate(_, s *v1.Service) { r.record("ServiceUpdate", s) }
func (r *recorder) OnServiceDelete(s *v1.Service)    { r.record("ServiceDelete", s) }
func (r *recorder) OnNodeAdd(n *v1.Node)             { r.record("NodeAdd", n) }
func (r *recorder) OnNodeUpdate(_, n *v1.Node)       { r.record("NodeUpdate", n) }
func (r *recorder) OnNodeDelete(n *v1.Node)          { r.record("NodeDelete", n) }

func (r *recorder) OnEndpointSliceAdd(s *endpointslice.Object) { r.record("SliceAdd", s) }
func (r *recorder) OnEndpointSliceUpdate(_, s *endpointslice.Object) {
	r.record("SliceUpdate", s)
}
func (r *recorder) OnEndpointSliceDelete(s *endpointslice.Object) { r.record("SliceDelete", s) }

func (r *recorder) OnServiceCIDRsChanged(cidrs []netip.Prefix) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.panics {
		panic("cidr handler bug")
	}
	r.cidrs = append(r.cidrs, cidrs)
}

func (r *recorder) Run(ctx context.Context) error {
	r.mu.Lock()
	r.runCalls++
	run := func(ctx context.Context) error { <-ctx.Done(); return nil }
	if len(r.runs) > 0 {
		run = r.runs[min(r.runCalls, len(r.runs))-1]
	}
	r.mu.Unlock()
	return run(ctx)
}

func (r *recorder) Health() Health {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.panics {
		panic("health bug")
	}
	return r.health
}

var _ FamilyProxier = (*recorder)(nil)

func svc(name string) *v1.Service { return &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}} }
func node(name string) *v1.Node   { return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}} }

// slice is an ingested slice of type t: unusable (no namespace), which the
// routing must not care about.
func slice(name string, t discovery.AddressType) *endpointslice.Object {
	return endpointslice.Ingest(&discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, AddressType: t}, "")
}

func prefixes(ss ...string) []netip.Prefix {
	out := []netip.Prefix{}
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func equalCIDRLists(a, b [][]netip.Prefix) bool {
	return slices.EqualFunc(a, b, func(x, y []netip.Prefix) bool { return slices.Equal(x, y) })
}
