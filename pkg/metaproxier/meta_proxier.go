package metaproxier

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// Backoff between restarts of a failed family Run. A Run that lasted at least
// restartMax before failing restarts after restartMin again.
const (
	restartMin = time.Second
	restartMax = 30 * time.Second
)

// MetaProxier dispatches cluster events to one or two FamilyProxiers and runs them.
// Its methods are safe for concurrent use.
type MetaProxier struct {
	members []*member // in family.All order
	clock   clock.Clock
	active  atomic.Bool // Run is executing

	cidrMu sync.Mutex                // serialises ServiceCIDR events and their notifications
	cidrs  map[string][]netip.Prefix // valid CIDRs by ServiceCIDR name
}

// member is one family proxier and what the MetaProxier knows about it.
type member struct {
	fp     FamilyProxier
	fam    *family.Family
	panics atomic.Int64
	cidrs  []netip.Prefix // last list sent to OnServiceCIDRsChanged; guarded by cidrMu

	mu       sync.Mutex
	running  bool
	stopped  bool // Run has returned at least once
	restarts int
	runErr   error
}

// New returns a MetaProxier for one proxier (a single-stack node) or two proxiers of
// different families (dual-stack). It only assembles; nothing runs until Run.
func New(proxiers ...FamilyProxier) (*MetaProxier, error) {
	if len(proxiers) == 0 || len(proxiers) > len(family.All) {
		return nil, fmt.Errorf("metaproxier: need 1 or %d family proxiers, got %d", len(family.All), len(proxiers))
	}
	m := &MetaProxier{
		clock: clock.RealClock{},
		cidrs: map[string][]netip.Prefix{},
	}
	for i, fp := range proxiers {
		if fp == nil {
			return nil, fmt.Errorf("metaproxier: proxier %d is nil", i)
		}
		f := fp.Family()
		if f != family.IPv4 && f != family.IPv6 {
			return nil, fmt.Errorf("metaproxier: proxier %d has unknown family %v", i, f)
		}
		if m.member(f) != nil {
			return nil, fmt.Errorf("metaproxier: two proxiers for %s", f)
		}
		m.members = append(m.members, &member{fp: fp, fam: f})
	}
	slices.SortFunc(m.members, func(a, b *member) int {
		return slices.Index(family.All, a.fam) - slices.Index(family.All, b.fam)
	})
	return m, nil
}

// Families returns the families this MetaProxier serves, in family.All order.
func (m *MetaProxier) Families() []*family.Family {
	fams := make([]*family.Family, len(m.members))
	for i, mb := range m.members {
		fams[i] = mb.fam
	}
	return fams
}

// member returns the member for f, or nil if this node does not proxy f.
func (m *MetaProxier) member(f *family.Family) *member {
	for _, mb := range m.members {
		if mb.fam == f {
			return mb
		}
	}
	return nil
}

// each calls fn for every family, recovering each family's panic separately.
func (m *MetaProxier) each(op string, fn func(FamilyProxier)) {
	for _, mb := range m.members {
		mb.call(op, fn)
	}
}

// call runs fn on the member's proxier; a panic is logged, counted and swallowed.
func (mb *member) call(op string, fn func(FamilyProxier)) {
	defer func() {
		if p := recover(); p != nil {
			mb.panics.Add(1)
			klog.ErrorS(fmt.Errorf("panic: %v", p), "Family proxier handler panicked; event lost for this family",
				"ipFamily", mb.fam.Name, "handler", op, "stack", string(debug.Stack()))
		}
	}()
	fn(mb.fp)
}

// health returns the member's status, calling the proxier's Health safely.
func (mb *member) health() FamilyStatus {
	var st FamilyStatus
	st.Proxier.LastError = errors.New("family proxier's Health panicked")
	mb.call("Health", func(fp FamilyProxier) { st.Proxier = fp.Health() })
	mb.mu.Lock()
	st.Running, st.Restarts, st.RunError = mb.running, mb.restarts, mb.runErr
	started := mb.running || mb.stopped
	mb.mu.Unlock()
	st.HandlerPanics = mb.panics.Load()
	// Before its first Run (the informers still listing) a family is as healthy
	// as its proxier says, as kube-proxy's is while its caches sync: its first
	// sync counts from when Run starts and times out like any change. Once started,
	// a family that is not running (between restarts) is unhealthy.
	st.Healthy = st.Proxier.Healthy && (st.Running || !started)
	return st
}

// Health returns the status of every family this MetaProxier serves.
func (m *MetaProxier) Health() map[*family.Family]FamilyStatus {
	out := make(map[*family.Family]FamilyStatus, len(m.members))
	for _, mb := range m.members {
		out[mb.fam] = mb.health()
	}
	return out
}
