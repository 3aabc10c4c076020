// Package healthcheck serves dsproxy's health endpoints with kube-proxy v1.36's
// semantics: the proxy health server behind --healthz-bind-address (/healthz and
// /livez), and the per-Service healthCheckNodePort servers that tell external load
// balancers whether this node has local endpoints for an externalTrafficPolicy
// Local Service.
package healthcheck

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/metaproxier"
)

// ToBeDeletedTaint is the taint the Cluster Autoscaler puts on a node before
// deleting it; a node carrying it fails /healthz (but not /livez) so that load
// balancers drain it.
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// shutdownTimeout bounds how long Serve waits for in-flight requests on shutdown.
const shutdownTimeout = 5 * time.Second

// readHeaderTimeout bounds how long a client may take to send request headers.
const readHeaderTimeout = 10 * time.Second

// HealthFunc reports every running family's status; metaproxier.MetaProxier's and
// app.Daemon's Health methods are HealthFuncs.
type HealthFunc func() map[*family.Family]metaproxier.FamilyStatus

// ProbeRecorder counts probe responses by HTTP status code; *metrics.Metrics
// implements it (kubeproxy_proxy_healthz_total and kubeproxy_proxy_livez_total).
type ProbeRecorder interface {
	ObserveHealthz(code int)
	ObserveLivez(code int)
}

// ProxierHealth is the health of one family's proxier, as in kube-proxy's body.
type ProxierHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// ProxyHealth is the JSON body of /healthz and /livez, field for field kube-proxy
// v1.36's.
type ProxyHealth struct {
	// LastUpdated is the most recent successful sync of any family; in a 200
	// response it is the current time, as kube-proxy reports for compatibility.
	LastUpdated time.Time `json:"lastUpdated"`
	CurrentTime time.Time `json:"currentTime"`
	// NodeEligible is set only in /healthz responses.
	NodeEligible *bool `json:"nodeEligible,omitempty"`
	// Healthy is true when every family is healthy.
	Healthy bool `json:"healthy"`
	// Status holds each family's health, keyed "IPv4" and "IPv6".
	Status map[v1.IPFamily]ProxierHealth `json:"status,omitempty"`
}

// ProxyHealthConfig configures a ProxyHealthServer.
type ProxyHealthConfig struct {
	// Health reports the families' status; nil means no families (healthy). A family
	// is healthy when its FamilyStatus.Healthy is set, which covers kube-proxy's
	// rule (no change queued longer than the health timeout without a successful
	// sync) and, in dsproxy, a running sync loop.
	Health HealthFunc
	// Recorder, if set, counts responses.
	Recorder ProbeRecorder
	// Now is time.Now unless set (tests).
	Now func() time.Time
	// Logger is klog.Background() unless set.
	Logger logr.Logger
}

// ProxyHealthServer serves /healthz and /livez.
//
// /healthz is 200 when every family is healthy and the node is eligible: known
// (SetNode was called with a Node), not being deleted (no deletionTimestamp) and
// not tainted ToBeDeletedByClusterAutoscaler; 503 otherwise. /livez is 200 when
// every family is healthy, whatever the node. Both answer with a ProxyHealth JSON
// body, Content-Type application/json and X-Content-Type-Options nosniff.
type ProxyHealthServer struct {
	cfg ProxyHealthConfig
	log logr.Logger

	mu       sync.RWMutex
	nodeSeen bool
	eligible bool
}

// NewProxyHealthServer returns a server; it listens only when Run or Serve is
// called.
func NewProxyHealthServer(cfg ProxyHealthConfig) *ProxyHealthServer {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log.GetSink() == nil {
		log = klog.Background()
	}
	return &ProxyHealthServer{cfg: cfg, log: log.WithName("healthz")}
}

