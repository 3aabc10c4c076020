//go:build e2e && netns

package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"

	"github.com/dsproxy/dsproxy/test/e2e/framework"
	"github.com/dsproxy/dsproxy/test/netns"
)

// The test topology (test/netns harness + hack/controlplane):
//
//	dsproxy-cp (API 172.31.255.1 / fd00:ffff::1)
//	    │ cplink (up.sh --link): 172.31.255.x, fd00:ffff::x, default routes of the node
//	node  192.0.2.1 / 2001:db8:2::1: dsproxy (the built binary) runs here
//	    ├── pods 10.64.0.n / fd00:64::n (servers on podPort and echoPort)
//	    └── external 198.51.100.1 / 2001:db8:c::1 (an outside client)
//
// The node is registered as a Node with the harness node addresses; pods are
// registered as Pods bound to it with their namespaces' addresses, so the real
// kube-controller-manager builds the EndpointSlices dsproxy programs.
const (
	svcPort  = 80
	podPort  = 8080 // harness servers: reply "<pod> <observed client>"
	echoPort = 9000 // line echo: reply "<pod> <line>" per line, connection kept open
)

var (
	families = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	// lbIPs are load-balancer ingress addresses: not on any interface, the
	// external namespace routes them to the node (its default route).
	lbIPs = map[corev1.IPFamily][]netip.Addr{
		corev1.IPv4Protocol: {netip.MustParseAddr("203.0.113.10"), netip.MustParseAddr("203.0.113.11"), netip.MustParseAddr("203.0.113.12")},
		corev1.IPv6Protocol: {netip.MustParseAddr("2001:db8:e::10"), netip.MustParseAddr("2001:db8:e::11"), netip.MustParseAddr("2001:db8:e::12")},
	}
)

func familyOf(a netip.Addr) corev1.IPFamily {
	if a.Is4() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}

// env is one node running dsproxy against the shared control plane.
type env struct {
	cp       *framework.ControlPlane
	c        *netns.Cluster
	ns       string // Kubernetes namespace of the test's objects
	node     string // Node name (--hostname-override)
	bin      string
	kubecfg  string
	dir      string // dsproxy logs and kubeconfig
	saRBAC   bool   // dsproxy runs as the dsproxy ServiceAccount of deploy/rbac.yaml
	root     string // repository root
	pods     map[string]*netns.NS
	external *netns.NS
	client   *netns.NS // a pod namespace that is no endpoint of anything

	mu    sync.Mutex
	proc  *proc
	procs []*proc
	// args are more flags for the next dsproxy started (e.g. --proxy-mode).
	args []string
}

