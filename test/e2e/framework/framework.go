//go:build e2e

// Package framework gives e2e tests a real Kubernetes control plane (etcd,
// kube-apiserver, kube-controller-manager; no kubelet) started by
// hack/controlplane/up.sh inside the network namespace dsproxy-cp.
//
// The test process stays in its own network namespace: the rest.Config that
// Start returns dials the API server from inside dsproxy-cp (each connection's
// socket is created there), so it works without touching the host namespace.
// Namespaces passed to Start as links are joined to the control plane and can
// reach it at https://172.31.255.1:6443 with LinkKubeconfig.
//
// Since there is no kubelet, "pods" are API objects whose status the test
// writes itself (CreatePodWithIPs); kube-controller-manager turns them into
// EndpointSlices as usual.
//
// Usage:
//
//	func TestMain(m *testing.M) { framework.Main(m) } // stops it after the tests
//
//	func TestX(t *testing.T) {
//		cp := framework.Start(t, "node1") // node1 reaches https://172.31.255.1:6443
//		ns := cp.Namespace(t, "x")
//		cp.CreateNode("node1", "192.0.2.1", "2001:db8::1")
//		cp.CreatePodWithIPs(ns, "p", "node1", []string{"10.64.0.5", "fd00:64::5"}, labels, true)
//		cp.Client.CoreV1().Services(ns).Create(ctx, framework.DualStackService(ns, "s", labels, 80, 8080), ...)
//		cp.WaitForEndpointSlices(ns, "s", corev1.IPv6Protocol, 1)
//	}
//
// Requires root. Environment: DSPROXY_CP_KEEP=1 leaves the control plane
// running after the tests (the next run reuses it); the hack/controlplane
// variables (DSPROXY_CACHE, DSPROXY_CP_RUN, DSPROXY_CP_NETNS) are honoured.
package framework

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
)

// ControlPlane is a running control plane.
type ControlPlane struct {
	// Dir is hack/controlplane.
	Dir string
	// RunDir holds certificates, kubeconfigs and logs (/tmp/dsproxy-cp).
	RunDir string
	// NetNS is the control plane's network namespace (dsproxy-cp).
	NetNS string
	// Kubeconfig points at https://127.0.0.1:6443: valid inside NetNS only.
	Kubeconfig string
	// LinkKubeconfig points at https://172.31.255.1:6443: valid inside the
	// namespaces linked with Start or Link.
	LinkKubeconfig string
	// Bin holds the cached kube-apiserver, kube-controller-manager,
	// kube-proxy and kubectl binaries.
	Bin string
	// Config and Client reach the API server from the test process.
	Config *rest.Config
	Client kubernetes.Interface

	lease    string
	stopOnce sync.Once
}

// Timeout bounds each helper's waits.
var Timeout = 60 * time.Second

var (
	mu     sync.Mutex
	shared *ControlPlane // the control plane of this test process
)

// Start brings the control plane up (or reuses a running one, within this
// process or left by an earlier run or by hack/controlplane/up.sh) and links
// the given network namespaces to it (created if missing). It skips the test
// when not root. All tests of a process share one ControlPlane; use Main in
// TestMain to stop it after the tests, otherwise it is left running and the
// next run reuses it.
func Start(t testing.TB, link ...string) *ControlPlane {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("control plane e2e tests need root (network namespaces)")
	}
	mu.Lock()
	defer mu.Unlock()
	if shared == nil {
		cp, err := newControlPlane()
		if err != nil {
			t.Fatal(err)
		}
		shared = cp
	}
	cp := shared
	start := time.Now()
	// up.sh is cheap (~0.2s) on a healthy control plane: it checks /readyz
	// and adds the links.
	if out, err := cp.script("up.sh", linkArgs(link)...); err != nil {
		t.Fatalf("up.sh: %v\n%s", err, out)
	}
	t.Logf("control plane ready in %v (run dir %s)", time.Since(start).Round(time.Millisecond), cp.RunDir)
	if cp.Client == nil {
		if err := cp.loadClient(); err != nil {
			t.Fatal(err)
		}
	}
	return cp
}

