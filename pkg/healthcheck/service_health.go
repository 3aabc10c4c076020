package healthcheck

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// ListenFunc opens a listener; net.ListenConfig.Listen is one. Tests inject their
// own.
type ListenFunc func(ctx context.Context, network, address string) (net.Listener, error)

// ServiceHealthConfig configures a ServiceHealthServer.
type ServiceHealthConfig struct {
	// ProxyHealthy is reported as serviceProxyHealthy, and a false value fails
	// every Service's check; nil means always healthy. Pass
	// (*ProxyHealthServer).Healthy, as kube-proxy does.
	ProxyHealthy func() bool
	// Listen opens listeners; nil means net.ListenConfig.Listen.
	Listen ListenFunc
	// OnListenError, if set, is told when a Service's port cannot be opened (for
	// example to emit kube-proxy's FailedToStartServiceHealthcheck Event). It is
	// called with the server's lock held and must not call back into the server.
	OnListenError func(svc types.NamespacedName, port uint16, err error)
	// Logger is klog.Background() unless set.
	Logger logr.Logger
}

// ServiceHealthServer serves the healthCheckNodePort of each LoadBalancer Service
// with externalTrafficPolicy Local, as kube-proxy does: 200 while this node has a
// ready local endpoint for the Service and the proxy is healthy, 503 otherwise, so
// that load balancers send traffic only to nodes that can serve it locally.
//
// As kube-proxy, which runs one server per family, it keeps each family apart: a
// family serves the Services its proxier reports (SyncServices), on that family's
// addresses only (SetAddrs: the --nodeport-addresses matches, or every address of
// the family), and answers with that family's local endpoints (SyncEndpoints). A
// dual-stack Service is served on both families; a single-stack one is refused on
// the other family's addresses.
type ServiceHealthServer struct {
	cfg ServiceHealthConfig
	log logr.Logger

	mu   sync.RWMutex
	fams map[*family.Family]*familyHealth
	wg   sync.WaitGroup
}

// familyHealth is one family's part of a ServiceHealthServer.
type familyHealth struct {
	f *family.Family
	// all listens on the family's wildcard address; otherwise on addrs.
	all       bool
	addrs     []netip.Addr
	desired   map[types.NamespacedName]uint16
	services  map[types.NamespacedName]*hcInstance
	endpoints map[types.NamespacedName]int
	// failing holds the last error of Services whose port did not open.
	failing map[types.NamespacedName]string
}

type hcInstance struct {
	port    uint16
	servers []*http.Server
	// listeners are closed directly as well: a server closed before its Serve
	// goroutine has started would otherwise keep the port until that goroutine runs,
	// and an immediate reopen of the port would fail.
	listeners []net.Listener
}

// NewServiceHealthServer returns a server with no Services. Each family listens on
// its wildcard address until SetAddrs says otherwise.
func NewServiceHealthServer(cfg ServiceHealthConfig) *ServiceHealthServer {
	if cfg.Listen == nil {
		var lc net.ListenConfig
		cfg.Listen = lc.Listen
	}
	log := cfg.Logger
	if log.GetSink() == nil {
		log = klog.Background()
	}
	s := &ServiceHealthServer{
		cfg:  cfg,
		log:  log.WithName("service-healthcheck"),
		fams: map[*family.Family]*familyHealth{},
	}
	for _, f := range family.All {
		s.fams[f] = &familyHealth{
			f:        f,
			all:      true,
			services: map[types.NamespacedName]*hcInstance{},
			failing:  map[types.NamespacedName]string{},
		}
	}
	return s
}

// SyncServices makes newServices (Service → healthCheckNodePort) the set of
// Services family f serves: it closes the ports of Services that are gone or whose
// port changed and opens the ports of new ones. A port that cannot be opened (in
// use, no permission, port 0) is logged and reported to OnListenError (once per
// distinct error), never fatal; it is tried again at every later SyncServices or
// RetryFailed of the family until it opens. The map is not retained.
func (s *ServiceHealthServer) SyncServices(f *family.Family, newServices map[types.NamespacedName]uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fh := s.fams[f]
	fh.desired = maps.Clone(newServices)
	s.syncLocked(fh)
}

// RetryFailed tries again to open family f's ports that failed to open, as
// kube-proxy does after every sync; with none failing it does nothing.
func (s *ServiceHealthServer) RetryFailed(f *family.Family) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fh := s.fams[f]; fh != nil && len(fh.failing) > 0 {
		s.syncLocked(fh)
	}
}