// proc is one dsproxy process.
type proc struct {
	cmd  *exec.Cmd
	pid  int
	log  string
	done chan struct{}
	err  error // Wait's result, after done
	// forbiddenOK, when set, is in the lines of forbidden requests this
	// process was meant to meet (Manifests does not count them).
	forbiddenOK string
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func newEnv(t *testing.T, podNames ...string) *env {
	t.Helper()
	return newEnvArgs(t, nil, podNames...)
}

// newEnvArgs is newEnv with more flags for dsproxy (e.g. --proxy-mode).
func newEnvArgs(t *testing.T, args []string, podNames ...string) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("e2e tests need root (network namespaces)")
	}
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	e := &env{root: root, pods: map[string]*netns.NS{}, args: args}
	e.dir, err = os.MkdirTemp("", "dsproxy-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("DSPROXY_E2E_KEEP_LOGS") == "1" {
			t.Logf("dsproxy logs kept in %s", e.dir)
			return
		}
		_ = os.RemoveAll(e.dir)
	})

	// Build the binary while the namespaces and the control plane come up.
	built := make(chan error, 1)
	if b := os.Getenv("DSPROXY_E2E_BIN"); b != "" {
		e.bin = b
		built <- nil
	} else {
		e.bin = filepath.Join(e.dir, "dsproxy")
		go func() {
			cmd := exec.Command("go", "build", "-o", e.bin, "./cmd/dsproxy")
			cmd.Dir = root
			out, err := cmd.CombinedOutput()
			if err != nil {
				err = fmt.Errorf("go build ./cmd/dsproxy: %v\n%s", err, out)
			}
			built <- err
		}()
	}

	// Cleanups run in reverse: the link record is forgotten after the harness
	// deleted the node namespace (and with it the veth to dsproxy-cp).
	var nodeNS string
	t.Cleanup(func() {
		if e.cp != nil && nodeNS != "" {
			if err := e.cp.Unlink(nodeNS); err != nil {
				t.Logf("unlink %s: %v", nodeNS, err)
			}
		}
	})
	e.c = netns.New(t)
	nodeNS = e.c.Node.NetnsName
	e.external = e.c.External
	start := time.Now()
	e.cp = framework.Start(t, nodeNS)
	t.Logf("control plane up in %v", time.Since(start).Round(time.Millisecond))
	// A node has default routes: without them connects to ClusterIPs fail with
	// ENETUNREACH before dsproxy's rules see the packet. Unknown destinations go
	// to the control-plane namespace (which does not forward them).
	for _, gw := range []string{"172.31.255.1", "fd00:ffff::1"} {
		if out, err := netns.Exec(e.c.Node, "ip", "route", "replace", "default", "via", gw, "dev", "cplink"); err != nil {
			t.Fatalf("default route via %s: %v %s", gw, err, out)
		}
	}

	for _, name := range append([]string{"client"}, podNames...) {
		p := e.c.AddPod(name)
		if name == "client" {
			e.client = p
			continue
		}
		p.Serve(netns.TCP, podPort)
		p.Serve(netns.UDP, podPort)
		serveEcho(t, p, echoPort)
		e.pods[name] = p
	}

	e.ns = e.cp.Namespace(t, "e2e")
	e.node = "e2e-" + e.c.Prefix()
	if _, err := e.cp.CreateNode(e.node, netns.NodeIPv4.String(), netns.NodeIPv6.String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.cp.Client.CoreV1().Nodes().Delete(context.Background(), e.node, metav1.DeleteOptions{})
	})

	// dsproxy runs with the credentials of deploy/rbac.yaml's ServiceAccount:
	// the whole suite then proves that least-privilege RBAC suffices.
	// DSPROXY_E2E_ADMIN=1 runs it as cluster admin instead.
	if os.Getenv("DSPROXY_E2E_ADMIN") == "1" {
		e.kubecfg = e.cp.LinkKubeconfig
	} else {
		if out, err := e.cp.Kubectl("apply", "-f", filepath.Join(root, "deploy", "rbac.yaml")); err != nil {
			t.Fatalf("kubectl apply deploy/rbac.yaml: %v\n%s", err, out)
		}
		e.kubecfg = filepath.Join(e.dir, "kubeconfig.sa")
		if err := e.cp.ServiceAccountKubeconfig(context.Background(), "kube-system", "dsproxy",
			"https://172.31.255.1:6443", e.kubecfg, 2*time.Hour); err != nil {
			t.Fatal(err)
		}
		e.saRBAC = true
	}

	if err := <-built; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.stopAll)
	e.startDsproxy(t)
	// Ready: the default/kubernetes Service (10.96.0.1:443 -> 172.31.255.1:6443)
	// connects only through dsproxy's rules.
	start = time.Now()
	if err := e.waitConnect(netip.MustParseAddrPort("10.96.0.1:443"), 60*time.Second); err != nil {
		e.fatalf(t, "dsproxy never programmed default/kubernetes: %v", err)
	}
	t.Logf("dsproxy (pid %d, ServiceAccount RBAC %v) serving in %v", e.cur().pid, e.saRBAC, time.Since(start).Round(time.Millisecond))
	return e
}

func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", errors.New("go.mod not found above " + wd)
		}
	}
}

// --- the dsproxy process ------------------------------------------------------

