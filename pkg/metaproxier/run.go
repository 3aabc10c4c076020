package metaproxier

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// ErrRunning is returned by Run when another Run of the same MetaProxier is executing.
var ErrRunning = errors.New("metaproxier: Run is already executing")

// errEarlyReturn is recorded when a family's Run returns nil before ctx is done.
var errEarlyReturn = errors.New("family Run returned before its context was done")

// Run runs every family's Run concurrently until ctx is done, and returns nil once all
// of them have returned (a family Run that ignores ctx therefore delays it). A family
// whose Run fails, panics or returns early is logged, reported unhealthy and restarted
// with exponential backoff (1s doubling to 30s); the other family is not affected.
func (m *MetaProxier) Run(ctx context.Context) error {
	if !m.active.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer m.active.Store(false)
	var wg sync.WaitGroup
	for _, mb := range m.members {
		wg.Go(func() { m.supervise(ctx, mb) })
	}
	wg.Wait()
	return nil
}

// supervise runs mb's Run until ctx is done, restarting it after failures.
func (m *MetaProxier) supervise(ctx context.Context, mb *member) {
	backoff := restartMin
	for {
		began := m.clock.Now()
		err := mb.run(ctx)
		if ctx.Err() != nil {
			mb.setStopped(nil)
			return
		}
		if err == nil {
			err = errEarlyReturn
		}
		if m.clock.Since(began) >= restartMax {
			backoff = restartMin
		}
		mb.setStopped(err)
		klog.ErrorS(err, "Family proxier stopped; restarting", "ipFamily", mb.fam.Name, "backoff", backoff)
		if !m.sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, restartMax)
		mb.mu.Lock()
		mb.restarts++
		mb.mu.Unlock()
	}
}

// sleep waits for d or ctx, reporting whether d elapsed.
func (m *MetaProxier) sleep(ctx context.Context, d time.Duration) bool {
	t := m.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// run calls the proxier's Run, marking the member running and turning a panic into
// an error.
func (mb *member) run(ctx context.Context) (err error) {
	mb.mu.Lock()
	mb.running = true
	mb.mu.Unlock()
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("family Run panicked: %v", p)
			klog.ErrorS(err, "Family proxier Run panicked", "ipFamily", mb.fam.Name, "stack", string(debug.Stack()))
		}
	}()
	return mb.fp.Run(ctx)
}

// setStopped records that Run is not executing, and why if it failed.
func (mb *member) setStopped(err error) {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	mb.running = false
	mb.stopped = true
	if err != nil {
		mb.runErr = err
	}
}