// Main runs the tests and then Stop: use it as TestMain's body.
func Main(m *testing.M) {
	code := m.Run()
	mu.Lock()
	cp := shared
	mu.Unlock()
	if cp != nil {
		cp.Stop()
	}
	os.Exit(code)
}

func newControlPlane() (*ControlPlane, error) {
	dir, err := scriptsDir()
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{
		Dir:    dir,
		RunDir: envOr("DSPROXY_CP_RUN", "/tmp/dsproxy-cp"),
		NetNS:  envOr("DSPROXY_CP_NETNS", "dsproxy-cp"),
	}
	cp.Kubeconfig = filepath.Join(cp.RunDir, "kubeconfig")
	cp.LinkKubeconfig = filepath.Join(cp.RunDir, "kubeconfig.link")
	// The lease is written before up.sh so that a concurrent Stop in another
	// test process does not tear down a control plane we are about to reuse.
	leases := filepath.Join(cp.RunDir, "leases")
	if err := os.MkdirAll(leases, 0o755); err != nil {
		return nil, err
	}
	cp.lease = filepath.Join(leases, strconv.Itoa(os.Getpid()))
	return cp, os.WriteFile(cp.lease, nil, 0o644)
}

func (cp *ControlPlane) loadClient() error {
	env, err := os.ReadFile(filepath.Join(cp.RunDir, "env"))
	if err != nil {
		return err
	}
	for _, l := range strings.Split(string(env), "\n") {
		if v, ok := strings.CutPrefix(l, "DSPROXY_CP_BIN="); ok {
			cp.Bin = v
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.Dial = DialInNetNS(filepath.Join("/run/netns", cp.NetNS))
	cfg.QPS, cfg.Burst = 100, 200
	cp.Config = cfg
	cp.Client, err = kubernetes.NewForConfig(cfg)
	return err
}

// Link joins more network namespaces (created if missing) to the control plane.
func (cp *ControlPlane) Link(netns ...string) error {
	out, err := cp.script("up.sh", linkArgs(netns)...)
	if err != nil {
		return fmt.Errorf("up.sh: %v\n%s", err, out)
	}
	return nil
}

// Stop releases this process's lease and, if the framework started the
// control plane (not a person with up.sh) and no other live test process
// holds a lease, runs down.sh. DSPROXY_CP_KEEP=1 keeps it running.
func (cp *ControlPlane) Stop() {
	cp.stopOnce.Do(func() {
		mu.Lock()
		if shared == cp {
			shared = nil
		}
		mu.Unlock()
		_ = os.Remove(cp.lease)
		if os.Getenv("DSPROXY_CP_KEEP") == "1" {
			return
		}
		by, _ := os.ReadFile(filepath.Join(cp.RunDir, "started-by"))
		if strings.TrimSpace(string(by)) != "framework" {
			return // started by hand (up.sh): leave it running
		}
		entries, _ := os.ReadDir(filepath.Dir(cp.lease))
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if syscall.Kill(pid, 0) == nil {
				return // another test process still uses it
			}
			_ = os.Remove(filepath.Join(filepath.Dir(cp.lease), e.Name()))
		}
		if out, err := cp.script("down.sh"); err != nil {
			fmt.Fprintf(os.Stderr, "framework: down.sh: %v\n%s", err, out)
		}
	})
}

// Kubectl runs the cached kubectl inside the control-plane netns with the admin
// kubeconfig and returns its combined output.
func (cp *ControlPlane) Kubectl(args ...string) (string, error) {
	return cp.script("kubectl.sh", args...)
}

// Namespace creates a namespace with a generated name and waits until its
// "default" ServiceAccount exists (pods cannot be created before). It is
// deleted at the end of the test.
func (cp *ControlPlane) Namespace(t testing.TB, prefix string) string {
	t.Helper()
	ctx := context.Background()
	ns, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.Client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, Timeout, true, func(ctx context.Context) (bool, error) {
		_, err := cp.Client.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("namespace %s: no default ServiceAccount: %v", ns.Name, err)
	}
	return ns.Name
}

// CreateNode creates a Node with the given InternalIPs (one per family) and
// sets its Ready condition. kube-controller-manager allocates its podCIDRs.
// Node objects are cluster-scoped and outlive the test; delete them yourself
// if names may collide.
func (cp *ControlPlane) CreateNode(name string, ips ...string) (*corev1.Node, error) {
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:   name,
		Labels: map[string]string{corev1.LabelHostname: name},
	}}
	if _, err := cp.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	var out *corev1.Node
	// node-ipam-controller writes spec.podCIDRs concurrently: retry on conflict.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cp.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		n.Status.Conditions = []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: now, LastTransitionTime: now,
		}}
		n.Status.Addresses = nil
		for _, ip := range ips {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
		}
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: name})
		out, err = cp.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	return out, err
}

