package runner

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// wait bounds every blocking step of a test; nothing here sleeps for it in a passing run.
const wait = 5 * time.Second

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// call is one invocation of the fake sync function, held until the test answers it.
type call struct {
	ctx    context.Context
	full   bool
	answer chan func() error
}

func (c *call) done(err error) { c.answer <- func() error { return err } }
func (c *call) panic(v any)    { c.answer <- func() error { panic(v) } }

// harness runs a Runner on a fake clock with a sync function the test steps through.
type harness struct {
	t      *testing.T
	clock  *clocktesting.FakeClock
	r      *Runner
	calls  chan *call
	cancel context.CancelFunc
	done   chan error

	mu   sync.Mutex
	idle decision // the loop's last decision before blocking
	seen bool     // idle is set
}

func newHarness(t *testing.T, opts Options) *harness {
	t.Helper()
	h := &harness{t: t, clock: clocktesting.NewFakeClock(t0), calls: make(chan *call)}
	opts.Clock = h.clock
	if opts.FullResyncPeriod == 0 {
		opts.FullResyncPeriod = time.Hour
	}
	h.r = New("IPv4", h.sync, opts)
	h.r.idleHook = func(d decision) {
		h.mu.Lock()
		h.idle, h.seen = d, true
		h.mu.Unlock()
	}
	h.start()
	t.Cleanup(h.stop)
	return h
}

func (h *harness) sync(ctx context.Context, full bool) error {
	c := &call{ctx: ctx, full: full, answer: make(chan func() error)}
	select {
	case h.calls <- c:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case fn := <-c.answer:
		return fn()
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan error, 1)
	go func() { h.done <- h.r.Run(ctx) }()
}

// stop cancels Run and fails the test unless it returns nil promptly.
func (h *harness) stop() {
	h.t.Helper()
	if h.done == nil {
		return
	}
	h.cancel()
	defer func() { h.done = nil }()
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("Run returned %v, want nil", err)
		}
	case <-time.After(wait):
		h.t.Fatal("Run did not return after cancel")
	}
}

// expectCall waits for the next sync and checks its kind.
func (h *harness) expectCall(full bool) *call {
	h.t.Helper()
	select {
	case c := <-h.calls:
		if c.full != full {
			h.t.Fatalf("sync full=%v, want %v", c.full, full)
		}
		return c
	case <-time.After(wait):
		h.t.Fatalf("no sync (full=%v) started", full)
		return nil
	}
}

// waitIdle waits until the loop has acted on every change made so far and is blocked
// (or about to block) until a trigger or a clock step, and returns when it will wake
// by itself (zero: never).
func (h *harness) waitIdle() time.Time {
	h.t.Helper()
	deadline := time.Now().Add(wait)
	for {
		h.r.mu.Lock()
		gen := h.r.st.gen
		h.r.mu.Unlock()
		h.mu.Lock()
		d, seen := h.idle, h.seen
		h.mu.Unlock()
		if seen && d.gen == gen {
			return d.due
		}
		if time.Now().After(deadline) {
			h.t.Fatal("runner never went idle")
		}
		time.Sleep(time.Millisecond)
	}
}

// expectIdleUntil waits for the loop to block and checks when it will wake.
func (h *harness) expectIdleUntil(want time.Time) {
	h.t.Helper()
	if got := h.waitIdle(); !got.Equal(want) {
		h.t.Fatalf("loop idles until %v, want %v", got, want)
	}
}

// expectNoCall checks that no sync is starting; call it after waitIdle.
func (h *harness) expectNoCall() {
	h.t.Helper()
	select {
	case c := <-h.calls:
		h.t.Fatalf("unexpected sync (full=%v) at %v", c.full, h.clock.Now())
	default:
	}
}

// firstSync runs the initial full sync to completion.
func (h *harness) firstSync() {
	h.t.Helper()
	h.r.Trigger()
	h.expectCall(true).done(nil)
	h.waitIdle()
}

