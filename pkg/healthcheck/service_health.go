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
	// Addrs are the node addresses to serve healthCheckNodePorts on (kube-proxy
	// uses the --nodeport-addresses matches); empty means every address of both
	// families (one "tcp" wildcard listener per port).
	Addrs []netip.Addr
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
// dsproxy runs one ServiceHealthServer for both families: a dual-stack Service is
// served on one port for both families. As in kube-proxy, which runs one server
// per family, a request is answered with the local endpoints of its own family:
// that of the address it came in on (SyncEndpoints takes each family's counts).
// Where kube-proxy's server of a family without the Service refuses the
// connection, dsproxy's answers 503 with 0 endpoints; either fails the check.
type ServiceHealthServer struct {
	cfg ServiceHealthConfig
	log logr.Logger

	mu        sync.RWMutex
	addrs     []netip.Addr
	desired   map[types.NamespacedName]uint16
	services  map[types.NamespacedName]*hcInstance
	endpoints map[*family.Family]map[types.NamespacedName]int
	// failing holds the last error of Services whose port did not open.
	failing map[types.NamespacedName]string
	wg      sync.WaitGroup
}

type hcInstance struct {
	port    uint16
	servers []*http.Server
	// listeners are closed directly as well: a server closed before its Serve
	// goroutine has started would otherwise keep the port until that goroutine runs,
	// and an immediate reopen of the port would fail.
	listeners []net.Listener
}

// NewServiceHealthServer returns a server with no Services.
func NewServiceHealthServer(cfg ServiceHealthConfig) *ServiceHealthServer {
	if cfg.Listen == nil {
		var lc net.ListenConfig
		cfg.Listen = lc.Listen
	}
	log := cfg.Logger
	if log.GetSink() == nil {
		log = klog.Background()
	}
	return &ServiceHealthServer{
		cfg:       cfg,
		log:       log.WithName("service-healthcheck"),
		addrs:     slices.Clone(cfg.Addrs),
		services:  map[types.NamespacedName]*hcInstance{},
		endpoints: map[*family.Family]map[types.NamespacedName]int{},
		failing:   map[types.NamespacedName]string{},
	}
}

// SyncServices makes newServices (Service → healthCheckNodePort) the set of
// Services served: it closes the ports of Services that are gone or whose port
// changed and opens the ports of new ones. A port that cannot be opened (in use,
// no permission, port 0) is logged and reported to OnListenError (once per
// distinct error), never fatal; it is tried again at every later SyncServices
// until it opens. The map is not
// retained.
func (s *ServiceHealthServer) SyncServices(newServices map[types.NamespacedName]uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.desired = make(map[types.NamespacedName]uint16, len(newServices))
	for nsn, port := range newServices {
		s.desired[nsn] = port
	}
	s.syncLocked()
}

func (s *ServiceHealthServer) syncLocked() {
	for nsn, inst := range s.services {
		if port, ok := s.desired[nsn]; !ok || port != inst.port {
			s.log.V(2).Info("Closing healthcheck", "service", nsn, "port", inst.port)
			s.closeInstance(nsn, inst)
			delete(s.services, nsn)
		}
	}
	// Open in a fixed order so that when two Services claim one port, the same one
	// wins at every sync.
	names := make([]types.NamespacedName, 0, len(s.desired))
	for nsn := range s.desired {
		if s.services[nsn] == nil {
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
		port := s.desired[nsn]
		inst, err := s.open(nsn, port)
		if err != nil {
			// Report a failure once, and again only if it changes; retries that
			// keep failing the same way log at V(4).
			msg := err.Error()
			if s.failing[nsn] == msg {
				s.log.V(4).Info("Healthcheck still failing", "service", nsn, "port", port, "err", msg)
				continue
			}
			s.failing[nsn] = msg
			s.log.Error(err, "Failed to start healthcheck; will retry at the next sync", "service", nsn, "port", port)
			if s.cfg.OnListenError != nil {
				s.cfg.OnListenError(nsn, port, err)
			}
			continue
		}
		if _, ok := s.failing[nsn]; ok {
			s.log.Info("Healthcheck started after failing", "service", nsn, "port", port)
			delete(s.failing, nsn)
		} else {
			s.log.V(2).Info("Opened healthcheck", "service", nsn, "port", port)
		}
		s.services[nsn] = inst
	}
	for nsn := range s.failing {
		if _, ok := s.desired[nsn]; !ok {
			delete(s.failing, nsn)
		}
	}
}

// open listens on every address for nsn's port and starts serving; on any failure
// it closes what it opened.
func (s *ServiceHealthServer) open(nsn types.NamespacedName, port uint16) (*hcInstance, error) {
	if port == 0 {
		return nil, errors.New("healthCheckNodePort 0")
	}
	addrs := []string{":" + strconv.Itoa(int(port))}
	if len(s.addrs) > 0 {
		addrs = addrs[:0]
		for _, a := range s.addrs {
			addrs = append(addrs, netip.AddrPortFrom(a, port).String())
		}
	}
	inst := &hcInstance{port: port}
	handler := hcHandler{name: nsn, s: s}
	for _, addr := range addrs {
		l, err := s.cfg.Listen(context.Background(), "tcp", addr)
		if err != nil {
			s.closeInstance(nsn, inst)
			return nil, fmt.Errorf("listen on %s: %w", addr, err)
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
// the counts reported to requests that come in on an address of f; Services
// missing from it have 0 there. The map is not retained.
func (s *ServiceHealthServer) SyncEndpoints(f *family.Family, newEndpoints map[types.NamespacedName]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endpoints[f] = maps.Clone(newEndpoints)
}

// SetAddrs changes the addresses served (see ServiceHealthConfig.Addrs) and
// reopens every Service's port on them.
func (s *ServiceHealthServer) SetAddrs(addrs []netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if slices.Equal(addrs, s.addrs) {
		return
	}
	s.addrs = slices.Clone(addrs)
	for nsn, inst := range s.services {
		s.closeInstance(nsn, inst)
		delete(s.services, nsn)
	}
	s.syncLocked()
}

// Listening returns the Services whose port is open, with the port.
func (s *ServiceHealthServer) Listening() map[types.NamespacedName]uint16 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[types.NamespacedName]uint16, len(s.services))
	for nsn, inst := range s.services {
		out[nsn] = inst.port
	}
	return out
}

// Close closes every port and waits for the servers to stop. A later SyncServices
// opens ports again.
func (s *ServiceHealthServer) Close() {
	s.mu.Lock()
	for nsn, inst := range s.services {
		s.closeInstance(nsn, inst)
		delete(s.services, nsn)
	}
	s.desired = nil
	s.mu.Unlock()
	s.wg.Wait()
}

type hcHandler struct {
	name types.NamespacedName
	s    *ServiceHealthServer
}

func (h hcHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f := requestFamily(r)
	h.s.mu.RLock()
	_, open := h.s.services[h.name]
	count := 0
	for fam, counts := range h.s.endpoints {
		if f == nil || fam == f {
			count += counts[h.name]
		}
	}
	h.s.mu.RUnlock()
	if !open {
		// A request that raced with closing the port.
		count = 0
	}
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

// requestFamily is the family of the address r came in on; nil if unknown
// (then every family's endpoints count).
func requestFamily(r *http.Request) *family.Family {
	a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return nil
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return nil
	}
	return family.Of(ap.Addr().Unmap())
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
