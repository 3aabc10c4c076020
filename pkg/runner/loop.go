package runner

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"k8s.io/klog/v2"
)

// ErrRunning is returned by Run when another Run of the same Runner is executing.
var ErrRunning = errors.New("runner: Run is already executing")

// Run calls the sync function as triggers, retries and periodic resyncs require, until
// ctx is done. It passes ctx to the sync function and returns nil after the sync in
// flight (if any) has returned. A failing or panicking sync never stops Run. Run may be
// called again after it returned; requests made meanwhile are kept.
func (r *Runner) Run(ctx context.Context) error {
	if !r.active.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer r.active.Store(false)
	r.mu.Lock()
	now := r.opts.Clock.Now()
	r.st.started = now
	if r.st.queued.IsZero() && r.st.pending {
		// What was triggered before Run counts from now (Status.LastQueued).
		r.st.queued = now
		r.st.gen++
	}
	r.mu.Unlock()
	klog.V(2).InfoS("Sync runner started", "ipFamily", r.name)
	defer klog.V(2).InfoS("Sync runner stopped", "ipFamily", r.name)
	for ctx.Err() == nil {
		// Drop a stale wake-up: next reads the state it announced.
		select {
		case <-r.wake:
		default:
		}
		d := r.next(r.opts.Clock.Now())
		if d.start {
			r.runOnce(ctx, d.full)
			continue
		}
		r.wait(ctx, d)
	}
	return nil
}

// decision is what the loop does next: start a sync of the given kind, or wait
// until due (zero: until a trigger). gen is the state generation it was based on.
type decision struct {
	start, full bool
	due         time.Time
	gen         uint64
}

// wait blocks until ctx is done, a trigger arrives, or d.due (if set) is reached.
func (r *Runner) wait(ctx context.Context, d decision) {
	var fire <-chan time.Time
	if !d.due.IsZero() {
		left := d.due.Sub(r.opts.Clock.Now())
		if left <= 0 {
			return
		}
		t := r.opts.Clock.NewTimer(left)
		defer t.Stop()
		fire = t.C()
	}
	if r.idleHook != nil {
		r.idleHook(d)
	}
	select {
	case <-ctx.Done():
	case <-r.wake:
	case <-fire:
	}
}

// next decides at now whether a sync starts, and if so records the start.
func (r *Runner) next(now time.Time) decision {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &r.st
	nextFull := r.nextFullLocked()
	if !nextFull.IsZero() && !now.Before(nextFull) && !(s.pending && s.full) {
		s.pending, s.full = true, true
		s.gen++
	}
	nextCheck := r.nextCheckLocked()
	if !nextCheck.IsZero() && !now.Before(nextCheck) && !s.pending {
		s.pending = true
		s.gen++
	}
	if !s.pending {
		return decision{due: earliest(nextFull, nextCheck), gen: s.gen}
	}
	if due := later(s.retryAt, s.lastStart.Add(r.opts.MinInterval)); now.Before(due) {
		return decision{due: due, gen: s.gen}
	}
	d := decision{start: true, full: s.full}
	s.pending, s.full, s.running = false, false, true
	s.covered, s.queued = s.queued, time.Time{}
	s.lastStart = now
	if d.full {
		s.lastFullStart = now
	}
	s.gen++
	return d
}

// nextFullLocked returns when the periodic full sync is due, or zero if none is.
func (r *Runner) nextFullLocked() time.Time {
	if r.opts.FullResyncPeriod <= 0 || r.st.lastFullStart.IsZero() {
		return time.Time{}
	}
	return r.st.lastFullStart.Add(r.opts.FullResyncPeriod)
}

// nextCheckLocked returns when the periodic partial sync is due, or zero if none is.
func (r *Runner) nextCheckLocked() time.Time {
	if r.opts.CheckPeriod <= 0 || r.st.lastStart.IsZero() {
		return time.Time{}
	}
	return r.st.lastStart.Add(r.opts.CheckPeriod)
}

// earliest returns the earlier of two times, ignoring zeros.
func earliest(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero() || a.Before(b):
		return a
	}
	return b
}

// runOnce calls the sync function and records its outcome.
func (r *Runner) runOnce(ctx context.Context, full bool) {
	begin := r.opts.Clock.Now()
	err := r.call(ctx, full)
	took := r.opts.Clock.Since(begin)
	shutdown := err != nil && ctx.Err() != nil
	retryIn, failures := r.finish(err, shutdown)
	switch {
	case err == nil:
		klog.V(4).InfoS("Sync done", "ipFamily", r.name, "full", full, "duration", took)
	case shutdown:
		klog.V(2).InfoS("Sync interrupted by shutdown", "ipFamily", r.name, "full", full, "err", err)
	default:
		klog.ErrorS(err, "Sync failed; retrying with a full sync", "ipFamily", r.name,
			"full", full, "duration", took, "retryIn", retryIn, "consecutiveFailures", failures)
	}
}

// call runs the sync function, turning a panic into an error.
func (r *Runner) call(ctx context.Context, full bool) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("sync panicked: %v", p)
			klog.ErrorS(err, "Sync panicked", "ipFamily", r.name, "stack", string(debug.Stack()))
			r.mu.Lock()
			r.st.panics++
			r.mu.Unlock()
		}
	}()
	return r.sync(ctx, full)
}

// finish records the outcome of the sync in flight. On failure the request it covered
// is re-queued as a full sync; unless the failure is due to shutdown it counts, and
// the retry waits for a backoff, which finish returns with the failure count.
func (r *Runner) finish(err error, shutdown bool) (retryIn time.Duration, failures int) {
	now := r.opts.Clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &r.st
	s.running = false
	s.gen++
	if err == nil {
		s.lastSync, s.lastErr, s.failures, s.retryAt = now, nil, 0, time.Time{}
		return 0, 0
	}
	s.pending, s.full = true, true
	if !s.covered.IsZero() && (s.queued.IsZero() || s.covered.Before(s.queued)) {
		s.queued = s.covered
	}
	if shutdown {
		return 0, s.failures
	}
	s.lastErr = err
	s.failures++
	s.totalFailures++
	retryIn = r.backoff(s.failures)
	s.retryAt = now.Add(retryIn)
	return retryIn, s.failures
}

// backoff returns the wait before retrying after n consecutive failures.
func (r *Runner) backoff(n int) time.Duration {
	d := r.opts.RetryMin
	for i := 1; i < n && d < r.opts.RetryMax; i++ {
		d *= 2
	}
	return min(d, r.opts.RetryMax)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