func TestIdleTriggerSyncsAtOnce(t *testing.T) {
	h := newHarness(t, Options{})
	if got := h.r.Status(); !got.FullSyncPending || !got.LastQueued.IsZero() {
		t.Fatalf("before any trigger: %+v", got)
	}
	h.r.Trigger()
	c := h.expectCall(true) // the first sync is full
	if c.ctx.Err() != nil {
		t.Fatal("sync got a done context")
	}
	// The trigger the sync in flight took is pending until it succeeds.
	if got := h.r.Status(); !got.Syncing || !got.LastQueued.Equal(t0) || got.FullSyncPending {
		t.Fatalf("during first sync: %+v", got)
	}
	c.done(nil)
	h.expectIdleUntil(t0.Add(time.Hour)) // the periodic full resync
	h.r.Trigger()
	h.expectCall(false).done(nil) // no floor: the clock has not moved
	h.waitIdle()
	got := h.r.Status()
	if !got.LastSync.Equal(t0) || !got.LastQueued.IsZero() || got.Syncing || got.LastError != nil {
		t.Fatalf("after syncs: %+v", got)
	}
}

// Triggers before Run (the caches syncing) are not late: they count from when
// Run starts, as kube-proxy queues its first sync once initialized.
func TestTriggersBeforeRunQueueAtStart(t *testing.T) {
	h := &harness{t: t, clock: clocktesting.NewFakeClock(t0), calls: make(chan *call)}
	h.r = New("IPv4", h.sync, Options{Clock: h.clock, FullResyncPeriod: time.Hour})
	h.r.idleHook = func(d decision) {
		h.mu.Lock()
		h.idle, h.seen = d, true
		h.mu.Unlock()
	}
	h.r.Trigger()
	h.clock.Step(10 * time.Minute)
	if got := h.r.Status(); !got.LastQueued.IsZero() || !got.Started.IsZero() || !got.Healthy(h.clock.Now(), time.Minute) {
		t.Fatalf("before Run: %+v, want nothing queued, healthy", got)
	}
	h.start()
	t.Cleanup(h.stop)
	c := h.expectCall(true)
	start := t0.Add(10 * time.Minute)
	if got := h.r.Status(); !got.LastQueued.Equal(start) || !got.Started.Equal(start) {
		t.Fatalf("Run started at %v: %+v, want the trigger queued then", start, got)
	}
	h.clock.Step(2 * time.Minute)
	if got := h.r.Status(); got.Healthy(h.clock.Now(), time.Minute) {
		t.Fatalf("first sync running for 2 min: %+v, want unhealthy at a 1 min timeout", got)
	}
	c.done(nil)
	h.waitIdle()
	if got := h.r.Status(); !got.LastQueued.IsZero() || !got.Healthy(h.clock.Now(), time.Minute) {
		t.Fatalf("after the first sync: %+v", got)
	}
}

func TestBurstDuringSyncRunsOneFollowUp(t *testing.T) {
	h := newHarness(t, Options{})
	h.firstSync()
	h.r.Trigger()
	c := h.expectCall(false)
	h.clock.Step(time.Second)
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			for range 100 {
				h.r.Trigger()
			}
		})
	}
	wg.Wait()
	if got := h.r.Status().LastQueued; !got.Equal(t0) {
		t.Errorf("LastQueued = %v, want the trigger of the sync in flight", got)
	}
	c.done(nil)
	h.expectCall(false).done(nil)
	h.waitIdle()
	h.expectNoCall()
	if got := h.r.Status().LastQueued; !got.IsZero() {
		t.Errorf("LastQueued = %v after the follow-up, want zero", got)
	}
}

