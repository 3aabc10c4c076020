//go:build e2e && netns

package e2e

import (
	"context"
	"fmt"
	"sync"
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
}

type event struct {
	at   time.Time
	kind string // "Service" or "EndpointSlice"
	name string
	typ  watch.EventType
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
					l.mu.Lock()
					l.evs = append(l.evs, event{at: at, kind: w.kind, name: name, typ: ev.Type})
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
func (l *eventLog) first(kind, name string, typ watch.EventType, after time.Time) (time.Time, error) {
	deadline := time.Now().Add(time.Second)
	for {
		var at time.Time
		l.mu.Lock()
		for _, e := range l.evs {
			if e.kind == kind && e.name == name && e.typ == typ && !e.at.Before(after) && (at.IsZero() || e.at.Before(at)) {
				at = e.at
			}
		}
		l.mu.Unlock()
		if !at.IsZero() {
			return at, nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("no %s event for %s %s after %v", typ, kind, name, after.Format(time.RFC3339Nano))
		}
		time.Sleep(time.Millisecond)
	}
}

// latest returns the latest of ts.
func latest(ts ...time.Time) time.Time {
	var m time.Time
	for _, t := range ts {
		if t.After(m) {
			m = t
		}
	}
	return m
}