// CreatePodWithIPs creates a pod bound to node and then writes the status a
// kubelet would: phase Running, podIP(s) (at most one per family, primary
// first) and the Ready/ContainersReady conditions set to ready.
func (cp *ControlPlane) CreatePodWithIPs(ns, name, node string, ips []string, labels map[string]string, ready bool) (*corev1.Pod, error) {
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			AutomountServiceAccountToken:  new(false),
			TerminationGracePeriodSeconds: new(int64(0)),
			Containers:                    []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	pod, err := cp.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	return cp.SetPodStatus(pod, ips, ready)
}

// DeletePod deletes a pod immediately (grace period 0): with no kubelet a
// graceful deletion would leave it Terminating forever.
func (cp *ControlPlane) DeletePod(ns, name string) error {
	return cp.Client.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
}

// SetPodStatus (re)writes a pod's status like a kubelet would.
func (cp *ControlPlane) SetPodStatus(pod *corev1.Pod, ips []string, ready bool) (*corev1.Pod, error) {
	now := metav1.Now()
	cond := corev1.ConditionFalse
	if ready {
		cond = corev1.ConditionTrue
	}
	st := corev1.PodStatus{
		Phase:     corev1.PodRunning,
		StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: cond, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: cond, LastTransitionTime: now},
		},
		ContainerStatuses: []corev1.ContainerStatus{{
			Name: "c", Image: pod.Spec.Containers[0].Image, Ready: ready, Started: new(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		}},
	}
	if len(ips) > 0 {
		st.PodIP = ips[0]
	}
	for _, ip := range ips {
		st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: ip})
	}
	if n, err := cp.Client.CoreV1().Nodes().Get(context.Background(), pod.Spec.NodeName, metav1.GetOptions{}); err == nil {
		for _, a := range n.Status.Addresses {
			if a.Type != corev1.NodeInternalIP {
				continue
			}
			if st.HostIP == "" {
				st.HostIP = a.Address
			}
			st.HostIPs = append(st.HostIPs, corev1.HostIP{IP: a.Address})
		}
	}
	var out *corev1.Pod
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := cp.Client.CoreV1().Pods(pod.Namespace).Get(context.Background(), pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		p.Status = st
		out, err = cp.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
		return err
	})
	return out, err
}

// DualStackService returns (does not create) a RequireDualStack ClusterIP
// Service selecting selector on TCP port -> targetPort.
func DualStackService(ns, name string, selector map[string]string, port, targetPort int32) *corev1.Service {
	policy := corev1.IPFamilyPolicyRequireDualStack
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector:       selector,
			IPFamilyPolicy: &policy,
			IPFamilies:     []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			Ports: []corev1.ServicePort{{
				Name: "p", Protocol: corev1.ProtocolTCP, Port: port,
				TargetPort: intstr.FromInt32(targetPort),
			}},
		},
	}
}