func TestMinIntervalSpacesStarts(t *testing.T) {
	h := newHarness(t, Options{MinInterval: 2 * time.Second})
	h.firstSync()
	h.r.Trigger()
	h.r.Trigger()
	h.expectIdleUntil(t0.Add(2 * time.Second))
	h.clock.Step(2*time.Second - time.Millisecond)
	h.expectNoCall()
	h.clock.Step(time.Millisecond)
	c := h.expectCall(false)
	// A sync longer than MinInterval is followed at once: the gap is start to start.
	h.r.Trigger()
	h.clock.Step(3 * time.Second)
	c.done(nil)
	h.expectCall(false).done(nil)
}

func TestFailureBacksOffThenSyncsFull(t *testing.T) {
	h := newHarness(t, Options{RetryMin: time.Second, RetryMax: 4 * time.Second})
	h.firstSync()
	h.r.Trigger()
	queuedAt := h.clock.Now()
	h.expectCall(false).done(errors.New("netlink: EBUSY"))
	h.waitIdle()
	st := h.r.Status()
	if st.LastError == nil || st.ConsecutiveFailures != 1 || !st.FullSyncPending ||
		!st.LastQueued.Equal(queuedAt) || !st.NextRetry.Equal(h.clock.Now().Add(time.Second)) {
		t.Fatalf("after a failure: %+v", st)
	}
	h.r.Trigger() // held for the retry
	for i, d := range []time.Duration{1, 2, 4, 4} {
		d *= time.Second
		h.expectIdleUntil(h.clock.Now().Add(d))
		h.clock.Step(d - time.Millisecond)
		h.expectNoCall()
		h.clock.Step(time.Millisecond)
		c := h.expectCall(true)
		if i < 3 {
			c.done(errors.New("netlink: EBUSY"))
		} else {
			c.done(nil)
		}
	}
	h.waitIdle()
	st = h.r.Status()
	if st.LastError != nil || st.ConsecutiveFailures != 0 || st.Failures != 4 ||
		!st.LastQueued.IsZero() || !st.NextRetry.IsZero() {
		t.Fatalf("after recovery: %+v", st)
	}
	h.r.Trigger() // backoff is over: immediate, partial
	h.expectCall(false).done(nil)
}

func TestPanicIsRecoveredAndRetried(t *testing.T) {
	h := newHarness(t, Options{RetryMin: time.Second})
	h.firstSync()
	h.r.Trigger()
	h.expectCall(false).panic("index out of range")
	h.expectIdleUntil(t0.Add(time.Second))
	st := h.r.Status()
	if st.Panics != 1 || st.Failures != 1 || st.LastError == nil ||
		!strings.Contains(st.LastError.Error(), "index out of range") {
		t.Fatalf("after a panic: %+v", st)
	}
	h.clock.Step(time.Second)
	h.expectCall(true).done(nil)
	h.waitIdle()
	if st := h.r.Status(); st.LastError != nil || st.Panics != 1 {
		t.Fatalf("after the retry: %+v", st)
	}
}

func TestPeriodicFullResync(t *testing.T) {
	h := newHarness(t, Options{FullResyncPeriod: 10 * time.Minute})
	h.firstSync()
	h.clock.Step(5 * time.Minute)
	h.r.Trigger()
	h.expectCall(false).done(nil) // a partial sync does not restart the period
	h.expectIdleUntil(t0.Add(10 * time.Minute))
	h.clock.Step(5*time.Minute - time.Millisecond)
	h.expectNoCall()
	h.clock.Step(time.Millisecond)
	h.expectCall(true).done(nil)
	if st := h.r.Status(); !st.LastQueued.IsZero() {
		t.Errorf("a periodic resync set LastQueued: %+v", st)
	}
	h.waitIdle()
	h.clock.Step(10 * time.Minute)
	h.expectCall(true).done(nil)
}