func (s *ServiceHealthServer) syncLocked(fh *familyHealth) {
	for nsn, inst := range fh.services {
		if port, ok := fh.desired[nsn]; !ok || port != inst.port {
			s.log.V(2).Info("Closing healthcheck", "ipFamily", fh.f.Name, "service", nsn, "port", inst.port)
			s.closeInstance(nsn, inst)
			delete(fh.services, nsn)
		}
	}
	// Open in a fixed order so that when two Services claim one port, the same one
	// wins at every sync.
	names := make([]types.NamespacedName, 0, len(fh.desired))
	for nsn := range fh.desired {
		if fh.services[nsn] == nil {
			names = append(names, nsn)
		}
	}
	slices.SortFunc(names, func(a, b types.NamespacedName) int {
		if c := cmp.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	for _, nsn := range names {
		port := fh.desired[nsn]
		inst, err := s.open(fh, nsn, port)
		if err != nil {
			// Report a failure once, and again only if it changes; retries that
			// keep failing the same way log at V(4).
			msg := err.Error()
			if fh.failing[nsn] == msg {
				s.log.V(4).Info("Healthcheck still failing", "ipFamily", fh.f.Name, "service", nsn, "port", port, "err", msg)
				continue
			}
			fh.failing[nsn] = msg
			s.log.Error(err, "Failed to start healthcheck; will retry at the next sync", "ipFamily", fh.f.Name, "service", nsn, "port", port)
			if s.cfg.OnListenError != nil {
				s.cfg.OnListenError(nsn, port, err)
			}
			continue
		}
		if _, ok := fh.failing[nsn]; ok {
			s.log.Info("Healthcheck started after failing", "ipFamily", fh.f.Name, "service", nsn, "port", port)
			delete(fh.failing, nsn)
		} else {
			s.log.V(2).Info("Opened healthcheck", "ipFamily", fh.f.Name, "service", nsn, "port", port)
		}
		fh.services[nsn] = inst
	}
	for nsn := range fh.failing {
		if _, ok := fh.desired[nsn]; !ok {
			delete(fh.failing, nsn)
		}
	}
}

// open listens on each of the family's addresses for nsn's port ("tcp4" or "tcp6",
// as kube-proxy's per-family servers) and starts serving; on any failure it closes
// what it opened. A family with no addresses to listen on opens nothing, as
// kube-proxy's server with no matching node IP.
func (s *ServiceHealthServer) open(fh *familyHealth, nsn types.NamespacedName, port uint16) (*hcInstance, error) {
	if port == 0 {
		return nil, errors.New("healthCheckNodePort 0")
	}
	network := "tcp4"
	if fh.f == family.IPv6 {
		network = "tcp6"
	}
	var addrs []string
	if fh.all {
		addrs = []string{":" + strconv.Itoa(int(port))}
	} else {
		for _, a := range fh.addrs {
			addrs = append(addrs, netip.AddrPortFrom(a, port).String())
		}
	}
	inst := &hcInstance{port: port}
	handler := hcHandler{name: nsn, f: fh.f, s: s}
	for _, addr := range addrs {
		l, err := s.cfg.Listen(context.Background(), network, addr)
		if err != nil {
			s.closeInstance(nsn, inst)
			return nil, fmt.Errorf("listen on %s %s: %w", network, addr, err)
		}
		srv := &http.Server{Handler: handler, ReadHeaderTimeout: readHeaderTimeout}
		inst.servers = append(inst.servers, srv)
		inst.listeners = append(inst.listeners, l)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error(err, "Healthcheck stopped serving", "service", nsn, "address", l.Addr().String())
			}
		}()
	}
	return inst, nil
}

func (s *ServiceHealthServer) closeInstance(nsn types.NamespacedName, inst *hcInstance) {
	for _, srv := range inst.servers {
		if err := srv.Close(); err != nil {
			s.log.Error(err, "Closing healthcheck", "service", nsn, "port", inst.port)
		}
	}
	for _, l := range inst.listeners {
		_ = l.Close() // already closed by Serve's return in the common case
	}
}

// SyncEndpoints makes newEndpoints (Service → ready local endpoints of family f)
// the counts family f reports; Services missing from it have 0. The map is not
// retained.
func (s *ServiceHealthServer) SyncEndpoints(f *family.Family, newEndpoints map[types.NamespacedName]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fams[f].endpoints = maps.Clone(newEndpoints)
}

// SetAddrs sets the addresses family f serves on: with all, its wildcard address
// (0.0.0.0 or [::], the default); otherwise addrs, those of f (others are
// ignored; none means the family opens no ports). IPv6 link-local addresses are
// skipped: they cannot be bound without a zone. A change reopens every port of
// the family.
func (s *ServiceHealthServer) SetAddrs(f *family.Family, addrs []netip.Addr, all bool) {
	var own []netip.Addr
	if !all {
		for _, a := range addrs {
			if a = a.Unmap(); f.Contains(a) && !(a.Is6() && a.IsLinkLocalUnicast()) {
				own = append(own, a)
			}
		}
		slices.SortFunc(own, netip.Addr.Compare)
		own = slices.Compact(own)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	fh := s.fams[f]
	if fh.all == all && slices.Equal(fh.addrs, own) {
		return
	}
	fh.all, fh.addrs = all, own
	for nsn, inst := range fh.services {
		s.closeInstance(nsn, inst)
		delete(fh.services, nsn)
	}
	s.syncLocked(fh)
}

// Listening returns the Services whose port family f has open, with the port.
func (s *ServiceHealthServer) Listening(f *family.Family) map[types.NamespacedName]uint16 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	fh := s.fams[f]
	out := make(map[types.NamespacedName]uint16, len(fh.services))
	for nsn, inst := range fh.services {
		out[nsn] = inst.port
	}
	return out
}

// Close closes every port and waits for the servers to stop. A later SyncServices
// opens ports again.
func (s *ServiceHealthServer) Close() {
	s.mu.Lock()
	for _, fh := range s.fams {
		for nsn, inst := range fh.services {
			s.closeInstance(nsn, inst)
			delete(fh.services, nsn)
		}
		fh.desired = nil
	}
	s.mu.Unlock()
	s.wg.Wait()
}

type hcHandler struct {
	name types.NamespacedName
	f    *family.Family
	s    *ServiceHealthServer
}

func (h hcHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.s.mu.RLock()
	fh := h.s.fams[h.f]
	count := 0
	if _, open := fh.services[h.name]; open {
		// (Not open: a request that raced with closing the port.)
		count = fh.endpoints[h.name]
	}
	h.s.mu.RUnlock()
	healthy := h.s.cfg.ProxyHealthy == nil || h.s.cfg.ProxyHealthy()

	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
	if count > 0 && healthy {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	// kube-proxy's exact layout.
	_, _ = fmt.Fprintf(w, "{\n\t\"service\": {\n\t\t\"namespace\": %s,\n\t\t\"name\": %s\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %t\n}",
		jsonString(h.name.Namespace), jsonString(h.name.Name), count, healthy)
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
