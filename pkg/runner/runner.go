// Package runner decides when one family proxier syncs its rules.
//
// A Runner turns a stream of "something changed" triggers into calls of a sync
// function, one at a time:
//   - an idle runner starts a sync as soon as it is triggered (there is no fixed floor;
//     Options.MinInterval adds one if wanted);
//   - triggers that arrive while a sync runs, or before MinInterval has passed since
//     the last start, are merged into exactly one follow-up sync;
//   - a failed sync (an error or a panic) is retried after an exponential backoff, and
//     the retry is a full sync;
//   - a full sync also runs every Options.FullResyncPeriod to repair drift, and a
//     partial sync (which re-reads node-wide inputs such as addresses) runs when
//     Options.CheckPeriod has passed without any sync.
//
// New only assembles; nothing runs until Run.
package runner

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// Defaults applied by New to zero-valued Options fields.
const (
	DefaultFullResyncPeriod = 15 * time.Minute
	DefaultRetryMin         = 500 * time.Millisecond
	DefaultRetryMax         = 30 * time.Second
)

// SyncFunc programs the family's rules. full asks it to rebuild everything rather than
// apply the changes accumulated since the last successful sync. ctx is the one passed
// to Run; a sync should return promptly once it is done. A returned error (or a panic)
// means the rules may be stale and makes the runner retry with a full sync.
type SyncFunc func(ctx context.Context, full bool) error

// Options tune a Runner. The zero value is usable.
type Options struct {
	// MinInterval is the minimum time between the starts of two syncs. Triggers that
	// arrive sooner are merged into one sync at the earliest allowed start. Zero (the
	// default) means an idle runner syncs as soon as it is triggered.
	MinInterval time.Duration
	// FullResyncPeriod is the time from the start of one full sync to the next periodic
	// full sync. Zero selects DefaultFullResyncPeriod; a negative value disables
	// periodic full syncs. The period starts with the first full sync, so a runner that
	// was never triggered never syncs.
	FullResyncPeriod time.Duration
	// CheckPeriod, if positive, starts a partial sync when that long has passed since
	// the start of the last sync of any kind. A partial sync with nothing to do costs
	// next to nothing but re-reads the node-wide inputs (the node's addresses), so the
	// rules follow them without a trigger. Zero or negative: no periodic partial sync.
	// Like the periodic full sync, it starts only after the first sync.
	CheckPeriod time.Duration
	// RetryMin and RetryMax bound the wait before retrying a failed sync: RetryMin
	// after the first failure, doubling with each consecutive failure, capped at
	// RetryMax. Zero selects the defaults; RetryMax below RetryMin is raised to it.
	// Triggers that arrive during the wait are held for the retry.
	RetryMin, RetryMax time.Duration
	// Clock is the time source; nil means the real clock.
	Clock clock.Clock
}

// Status is a snapshot of a Runner for health checks and metrics.
type Status struct {
	// LastSync is when the last successful sync finished; zero if none has.
	LastSync time.Time
	// LastQueued is when the oldest trigger not yet covered by a successful sync
	// arrived; zero if every trigger has been synced. Periodic resyncs do not set it.
	// Triggers before Run count from when Run starts, as kube-proxy queues
	// nothing for its health check until its caches have synced (its handlers
	// sync only once initialized) and then queues its first sync.
	LastQueued time.Time
	// Started is when Run last started; zero before.
	Started time.Time
	// LastError is the error of the most recent sync, or nil if it succeeded.
	LastError error
	// ConsecutiveFailures counts failed syncs since the last success.
	ConsecutiveFailures int
	// Failures and Panics count failed syncs, and the subset that panicked, since New.
	Failures, Panics int64
	// FullSyncPending is true while the next sync will be full. It is true before the
	// first sync, which is always full.
	FullSyncPending bool
	// Syncing is true while the sync function runs.
	Syncing bool
	// NextRetry is when a failed sync will be retried; zero if none failed.
	NextRetry time.Time
}

// Healthy reports whether no trigger has waited longer than timeout for a successful
// sync, kube-proxy's healthz rule: a runner with a trigger queued since LastQueued is
// unhealthy from LastQueued+timeout until a sync succeeds.
func (s Status) Healthy(now time.Time, timeout time.Duration) bool {
	return s.LastQueued.IsZero() || now.Sub(s.LastQueued) < timeout
}

// Runner schedules the syncs of one family proxier. Its methods are safe for
// concurrent use.
type Runner struct {
	name   string // the family name, logged as "ipFamily"
	sync   SyncFunc
	opts   Options
	wake   chan struct{} // capacity 1: "state changed, look again"
	active atomic.Bool   // Run is executing

	// idleHook, if set (by tests), is called with the loop's decision each time it
	// is about to block.
	idleHook func(decision)

	mu sync.Mutex
	st state
}

// state is the scheduling state, guarded by Runner.mu.
type state struct {
	pending, full bool      // a sync is requested; it must be full
	queued        time.Time // oldest trigger not covered by a successful sync
	covered       time.Time // queued as taken by the sync in flight
	lastStart     time.Time
	lastFullStart time.Time
	retryAt       time.Time // no sync before this (backoff); zero if none
	running       bool
	started       time.Time // when Run last started
	lastSync      time.Time
	lastErr       error
	failures      int
	totalFailures int64
	panics        int64
	gen           uint64 // bumped on every change; lets tests see the loop caught up
}

// New returns a Runner that calls sync for the family called name. It starts nothing:
// syncs happen only while Run runs. The first sync is full.
func New(name string, sync SyncFunc, opts Options) *Runner {
	if opts.MinInterval < 0 {
		opts.MinInterval = 0
	}
	if opts.FullResyncPeriod == 0 {
		opts.FullResyncPeriod = DefaultFullResyncPeriod
	}
	if opts.RetryMin <= 0 {
		opts.RetryMin = DefaultRetryMin
	}
	if opts.RetryMax <= 0 {
		opts.RetryMax = DefaultRetryMax
	}
	opts.RetryMax = max(opts.RetryMax, opts.RetryMin)
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Runner{
		name: name,
		sync: sync,
		opts: opts,
		wake: make(chan struct{}, 1),
		st:   state{full: true},
	}
}

// Trigger requests a sync of the changes recorded since the last one. It never blocks;
// any number of triggers before the sync starts result in one sync.
func (r *Runner) Trigger() { r.request(false) }

// TriggerFull requests a full sync. It never blocks.
func (r *Runner) TriggerFull() { r.request(true) }

func (r *Runner) request(full bool) {
	r.mu.Lock()
	r.st.pending = true
	r.st.full = r.st.full || full
	r.st.gen++
	if r.st.queued.IsZero() && r.active.Load() {
		r.st.queued = r.opts.Clock.Now()
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default: // a wake-up is already posted; the loop reads the state we just wrote
	}
}

// Status returns a snapshot of the runner's state.
func (r *Runner) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &r.st
	queued := s.queued
	if s.running && !s.covered.IsZero() && (queued.IsZero() || s.covered.Before(queued)) {
		// The sync in flight has not delivered what it took yet: as in
		// kube-proxy, a change is pending until a sync with it succeeds.
		queued = s.covered
	}
	return Status{
		LastSync:            s.lastSync,
		LastQueued:          queued,
		Started:             s.started,
		LastError:           s.lastErr,
		ConsecutiveFailures: s.failures,
		Failures:            s.totalFailures,
		Panics:              s.panics,
		FullSyncPending:     s.full,
		Syncing:             s.running,
		NextRetry:           s.retryAt,
	}
}