func TestPeriodicCheck(t *testing.T) {
	h := newHarness(t, Options{FullResyncPeriod: time.Hour, CheckPeriod: 30 * time.Second})
	h.expectIdleUntil(time.Time{}) // nothing before the first sync
	h.firstSync()
	h.expectIdleUntil(t0.Add(30 * time.Second))
	h.clock.Step(20 * time.Second)
	h.r.Trigger()
	h.expectCall(false).done(nil) // any sync restarts the check period
	h.expectIdleUntil(t0.Add(50 * time.Second))
	h.clock.Step(30*time.Second - time.Millisecond)
	h.expectNoCall()
	h.clock.Step(time.Millisecond)
	h.expectCall(false).done(nil)
	if st := h.r.Status(); !st.LastQueued.IsZero() {
		t.Errorf("a periodic check set LastQueued: %+v", st)
	}
	h.waitIdle()
	// The full resync keeps its own period and wins when both are due.
	h.clock.Step(time.Hour)
	h.expectCall(true).done(nil)
}

func TestPeriodicResyncDisabled(t *testing.T) {
	h := newHarness(t, Options{FullResyncPeriod: -1})
	h.r.Trigger()
	h.expectCall(true).done(nil)
	h.r.Trigger()
	h.expectCall(false).done(nil)
	h.expectIdleUntil(time.Time{})
}

func TestTriggerFull(t *testing.T) {
	h := newHarness(t, Options{})
	h.firstSync()
	h.r.TriggerFull()
	h.expectCall(true).done(nil)
	h.r.Trigger()
	c := h.expectCall(false)
	h.r.Trigger()
	h.r.TriggerFull()
	h.r.Trigger()
	if !h.r.Status().FullSyncPending {
		t.Error("FullSyncPending = false after TriggerFull")
	}
	c.done(nil)
	h.expectCall(true).done(nil)
}

func TestRunStopsOnCancel(t *testing.T) {
	h := newHarness(t, Options{})
	h.firstSync()
	h.r.Trigger()
	c := h.expectCall(false)
	if err := h.r.Run(context.Background()); !errors.Is(err, ErrRunning) {
		t.Fatalf("second Run = %v, want ErrRunning", err)
	}
	h.stop() // the in-flight sync sees ctx done and returns its error
	if c.ctx.Err() == nil {
		t.Fatal("sync context not cancelled")
	}
	st := h.r.Status()
	if st.ConsecutiveFailures != 0 || !st.FullSyncPending || st.LastQueued.IsZero() || st.Syncing {
		t.Fatalf("after an interrupted sync: %+v", st)
	}
	h.start() // Run again: the interrupted request runs at once, as a full sync
	h.expectCall(true).done(nil)
	h.waitIdle()
	h.stop() // idle: returns at once
}

func TestBackoff(t *testing.T) {
	r := New("IPv6", nil, Options{RetryMin: 100 * time.Millisecond, RetryMax: time.Second})
	for n, want := range map[int]time.Duration{
		1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond,
		5: time.Second, 1000: time.Second,
	} {
		if got := r.backoff(n); got != want {
			t.Errorf("backoff(%d) = %v, want %v", n, got, want)
		}
	}
}

func TestNewDefaults(t *testing.T) {
	r := New("IPv4", nil, Options{MinInterval: -1, RetryMin: 2 * time.Minute})
	want := Options{FullResyncPeriod: DefaultFullResyncPeriod, RetryMin: 2 * time.Minute, RetryMax: 2 * time.Minute}
	got := r.opts
	got.Clock = nil
	if got != want {
		t.Errorf("opts = %+v, want %+v", got, want)
	}
}

func TestStatusHealthy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		queued time.Time
		want   bool
	}{
		{"nothing queued", time.Time{}, true},
		{"queued recently", t0.Add(-time.Second), true},
		{"queued too long", t0.Add(-time.Minute), false},
	} {
		if got := (Status{LastQueued: tc.queued}).Healthy(t0, 10*time.Second); got != tc.want {
			t.Errorf("%s: Healthy = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// BenchmarkTrigger measures the informer-side cost of a trigger while a sync runs.
func BenchmarkTrigger(b *testing.B) {
	r := New("IPv4", nil, Options{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r.Trigger()
		}
	})
}
