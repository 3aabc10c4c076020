package healthcheck

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// fakeNet opens real listeners on 127.0.0.1 with kernel-chosen ports and
// remembers which requested address each one stands for. Addresses in fail are
// refused.
type fakeNet struct {
	mu    sync.Mutex
	open  map[string]net.Listener // requested address → listener
	fail  map[string]error
	calls []string
}

func newFakeNet() *fakeNet {
	return &fakeNet{open: map[string]net.Listener{}, fail: map[string]error{}}
}

func (n *fakeNet) Listen(ctx context.Context, network, addr string) (net.Listener, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls = append(n.calls, network+" "+addr)
	if err := n.fail[addr]; err != nil {
		return nil, err
	}
	if old := n.open[addr]; old != nil {
		if _, err := net.Dial("tcp", old.Addr().String()); err == nil {
			return nil, fmt.Errorf("listen %s %s: address already in use", network, addr)
		}
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	n.open[addr] = l
	return l, nil
}

func (n *fakeNet) setFail(addr string, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err == nil {
		delete(n.fail, addr)
	} else {
		n.fail[addr] = err
	}
}

// url returns the URL serving the requested address.
func (n *fakeNet) url(t *testing.T, addr string) string {
	t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	l := n.open[addr]
	if l == nil {
		t.Fatalf("%s never opened", addr)
	}
	return "http://" + l.Addr().String() + "/"
}

func (n *fakeNet) takeCalls() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := n.calls
	n.calls = nil
	return c
}

// logSink collects error logs.
type logSink struct {
	mu     sync.Mutex
	errors []string
}

func (s *logSink) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		if strings.Contains(args, `"error"`) || strings.Contains(args, "Failed") {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.errors = append(s.errors, args)
		}
	}, funcr.Options{})
}

func (s *logSink) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.errors
	s.errors = nil
	return e
}

type hcResult struct {
	code   int
	weight string
	body   string
	err    error
}

func hcGet(url string) hcResult {
	c := http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url)
	if err != nil {
		return hcResult{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.Header.Get("X-Content-Type-Options") != "nosniff" || resp.Header.Get("Content-Type") != "application/json" {
		err = fmt.Errorf("headers %v", resp.Header)
	}
	return hcResult{code: resp.StatusCode, weight: resp.Header.Get("X-Load-Balancing-Endpoint-Weight"), body: string(b), err: err}
}

func wantBody(ns, name string, n int, healthy bool) string {
	return fmt.Sprintf("{\n\t\"service\": {\n\t\t\"namespace\": %q,\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}", ns, name, n, healthy)
}

func checkHC(t *testing.T, step, url string, nsn types.NamespacedName, code, n int, healthy bool) {
	t.Helper()
	r := hcGet(url)
	if r.err != nil {
		t.Fatalf("%s: %s: %v", step, nsn, r.err)
	}
	if r.code != code || r.weight != strconv.Itoa(n) || r.body != wantBody(nsn.Namespace, nsn.Name, n, healthy) {
		t.Errorf("%s: %s: %d weight %s body\n%s\nwant %d weight %d body\n%s", step, nsn, r.code, r.weight, r.body, code, n, wantBody(nsn.Namespace, nsn.Name, n, healthy))
	}
}

func nn(name string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: name} }