// SetNode records this node's latest state, from the Node informer's add and
// update events. nil forgets the node, which makes it ineligible (kube-proxy treats
// a node it has not seen as ineligible). The object is not retained.
func (s *ProxyHealthServer) SetNode(node *v1.Node) {
	eligible, name := false, ""
	if node != nil {
		eligible, name = nodeEligible(node), node.Name
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodeSeen && s.eligible != eligible {
		s.log.Info("Node eligibility for /healthz changed", "node", name, "eligible", eligible)
	}
	s.nodeSeen = node != nil
	s.eligible = eligible
}

func nodeEligible(node *v1.Node) bool {
	if !node.DeletionTimestamp.IsZero() {
		return false
	}
	for _, taint := range node.Spec.Taints {
		if taint.Key == ToBeDeletedTaint {
			return false
		}
	}
	return true
}

// NodeEligible reports whether the node is known, not being deleted and not
// tainted for deletion by the Cluster Autoscaler.
func (s *ProxyHealthServer) NodeEligible() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.nodeSeen && s.eligible
}

// Health returns the proxy's health, as /livez reports it.
func (s *ProxyHealthServer) Health() ProxyHealth {
	h := ProxyHealth{
		Healthy:     true,
		CurrentTime: s.cfg.Now(),
		Status:      map[v1.IPFamily]ProxierHealth{},
	}
	if s.cfg.Health == nil {
		return h
	}
	for f, st := range s.cfg.Health() {
		last := st.Proxier.LastSync
		if last.IsZero() {
			// kube-proxy marks a family updated when its sync loop starts.
			last = st.Proxier.Started
		}
		if last.After(h.LastUpdated) {
			h.LastUpdated = last
		}
		h.Status[f.IPFamily] = ProxierHealth{LastUpdated: last, Healthy: st.Healthy}
		if !st.Healthy {
			h.Healthy = false
		}
	}
	return h
}

// Healthy reports whether every family is healthy; a ServiceHealthServer's
// serviceProxyHealthy is this.
func (s *ProxyHealthServer) Healthy() bool { return s.Health().Healthy }

// Handler returns the handler for /healthz and /livez.
func (s *ProxyHealthServer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", s.serveHealthz)
	mux.HandleFunc("/livez", s.serveLivez)
	return mux
}

func (s *ProxyHealthServer) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	h := s.Health()
	eligible := s.NodeEligible()
	h.NodeEligible = &eligible
	code := s.respond(w, h, h.Healthy && eligible)
	if s.cfg.Recorder != nil {
		s.cfg.Recorder.ObserveHealthz(code)
	}
}

func (s *ProxyHealthServer) serveLivez(w http.ResponseWriter, _ *http.Request) {
	h := s.Health()
	code := s.respond(w, h, h.Healthy)
	if s.cfg.Recorder != nil {
		s.cfg.Recorder.ObserveLivez(code)
	}
}

func (s *ProxyHealthServer) respond(w http.ResponseWriter, h ProxyHealth, ok bool) int {
	code := http.StatusServiceUnavailable
	if ok {
		code = http.StatusOK
		// kube-proxy: "lastUpdated" is "recent" whenever the server is healthy, as
		// in older releases where it was the last time the sync loop ran.
		h.LastUpdated = h.CurrentTime
	}
	body, err := json.Marshal(h)
	if err != nil {
		s.log.Error(err, "Encoding health")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(body)
	return code
}

// Run listens on addr (host:port, e.g. "0.0.0.0:10256" or "[::]:10256") and
// serves until ctx is done, then returns nil. It returns an error if it cannot listen or the server
// fails; the caller may retry (kube-proxy retries every 5 seconds).
func (s *ProxyHealthServer) Run(ctx context.Context, addr string) error {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	return s.Serve(ctx, l)
}

// Serve serves on l until ctx is done, then shuts down gracefully (bounded by a
// few seconds) and returns nil. It closes l.
func (s *ProxyHealthServer) Serve(ctx context.Context, l net.Listener) error {
	s.log.V(2).Info("Serving", "address", l.Addr().String())
	return serve(ctx, l, s.Handler())
}

func serve(ctx context.Context, l net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	select {
	case err := <-done:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
	}
	<-done
	return nil
}
