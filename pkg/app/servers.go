package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"time"

	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/healthcheck"
	"github.com/dsproxy/dsproxy/pkg/metrics"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nodeport"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// localState hands what each family knows about local endpoints to the service
// health server and the no-local-endpoints gauges. Each family reports from its own
// sync goroutine.
type localState struct {
	metrics *metrics.Metrics
	svcHC   *healthcheck.ServiceHealthServer
}

func newLocalState(m *metrics.Metrics, s *healthcheck.ServiceHealthServer) *localState {
	return &localState{metrics: m, svcHC: s}
}

// update is a proxier.Config.LocalStateChanged callback. As kube-proxy's
// per-family health servers, family f serves the health check node ports of its
// own Services, on its NodePort addresses (every address of the family, loopback
// included, when --nodeport-addresses does not restrict it), with its own local
// endpoint counts.
func (l *localState) update(f *family.Family, st *model.State, np nodeport.Addresses) {
	internal, external := metrics.NoLocalEndpoints(st)
	l.metrics.SetNoLocalEndpoints(f, internal, external)
	svcs, counts := healthcheck.FromState(st)
	l.svcHC.SetAddrs(f, slices.Concat(np.Addrs, np.Loopback), np.MatchAll)
	l.svcHC.SyncEndpoints(f, counts)
	l.svcHC.SyncServices(f, svcs)
}

// serveRetry is the pause before serveHTTP retries (kube-proxy's 5 s).
var serveRetry = 5 * time.Second

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
			// Closed when ctx is done; a server that fails on its own is
			// retried with a new one, so its closer must not outlive it.
			stopClose := context.AfterFunc(ctx, func() { _ = srv.Close() })
			klog.InfoS("Serving", "server", name, "address", addr)
			err = srv.Serve(l)
			stopClose()
			if errors.Is(err, http.ErrServerClosed) {
				return
			}
			_ = srv.Close() // its connections go with it
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
		case <-time.After(serveRetry):
		}
	}
}

// The daemon's metrics receive the proxiers' change counts.
var (
	_ proxier.ChangeObserver    = (*metrics.Metrics)(nil)
	_ proxier.ConntrackObserver = (*metrics.Metrics)(nil)
)