// startDsproxy runs the binary inside the node namespace, the way a user runs it.
func (e *env) startDsproxy(t *testing.T) *proc {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	logPath := filepath.Join(e.dir, fmt.Sprintf("dsproxy-%d.log", len(e.procs)+1))
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close() // the child has its own descriptor
	cmd := exec.Command("ip", "netns", "exec", e.c.Node.NetnsName, e.bin,
		"--kubeconfig", e.kubecfg,
		"--hostname-override", e.node,
		"--cluster-cidr", "10.64.0.0/16,fd00:64::/56",
		"--metrics-bind-address", "127.0.0.1:10249",
		"-v=2")
	cmd.Args = append(cmd.Args, e.args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatalf("start dsproxy: %v", err)
	}
	p := &proc{cmd: cmd, pid: cmd.Process.Pid, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	e.proc = p
	e.procs = append(e.procs, p)
	return p
}

func (e *env) cur() *proc {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.proc
}

// stop sends SIGTERM and waits for the exit (SIGKILL after 15s).
func (p *proc) stop() error {
	if p.exited() {
		return p.err
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("dsproxy (pid %d) ignored SIGTERM for 15s; killed", p.pid)
	}
}

func (e *env) stopAll() {
	e.mu.Lock()
	procs := slices.Clone(e.procs)
	e.mu.Unlock()
	for _, p := range procs {
		_ = p.stop()
	}
}

// logTail returns the end of the current dsproxy's log (and of the previous
// process's, if it was restarted).
func (e *env) logTail() string {
	e.mu.Lock()
	procs := slices.Clone(e.procs)
	e.mu.Unlock()
	var b strings.Builder
	for i, p := range procs {
		if i < len(procs)-2 {
			continue
		}
		data, _ := os.ReadFile(p.log)
		state := "running"
		if p.exited() {
			state = fmt.Sprintf("exited: %v", p.err)
		}
		fmt.Fprintf(&b, "\n--- dsproxy #%d (pid %d, %s) log tail, %s ---\n%s", i+1, p.pid, state, p.log, framework.Tail(string(data), 40))
	}
	return b.String()
}

// fatalf and errorf report a failure with dsproxy's log tail.
func (e *env) fatalf(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Fatalf(format+"%s", append(args, e.logTail())...)
}

func (e *env) errorf(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Errorf(format+"%s", append(args, e.logTail())...)
}

// checkAlive fails the test if the dsproxy process exited.
func (e *env) checkAlive(t *testing.T) {
	t.Helper()
	if p := e.cur(); p.exited() {
		e.fatalf(t, "dsproxy (pid %d) exited: %v", p.pid, p.err)
	}
}

// waitLog waits until the process's log matches all of subs on some lines.
func (p *proc) waitLog(timeout time.Duration, subs ...string) error {
	deadline := time.Now().Add(timeout)
	for {
		data, _ := os.ReadFile(p.log)
		missing := ""
		for _, s := range subs {
			if !strings.Contains(string(data), s) {
				missing = s
				break
			}
		}
		if missing == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %q in dsproxy #%d's log after %v", missing, p.pid, timeout)
		}
		if p.exited() {
			return fmt.Errorf("dsproxy (pid %d) exited: %v", p.pid, p.err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// --- Kubernetes objects -------------------------------------------------------

// addPods registers harness pods as Pods on the node with the given labels.
func (e *env) addPods(t *testing.T, labels map[string]string, ready bool, names ...string) {
	t.Helper()
	for _, n := range names {
		p := e.pods[n]
		if p == nil {
			t.Fatalf("no harness pod %q", n)
		}
		if _, err := e.cp.CreatePodWithIPs(e.ns, n, e.node, []string{p.IPv4.String(), p.IPv6.String()}, labels, ready); err != nil {
			t.Fatalf("pod %s: %v", n, err)
		}
	}
}

func (e *env) setReady(t *testing.T, ready bool, names ...string) {
	t.Helper()
	for _, n := range names {
		pod, err := e.cp.Client.CoreV1().Pods(e.ns).Get(context.Background(), n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p := e.pods[n]
		if _, err := e.cp.SetPodStatus(pod, []string{p.IPv4.String(), p.IPv6.String()}, ready); err != nil {
			t.Fatalf("pod %s ready=%v: %v", n, ready, err)
		}
	}
}

func (e *env) deletePods(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if err := e.cp.DeletePod(e.ns, n); err != nil {
			t.Fatalf("delete pod %s: %v", n, err)
		}
	}
}

type portSpec struct {
	name   string
	proto  corev1.Protocol
	port   int32
	target int32
}

var (
	tcpHTTP = portSpec{"tcp", corev1.ProtocolTCP, svcPort, podPort}
	udpHTTP = portSpec{"udp", corev1.ProtocolUDP, svcPort, podPort}
	tcpEcho = portSpec{"echo", corev1.ProtocolTCP, echoPort, echoPort}
)

// service returns a Service; families nil means RequireDualStack.
func service(name string, typ corev1.ServiceType, fams []corev1.IPFamily, sel map[string]string, ports ...portSpec) *corev1.Service {
	policy := corev1.IPFamilyPolicySingleStack
	if fams == nil {
		policy = corev1.IPFamilyPolicyRequireDualStack
		fams = families
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Type:           typ,
			Selector:       sel,
			IPFamilyPolicy: &policy,
			IPFamilies:     fams,
		},
	}
	for _, p := range ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{
			Name: p.name, Protocol: p.proto, Port: p.port, TargetPort: intstr.FromInt32(p.target),
		})
	}
	return svc
}

func (e *env) createService(t *testing.T, svc *corev1.Service) *corev1.Service {
	t.Helper()
	out, err := e.cp.Client.CoreV1().Services(e.ns).Create(context.Background(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create service %s: %v", svc.Name, err)
	}
	return out
}

// setLoadBalancerIPs writes status.loadBalancer.ingress as a cloud controller would.
func (e *env) setLoadBalancerIPs(t *testing.T, name string, ips ...netip.Addr) *corev1.Service {
	t.Helper()
	var out *corev1.Service
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc, err := e.cp.Client.CoreV1().Services(e.ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		svc.Status.LoadBalancer.Ingress = nil
		for _, ip := range ips {
			svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip.String()})
		}
		out, err = e.cp.Client.CoreV1().Services(e.ns).UpdateStatus(context.Background(), svc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("service %s: load-balancer status: %v", name, err)
	}
	return out
}

// clusterIP returns the Service's ClusterIP of family f on port, if it has one.
func clusterIP(svc *corev1.Service, f corev1.IPFamily, port uint16) (netip.AddrPort, bool) {
	for _, s := range svc.Spec.ClusterIPs {
		if a, err := netip.ParseAddr(s); err == nil && familyOf(a) == f {
			return netip.AddrPortFrom(a, port), true
		}
	}
	return netip.AddrPort{}, false
}

func nodePort(svc *corev1.Service, portName string) uint16 {
	for _, p := range svc.Spec.Ports {
		if p.Name == portName {
			return uint16(p.NodePort)
		}
	}
	return 0
}

func nodeIP(f corev1.IPFamily) netip.Addr {
	if f == corev1.IPv4Protocol {
		return netns.NodeIPv4
	}
	return netns.NodeIPv6
}

// --- connections --------------------------------------------------------------

const (
	dialTimeout = 2 * time.Second
	// negTimeout bounds a dial that is expected to fail (a dropped packet).
	negTimeout = 400 * time.Millisecond
	// converge bounds how long dsproxy may take to follow an API change.
	converge = 5 * time.Second
)

// reach polls until a proto connection from -> dst is answered by one of
// servers (any server if none given), and returns the reply.
func reach(from *netns.NS, proto netns.Proto, dst netip.AddrPort, within time.Duration, servers ...string) (netns.Reply, error) {
	deadline := time.Now().Add(within)
	for {
		r, err := netns.Dial(from, proto, dst, dialTimeout)
		if err == nil && len(servers) > 0 && !slices.Contains(servers, r.Server) {
			err = fmt.Errorf("answered by %s, want one of %v", r.Server, servers)
		}
		if err == nil {
			return r, nil
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("%s %s from %s: not reachable within %v: %w", proto, dst, from.Name, within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// unreachable polls until a proto connection from -> dst fails (with a refusal
// when refused is set), then checks that two more attempts fail too.
func unreachable(from *netns.NS, proto netns.Proto, dst netip.AddrPort, within time.Duration, refused bool) error {
	deadline := time.Now().Add(within)
	fails := 0
	for fails < 3 {
		r, err := netns.Dial(from, proto, dst, negTimeout)
		switch {
		case err == nil:
			if fails > 0 {
				return fmt.Errorf("%s %s from %s: failed, then answered again by %s", proto, dst, from.Name, r.Server)
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s %s from %s: still answered by %s after %v", proto, dst, from.Name, r.Server, within)
			}
			time.Sleep(100 * time.Millisecond)
		case refused && !netns.IsRefused(err):
			return fmt.Errorf("%s %s from %s: want refused, got %v", proto, dst, from.Name, err)
		default:
			fails++
		}
	}
	return nil
}

// sample dials dst n times over TCP and counts the answering servers.
func sample(from *netns.NS, dst netip.AddrPort, n int) (map[string]int, []error) {
	got := map[string]int{}
	var errs []error
	for range n {
		r, err := netns.Dial(from, netns.TCP, dst, dialTimeout)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		got[r.Server]++
	}
	return got, errs
}

// waitBackends polls until new TCP connections to every dst reach exactly want
// (all refused if want is empty), and returns how long that took.
func waitBackends(from *netns.NS, dsts []netip.AddrPort, want []string, within time.Duration) (time.Duration, error) {
	start := time.Now()
	want = slices.Sorted(slices.Values(want))
	var last string
	for {
		ok := true
		var obs []string
		for _, dst := range dsts {
			got, errs := sample(from, dst, 24)
			servers := slices.Sorted(func(yield func(string) bool) {
				for s := range got {
					if !yield(s) {
						return
					}
				}
			})
			switch {
			case len(want) == 0:
				refusedAll := len(errs) == 24
				for _, err := range errs {
					refusedAll = refusedAll && netns.IsRefused(err)
				}
				ok = ok && refusedAll
			default:
				ok = ok && len(errs) == 0 && slices.Equal(servers, want)
			}
			o := fmt.Sprintf("%s: %v", dst, got)
			if len(errs) > 0 {
				o += fmt.Sprintf(" + %d errors (%v)", len(errs), errs[0])
			}
			obs = append(obs, o)
		}
		last = strings.Join(obs, "; ")
		if ok {
			return time.Since(start), nil
		}
		if time.Since(start) > within {
			return time.Since(start), fmt.Errorf("backends not %v within %v; last seen %s", want, within, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitConnect polls until a TCP connection from the node to dst is established.
func (e *env) waitConnect(dst netip.AddrPort, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		c, err := openConn(e.c.Node, dst, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		if p := e.cur(); p != nil && p.exited() {
			return fmt.Errorf("dsproxy exited: %v", p.err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// openConn opens a TCP connection from the namespace (the socket stays there).
func openConn(from *netns.NS, dst netip.AddrPort, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := netns.RunIn(from, func() error {
		var err error
		c, err = net.DialTimeout("tcp", dst.String(), timeout)
		return err
	})
	return c, err
}

// serveEcho runs a line echo server on port (both families) in the pod: every
// line is answered with "<pod> <line>", and connections stay open.
func serveEcho(t *testing.T, p *netns.NS, port uint16) {
	t.Helper()
	var lns []net.Listener
	err := netns.RunIn(p, func() error {
		for _, a := range []string{fmt.Sprintf("0.0.0.0:%d", port), fmt.Sprintf("[::]:%d", port)} {
			network := "tcp4"
			if strings.HasPrefix(a, "[") {
				network = "tcp6"
			}
			ln, err := net.Listen(network, a)
			if err != nil {
				return err
			}
			lns = append(lns, ln)
		}
		return nil
	})
	if err != nil {
		for _, ln := range lns {
			ln.Close()
		}
		t.Fatalf("%s: echo server: %v", p.Name, err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	for _, ln := range lns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					if errors.Is(err, net.ErrClosed) {
						return
					}
					continue
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer c.Close()
					sc := bufio.NewScanner(c)
					for sc.Scan() {
						if _, err := fmt.Fprintf(c, "%s %s\n", p.Name, sc.Text()); err != nil {
							return
						}
					}
				}()
			}
		}()
	}
	// Registered after netns.New's cleanup: runs before the namespaces go.
	t.Cleanup(func() {
		for _, ln := range lns {
			ln.Close()
		}
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// echoConn is a long-lived connection to an echo server.
type echoConn struct {
	c      net.Conn
	r      *bufio.Reader
	server string
	n      int
}

func openEcho(from *netns.NS, dst netip.AddrPort) (*echoConn, error) {
	c, err := openConn(from, dst, dialTimeout)
	if err != nil {
		return nil, err
	}
	ec := &echoConn{c: c, r: bufio.NewReader(c)}
	if err := ec.ping(); err != nil {
		c.Close()
		return nil, err
	}
	return ec, nil
}

// ping sends one line and checks the echo (from the same server as before).
func (ec *echoConn) ping() error {
	ec.n++
	msg := fmt.Sprintf("ping-%d", ec.n)
	_ = ec.c.SetDeadline(time.Now().Add(dialTimeout))
	if _, err := fmt.Fprintf(ec.c, "%s\n", msg); err != nil {
		return err
	}
	line, err := ec.r.ReadString('\n')
	if err != nil {
		return err
	}
	server, got, _ := strings.Cut(strings.TrimSpace(line), " ")
	if got != msg || (ec.server != "" && server != ec.server) {
		return fmt.Errorf("echo %q, want %q from %s", line, msg, ec.server)
	}
	ec.server = server
	return nil
}

// prober dials targets in a loop until stopped and records every failure.
type prober struct {
	mu       sync.Mutex
	dials    int
	failures []string
	stop     chan struct{}
	wg       sync.WaitGroup
	start    time.Time
	interval time.Duration
}

type probeTarget struct {
	from *netns.NS
	dst  netip.AddrPort
}

// startProber dials the targets in turn, one every interval, and keeps the echo
// connections exchanging a line every 50ms.
func startProber(interval time.Duration, targets []probeTarget, echoes []*echoConn) *prober {
	pr := &prober{stop: make(chan struct{}), start: time.Now(), interval: interval}
	fail := func(format string, args ...any) {
		pr.mu.Lock()
		defer pr.mu.Unlock()
		pr.failures = append(pr.failures, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
	}
	pr.wg.Add(1)
	go func() {
		defer pr.wg.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-pr.stop:
				return
			case <-tick.C:
			}
			tg := targets[i%len(targets)]
			if _, err := netns.Dial(tg.from, netns.TCP, tg.dst, dialTimeout); err != nil {
				fail("%v", err)
			}
			pr.mu.Lock()
			pr.dials++
			pr.mu.Unlock()
		}
	}()
	for _, ec := range echoes {
		pr.wg.Add(1)
		go func() {
			defer pr.wg.Done()
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-pr.stop:
					return
				case <-tick.C:
				}
				if err := ec.ping(); err != nil {
					fail("long-lived connection %s -> %s (%s): %v", ec.c.LocalAddr(), ec.c.RemoteAddr(), ec.server, err)
					return
				}
			}
		}()
	}
	return pr
}

// finish stops the prober and returns the number of dials and the failures.
// ticks is how many dials the prober would have made by now had every one
// taken no time: its running time over its interval.
func (pr *prober) ticks() int { return int(time.Since(pr.start) / pr.interval) }

func (pr *prober) finish() (int, []string) {
	close(pr.stop)
	pr.wg.Wait()
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.dials, pr.failures
}
