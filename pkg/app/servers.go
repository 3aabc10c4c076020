package app

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/healthcheck"
	"github.com/dsproxy/dsproxy/pkg/metrics"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// localState merges what each family knows about local endpoints into the service
// health server and the no-local-endpoints gauges. Each family reports from its own
// sync goroutine.
type localState struct {
	metrics *metrics.Metrics
	svcHC   *healthcheck.ServiceHealthServer

	mu       sync.Mutex
	services map[*family.Family]map[types.NamespacedName]uint16
}

func newLocalState(m *metrics.Metrics, s *healthcheck.ServiceHealthServer) *localState {
	return &localState{metrics: m, svcHC: s, services: map[*family.Family]map[types.NamespacedName]uint16{}}
}

// update is a proxier.Config.LocalStateChanged callback.
func (l *localState) update(f *family.Family, st *model.State) {
	internal, external := metrics.NoLocalEndpoints(st)
	l.metrics.SetNoLocalEndpoints(f, internal, external)
	svcs, counts := healthcheck.FromState(st)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.services[f] = svcs
	// A Service's health check node port serves every family it has; each
	// family's requests are answered with that family's local endpoints, as
	// kube-proxy's per-family servers answer.
	allSvcs := map[types.NamespacedName]uint16{}
	for fam := range l.services {
		maps.Copy(allSvcs, l.services[fam])
	}
	l.svcHC.SyncServices(allSvcs)
	l.svcHC.SyncEndpoints(f, counts)
}

// serveHTTP serves h on addr until ctx is done, retrying a failed listen or
// server every 5 s as kube-proxy does; an empty addr disables the server. With
// fail set (--bind-address-hard-fail) it does not retry: it calls fail with the
// error and returns.
func serveHTTP(ctx context.Context, name, addr string, h http.Handler, fail func(error)) {
	if addr == "" {
		return
	}
	for {
		l, err := net.Listen("tcp", addr)
		if err == nil {
			srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
			go func() {
				<-ctx.Done()
				_ = srv.Close()
			}()
			klog.InfoS("Serving", "server", name, "address", addr)
			if err = srv.Serve(l); errors.Is(err, http.ErrServerClosed) {
				return
			}
		}
		if fail != nil {
			klog.ErrorS(err, "Server failed; --bind-address-hard-fail is set", "server", name, "address", addr)
			fail(fmt.Errorf("%s server on %s: %w", name, addr, err))
			return
		}
		klog.ErrorS(err, "Server failed; retrying", "server", name, "address", addr)
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
	}
}

// The daemon's metrics receive the proxiers' change counts.
var (
	_ proxier.ChangeObserver    = (*metrics.Metrics)(nil)
	_ proxier.ConntrackObserver = (*metrics.Metrics)(nil)
)