// WaitForEndpointSlices waits until the Service's EndpointSlices of family
// (IPv4 or IPv6) hold exactly n ready endpoints, and returns those slices.
func (cp *ControlPlane) WaitForEndpointSlices(ns, svc string, family corev1.IPFamily, n int) ([]discoveryv1.EndpointSlice, error) {
	var ready int
	got, err := cp.WaitForEndpointSlicesFunc(ns, svc, family, func(eps []discoveryv1.EndpointSlice) bool {
		ready = len(ReadyAddresses(eps))
		return ready == n
	})
	if err != nil {
		return got, fmt.Errorf("service %s/%s: %d ready %s endpoints, want %d: %w", ns, svc, ready, family, n, err)
	}
	return got, nil
}

// WaitForEndpointSlicesFunc waits until cond holds for the Service's
// EndpointSlices of family, and returns them.
func (cp *ControlPlane) WaitForEndpointSlicesFunc(ns, svc string, family corev1.IPFamily, cond func([]discoveryv1.EndpointSlice) bool) ([]discoveryv1.EndpointSlice, error) {
	want := discoveryv1.AddressTypeIPv4
	if family == corev1.IPv6Protocol {
		want = discoveryv1.AddressTypeIPv6
	}
	var got []discoveryv1.EndpointSlice
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, Timeout, true, func(ctx context.Context) (bool, error) {
		list, err := cp.Client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{
			LabelSelector: discoveryv1.LabelServiceName + "=" + svc,
		})
		if err != nil {
			return false, nil
		}
		got = got[:0]
		for _, s := range list.Items {
			if s.AddressType == want {
				got = append(got, s)
			}
		}
		return cond(got), nil
	})
	return got, err
}

// ReadyAddresses returns the addresses of the slices' ready endpoints, sorted.
func ReadyAddresses(eps []discoveryv1.EndpointSlice) []string {
	var out []string
	for _, s := range eps {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				out = append(out, e.Addresses...)
			}
		}
	}
	slices.Sort(out)
	return out
}

// EndpointAddresses flattens the addresses of the slices' endpoints, sorted.
func EndpointAddresses(eps []discoveryv1.EndpointSlice) []string {
	var out []string
	for _, s := range eps {
		for _, e := range s.Endpoints {
			out = append(out, e.Addresses...)
		}
	}
	slices.Sort(out)
	return out
}

// DialInNetNS returns a dialer whose sockets are created inside the network
// namespace at nsPath (e.g. /run/netns/dsproxy-cp). A socket keeps the
// namespace it was created in, so only the socket() call needs the switch.
func DialInNetNS(nsPath string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			c, restored, err := dialIn(ctx, d, nsPath, network, addr)
			if restored {
				runtime.UnlockOSThread()
			} // else: leave the thread locked; Go destroys it when the goroutine exits
			ch <- result{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}

func dialIn(ctx context.Context, d *net.Dialer, nsPath, network, addr string) (c net.Conn, restored bool, err error) {
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, true, err
	}
	defer orig.Close()
	target, err := os.Open(nsPath)
	if err != nil {
		return nil, true, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, true, fmt.Errorf("setns %s: %w", nsPath, err)
	}
	c, err = d.DialContext(ctx, network, addr)
	restored = unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil
	return c, restored, err
}

func (cp *ControlPlane) script(name string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(cp.Dir, name), args...)
	cmd.Env = append(os.Environ(), "DSPROXY_CP_OWNER=framework")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func linkArgs(netns []string) []string {
	var args []string
	for _, ns := range netns {
		args = append(args, "--link", ns)
	}
	return args
}

func scriptsDir() (string, error) {
	if d := os.Getenv("DSPROXY_CONTROLPLANE_DIR"); d != "" {
		return d, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		p := filepath.Join(d, "hack", "controlplane")
		if _, err := os.Stat(filepath.Join(p, "up.sh")); err == nil {
			return p, nil
		}
		if filepath.Dir(d) == d {
			return "", errors.New("hack/controlplane/up.sh not found above " + wd)
		}
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