func TestServiceHealth(t *testing.T) {
	fn := newFakeNet()
	var healthy atomic.Bool
	healthy.Store(true)
	s := NewServiceHealthServer(ServiceHealthConfig{Listen: fn.Listen, ProxyHealthy: healthy.Load})
	defer s.Close()

	a, b := nn("a"), nn("b")
	s.SyncServices(family.IPv4, map[types.NamespacedName]uint16{a: 30001, b: 30002})
	if calls := fn.takeCalls(); len(calls) != 2 || !contains(calls, "tcp4 :30001") || !contains(calls, "tcp4 :30002") {
		t.Errorf("listen calls %v; want one wildcard tcp4 listener per port", calls)
	}
	urlA, urlB := fn.url(t, ":30001"), fn.url(t, ":30002")

	// No endpoints yet.
	checkHC(t, "no endpoints", urlA, a, 503, 0, true)
	checkHC(t, "no endpoints", urlB, b, 503, 0, true)

	s.SyncEndpoints(family.IPv4, map[types.NamespacedName]int{a: 2, nn("other"): 4})
	checkHC(t, "a has 2", urlA, a, 200, 2, true)
	checkHC(t, "a has 2", urlB, b, 503, 0, true)

	// An unhealthy proxy fails every check and says so.
	healthy.Store(false)
	checkHC(t, "proxy unhealthy", urlA, a, 503, 2, false)
	healthy.Store(true)

	// Counts not listed drop to 0.
	s.SyncEndpoints(family.IPv4, map[types.NamespacedName]int{b: 1})
	checkHC(t, "b has 1", urlA, a, 503, 0, true)
	checkHC(t, "b has 1", urlB, b, 200, 1, true)

	// An unchanged Service keeps its listener; a removed one is closed.
	s.SyncServices(family.IPv4, map[types.NamespacedName]uint16{b: 30002})
	if calls := fn.takeCalls(); len(calls) != 0 {
		t.Errorf("reopened %v", calls)
	}
	if r := hcGet(urlA); r.err == nil {
		t.Errorf("a still served after removal: %d", r.code)
	}
	checkHC(t, "a removed", urlB, b, 200, 1, true)

	// A port change moves the listener.
	s.SyncServices(family.IPv4, map[types.NamespacedName]uint16{b: 30003})
	if r := hcGet(urlB); r.err == nil {
		t.Errorf("b still served on its old port: %d", r.code)
	}
	checkHC(t, "b moved", fn.url(t, ":30003"), b, 200, 1, true)
	if got := s.Listening(family.IPv4); len(got) != 1 || got[b] != 30003 {
		t.Errorf("Listening = %v", got)
	}

	// Everything goes away.
	s.SyncServices(family.IPv4, nil)
	if got := s.Listening(family.IPv4); len(got) != 0 {
		t.Errorf("Listening = %v after removing all", got)
	}
	if r := hcGet(fn.url(t, ":30003")); r.err == nil {
		t.Errorf("b still served after removing all")
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestServiceHealthAddrs(t *testing.T) {
	fn := newFakeNet()
	s := NewServiceHealthServer(ServiceHealthConfig{Listen: fn.Listen})
	defer s.Close()
	// Each family keeps its own addresses: the other family's, and IPv6
	// link-local ones (not bindable without a zone), are ignored.
	addrs := []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10"), netip.MustParseAddr("fe80::1")}
	s.SetAddrs(family.IPv4, addrs, false)
	s.SetAddrs(family.IPv6, addrs, false)
	a := nn("a")
	for _, f := range family.All {
		s.SyncEndpoints(f, map[types.NamespacedName]int{a: 1})
		s.SyncServices(f, map[types.NamespacedName]uint16{a: 30001})
	}
	calls := fn.takeCalls()
	if len(calls) != 2 || calls[0] != "tcp4 192.0.2.10:30001" || calls[1] != "tcp6 [2001:db8::10]:30001" {
		t.Errorf("listen calls %v", calls)
	}
	checkHC(t, "v4", fn.url(t, "192.0.2.10:30001"), a, 200, 1, true)
	checkHC(t, "v6", fn.url(t, "[2001:db8::10]:30001"), a, 200, 1, true)

	// New addresses: the family's ports reopen on them, the old ones close; the
	// other family is untouched.
	s.SetAddrs(family.IPv4, []netip.Addr{netip.MustParseAddr("192.0.2.11")}, false)
	if calls := fn.takeCalls(); len(calls) != 1 || calls[0] != "tcp4 192.0.2.11:30001" {
		t.Errorf("listen calls after SetAddrs %v", calls)
	}
	if r := hcGet(fn.url(t, "192.0.2.10:30001")); r.err == nil {
		t.Error("old address still served")
	}
	checkHC(t, "new address", fn.url(t, "192.0.2.11:30001"), a, 200, 1, true)
	checkHC(t, "v6 untouched", fn.url(t, "[2001:db8::10]:30001"), a, 200, 1, true)

	// The same addresses again: nothing reopens.
	s.SetAddrs(family.IPv4, []netip.Addr{netip.MustParseAddr("192.0.2.11")}, false)
	if calls := fn.takeCalls(); len(calls) != 0 {
		t.Errorf("unchanged addresses reopened %v", calls)
	}
	// Back to every address: the wildcard of the family.
	s.SetAddrs(family.IPv6, nil, true)
	if calls := fn.takeCalls(); len(calls) != 1 || calls[0] != "tcp6 :30001" {
		t.Errorf("listen calls after SetAddrs(all) %v", calls)
	}
	// No address of the family matches: the port is open on nothing, as in
	// kube-proxy, and not an error.
	s.SetAddrs(family.IPv4, nil, false)
	if calls := fn.takeCalls(); len(calls) != 0 {
		t.Errorf("listen calls with no addresses %v", calls)
	}
	if r := hcGet(fn.url(t, "192.0.2.11:30001")); r.err == nil {
		t.Error("address still served after the family lost its addresses")
	}
}

func TestServiceHealthListenErrors(t *testing.T) {
	fn := newFakeNet()
	logs := &logSink{}
	var reported []string
	s := NewServiceHealthServer(ServiceHealthConfig{
		Listen: fn.Listen,
		Logger: logs.logger(),
		OnListenError: func(svc types.NamespacedName, port uint16, err error) {
			reported = append(reported, fmt.Sprintf("%s:%d", svc, port))
		},
	})
	defer s.Close()
	s.SetAddrs(family.IPv4, []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11")}, false)
	good, bad, zero := nn("good"), nn("bad"), nn("zero")
	// The second address of bad's port fails: the first must be closed again.
	fn.setFail("192.0.2.11:30002", errors.New("permission denied"))
	services := map[types.NamespacedName]uint16{good: 30001, bad: 30002, zero: 0}
	s.SyncServices(family.IPv4, services)
	s.SyncEndpoints(family.IPv4, map[types.NamespacedName]int{good: 1, bad: 1})

	if got := s.Listening(family.IPv4); len(got) != 1 || got[good] != 30001 {
		t.Errorf("Listening = %v; want only good", got)
	}
	if errs := logs.take(); len(errs) != 2 {
		t.Errorf("error logs %v; want one for bad and one for zero", errs)
	}
	if len(reported) != 2 {
		t.Errorf("OnListenError calls %v", reported)
	}
	if r := hcGet(fn.url(t, "192.0.2.10:30002")); r.err == nil {
		t.Error("half-opened port left open")
	}
	checkHC(t, "good unaffected", fn.url(t, "192.0.2.10:30001"), good, 200, 1, true)

	// The next sync retries; the same failure is not reported again.
	s.SyncServices(family.IPv4, services)
	if errs := logs.take(); len(errs) != 0 {
		t.Errorf("repeated failure logged again: %v", errs)
	}
	if len(reported) != 2 {
		t.Errorf("repeated failure reported again: %v", reported)
	}
	if calls := fn.takeCalls(); !contains(calls, "tcp4 192.0.2.10:30002") {
		t.Errorf("no retry: %v", calls)
	}

	// RetryFailed (after any other sync) retries only the failing port, and a
	// family with none failing listens on nothing new.
	s.RetryFailed(family.IPv4)
	if calls := fn.takeCalls(); !contains(calls, "tcp4 192.0.2.10:30002") || contains(calls, "tcp4 192.0.2.10:30001") {
		t.Errorf("RetryFailed listened on %v, want bad's port only", calls)
	}
	s.RetryFailed(family.IPv6)
	if calls := fn.takeCalls(); len(calls) != 0 {
		t.Errorf("RetryFailed of a family with no failure listened on %v", calls)
	}

	// Once the port is free, the retry opens it, with the counts already known.
	fn.setFail("192.0.2.11:30002", nil)
	s.RetryFailed(family.IPv4)
	if got := s.Listening(family.IPv4); len(got) != 2 || got[bad] != 30002 {
		t.Errorf("Listening = %v after the port freed", got)
	}
	checkHC(t, "bad recovered", fn.url(t, "192.0.2.11:30002"), bad, 200, 1, true)
	fn.takeCalls()
	s.RetryFailed(family.IPv4)
	if calls := fn.takeCalls(); len(calls) != 0 {
		t.Errorf("RetryFailed with every port open listened on %v", calls)
	}
}

// TestServiceHealthRealListeners uses the default listener on real ports.
func TestServiceHealthRealListeners(t *testing.T) {
	logs := &logSink{}
	lo := netip.MustParseAddr("127.0.0.1")
	s := NewServiceHealthServer(ServiceHealthConfig{Logger: logs.logger()})
	defer s.Close()
	s.SetAddrs(family.IPv4, []netip.Addr{lo}, false)

	port := freePort(t)
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	a, b := nn("a"), nn("b")

	// Two Services claim one port: the first in name order wins, the other is
	// logged and retried.
	s.SyncServices(family.IPv4, map[types.NamespacedName]uint16{a: port, b: port})
	s.SyncEndpoints(family.IPv4, map[types.NamespacedName]int{a: 3, b: 1})
	if got := s.Listening(family.IPv4); len(got) != 1 || got[a] != port {
		t.Errorf("Listening = %v", got)
	}
	if errs := logs.take(); len(errs) != 1 || !strings.Contains(errs[0], `"name"="b"`) {
		t.Errorf("error logs %v", errs)
	}
	checkHC(t, "a wins", url, a, 200, 3, true)

	// a goes away: b gets the port at the same sync.
	s.SyncServices(family.IPv4, map[types.NamespacedName]uint16{b: port})
	checkHC(t, "b takes over", url, b, 200, 1, true)

	// A port held by someone else.
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	heldPort := uint16(held.Addr().(*net.TCPAddr).Port)
	s.SyncServices(family.IPv4, map[types.NamespacedName]uint16{b: port, a: heldPort})
	if got := s.Listening(family.IPv4); len(got) != 1 {
		t.Errorf("Listening = %v with a held port", got)
	}
	held.Close()
	s.SyncServices(family.IPv4, map[types.NamespacedName]uint16{b: port, a: heldPort})
	if got := s.Listening(family.IPv4); len(got) != 2 {
		t.Errorf("Listening = %v after the port was released", got)
	}
	checkHC(t, "a on the released port", fmt.Sprintf("http://127.0.0.1:%d/", heldPort), a, 200, 3, true)

	s.Close()
	if r := hcGet(url); r.err == nil {
		t.Error("served after Close")
	}
}

func freePort(t *testing.T) uint16 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

func TestServiceHealthConcurrent(t *testing.T) {
	fn := newFakeNet()
	s := NewServiceHealthServer(ServiceHealthConfig{Listen: fn.Listen})
	defer s.Close()
	a := nn("a")
	s.SyncServices(family.IPv4, map[types.NamespacedName]uint16{a: 30001})
	url := fn.url(t, ":30001")
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 20 {
				if i == 0 {
					s.SyncEndpoints(family.IPv4, map[types.NamespacedName]int{a: j})
				} else {
					_ = hcGet(url)
				}
			}
		}()
	}
	wg.Wait()
}

// TestServiceHealthPerFamily: as kube-proxy's per-family servers, on real
// listeners of both families, each family serves its own Services with its own
// local endpoints: a dual-stack Service answers each family's count, a
// single-stack one is refused on the other family.
func TestServiceHealthPerFamily(t *testing.T) {
	l, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	l.Close()
	s := NewServiceHealthServer(ServiceHealthConfig{})
	defer s.Close()
	for _, f := range family.All {
		s.SetAddrs(f, []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}, false)
	}
	dual, v4only := nn("dual"), nn("v4only")
	pd, p4 := freePort(t), freePort(t)
	s.SyncServices(family.IPv4, map[types.NamespacedName]uint16{dual: pd, v4only: p4})
	s.SyncServices(family.IPv6, map[types.NamespacedName]uint16{dual: pd})
	if got := s.Listening(family.IPv4); len(got) != 2 || got[dual] != pd || got[v4only] != p4 {
		t.Fatalf("IPv4 listening %v", got)
	}
	if got := s.Listening(family.IPv6); len(got) != 1 || got[dual] != pd {
		t.Fatalf("IPv6 listening %v", got)
	}
	url := func(a string, port uint16) string {
		return fmt.Sprintf("http://%s/", net.JoinHostPort(a, strconv.Itoa(int(port))))
	}
	v4, v6 := url("127.0.0.1", pd), url("::1", pd)
	s.SyncEndpoints(family.IPv4, map[types.NamespacedName]int{dual: 1, v4only: 2})
	checkHC(t, "IPv4 has 1, IPv6 none yet", v4, dual, 200, 1, true)
	checkHC(t, "IPv4 has 1, IPv6 none yet", v6, dual, 503, 0, true)
	checkHC(t, "single-stack on its family", url("127.0.0.1", p4), v4only, 200, 2, true)
	if r := hcGet(url("::1", p4)); r.err == nil {
		t.Errorf("IPv4-only Service answered %d on IPv6; want the connection refused", r.code)
	}
	s.SyncEndpoints(family.IPv6, map[types.NamespacedName]int{dual: 3})
	checkHC(t, "IPv4 1, IPv6 3", v4, dual, 200, 1, true)
	checkHC(t, "IPv4 1, IPv6 3", v6, dual, 200, 3, true)
	s.SyncEndpoints(family.IPv4, nil)
	checkHC(t, "IPv4 gone", v4, dual, 503, 0, true)
	checkHC(t, "IPv4 gone", v6, dual, 200, 3, true)
	// The Service leaves IPv6: its IPv6 port closes, IPv4's stays.
	s.SyncServices(family.IPv6, nil)
	if r := hcGet(v6); r.err == nil {
		t.Errorf("IPv6 port still answers %d after the family dropped the Service", r.code)
	}
	checkHC(t, "IPv4 stays", v4, dual, 503, 0, true)
}
