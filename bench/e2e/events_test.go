//go:build e2e && netns

package e2e

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// eventLog records when the API server's watch events about the load's
// namespace reach a watcher of its own in the benchmark process: the moment a
// proxy could have learnt of a change at the earliest. A change's latency then
// splits into API (write → event) and proxy (event → kernel), the same way for
// every proxy; only the second is the proxy's doing.
type eventLog struct {
	mu  sync.Mutex
	evs []event
	// sched, while set (see arm), is read as each event arrives: what the
	// scheduler had accounted to etcd and kube-apiserver by then.
	sched atomic.Pointer[func() (schedStat, bool)]
}

type event struct {
	at   time.Time
	kind string // "Service" or "EndpointSlice"
	name string
	typ  watch.EventType
	// cp is the control plane's schedStat when the event arrived; cpOK is
	// false if the log was not armed then or the read failed.
	cp   schedStat
	cpOK bool
}

// arm makes the log read sched as each event arrives, until disarm is called.
// It costs a read of every control-plane thread's schedstat per event, so
// the load (tens of thousands of events) runs disarmed.
func (l *eventLog) arm(sched func() (schedStat, bool)) (disarm func()) {
	l.sched.Store(&sched)
	return func() { l.sched.Store(nil) }
}

// watchEvents starts recording Service and EndpointSlice events in namespace ns
// from now on, until ctx is done.
func watchEvents(ctx context.Context, client kubernetes.Interface, ns string) (*eventLog, error) {
	l := &eventLog{}
	type lister struct {
		kind  string
		list  func(context.Context, metav1.ListOptions) (string, error)
		watch func(context.Context, metav1.ListOptions) (watch.Interface, error)
	}
	svcs, slices := client.CoreV1().Services(ns), client.DiscoveryV1().EndpointSlices(ns)
	for _, w := range []lister{
		{"Service", listRV(svcs.List), svcs.Watch},
		{"EndpointSlice", listRV(slices.List), slices.Watch},
	} {
		// The current resource version, without the objects.
		rv, err := w.list(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			return nil, fmt.Errorf("listing %ss: %w", w.kind, err)
		}
		rw, err := watchtools.NewRetryWatcherWithContext(ctx, rv, &cache.ListWatch{
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return w.watch(ctx, o) },
		})
		if err != nil {
			return nil, err
		}
		go func() {
			defer rw.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case ev, ok := <-rw.ResultChan():
					if !ok {
						return
					}
					at := time.Now()
					name := objectName(ev.Object)
					if name == "" {
						continue // a bookmark or an error status
					}
					e := event{at: at, kind: w.kind, name: name, typ: ev.Type}
					if sched := l.sched.Load(); sched != nil {
						e.cp, e.cpOK = (*sched)()
					}
					l.mu.Lock()
					l.evs = append(l.evs, e)
					l.mu.Unlock()
				}
			}
		}()
	}
	return l, nil
}

// listRV turns a typed List into one that returns only the list's resource version.
func listRV[L interface{ GetResourceVersion() string }](list func(context.Context, metav1.ListOptions) (L, error)) func(context.Context, metav1.ListOptions) (string, error) {
	return func(ctx context.Context, o metav1.ListOptions) (string, error) {
		r, err := list(ctx, o)
		if err != nil {
			return "", err
		}
		return r.GetResourceVersion(), nil
	}
}

func objectName(o runtime.Object) string {
	if m, ok := o.(metav1.Object); ok {
		return m.GetName()
	}
	return ""
}

// first returns when the first event of typ about kind/name at or after after
// arrived, waiting up to a second for it (the probe may see the kernel change
// before this process's watch delivers it).
func (l *eventLog) first(kind, name string, typ watch.EventType, after time.Time) (event, error) {
	deadline := time.Now().Add(time.Second)
	for {
		var found event
		l.mu.Lock()
		for _, e := range l.evs {
			if e.kind == kind && e.name == name && e.typ == typ && !e.at.Before(after) && (found.at.IsZero() || e.at.Before(found.at)) {
				found = e
			}
		}
		l.mu.Unlock()
		if !found.at.IsZero() {
			return found, nil
		}
		if time.Now().After(deadline) {
			return event{}, fmt.Errorf("no %s event for %s %s after %v", typ, kind, name, after.Format(time.RFC3339Nano))
		}
		time.Sleep(time.Millisecond)
	}
}

// latest returns the event of es that arrived last.
func latest(es ...event) event {
	var m event
	for _, e := range es {
		if e.at.After(m.at) {
			m = e
		}
	}
	return m
}
