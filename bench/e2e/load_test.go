//go:build e2e && netns

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/dsproxy/dsproxy/bench"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/test/e2e/framework"
)

const (
	managedBy    = "dsproxy-bench" // not kube-controller-manager's: it leaves the slices alone
	endpoints    = 10              // per family and Service (without -count-spread)
	realEvery    = 64              // every realEvery-th Service (and each size's last) has real endpoints
	podPort      = 8080
	svcPort      = 80
	serverPods   = 10 // p0..p9, the real endpoints (more with -count-spread above 10)
	maxSpread    = 64 // bench.EndpointIP gives each Service 64 addresses
	sampleTarget = 16 // W1: Services checked besides the last one
)

// podAddrs returns server pod k's addresses: the harness gives the n-th pod
// added 10.64.0.n / fd00:64::n, and each node adds "client" first, then p0..p9.
func podAddrs(k int) [2]netip.Addr {
	n := byte(k + 2)
	return [2]netip.Addr{
		netip.AddrFrom4([4]byte{10, 64, 0, n}),
		netip.AddrFrom16([16]byte{0: 0xfd, 1: 0x00, 2: 0x00, 3: 0x64, 15: n}),
	}
}

var fams = []*family.Family{family.IPv4, family.IPv6}

// load is the workload in the API server: Services svc-0 … svc-(have-1) in
// namespace ns, plus the W2 "probe" Service.
type load struct {
	t      testing.TB
	cp     *framework.ControlPlane
	client kubernetes.Interface
	ns     string
	w      bench.Workload
	sizes  map[int]bool // the last index of each size has real endpoints
	// spread is -count-spread: 0, or K for Services with 1 … K endpoints per
	// family, the real ones K.
	spread int

	prev, have int
	// ips[i] are Service i's ClusterIPs (IPv4, IPv6) as allocated.
	ips   [][2]netip.Addr
	probe [2]netip.Addr
	// probeAt[fi] is the server pod the probe's slice of family fi points at;
	// probeSlice[fi] is that slice as the API server last returned it.
	probeAt      [2]int
	probeSlice   [2]*discoveryv1.EndpointSlice
	w3           int
	baselineDone bool
	// events are the watch events of ns, for the API / proxy split of W2 and W3.
	events *eventLog
	// etcd is set with -load=etcd: grow writes into etcd (etcdload_test.go).
	etcd *etcdLoad
	// ctx ends with the test; stopEvents ends the event log's watches.
	ctx        context.Context
	stopEvents context.CancelFunc
}

// watchEvents starts l.events afresh, ending the watches of the one before.
func (l *load) watchEvents() error {
	if l.stopEvents != nil {
		l.stopEvents()
	}
	ctx, cancel := context.WithCancel(l.ctx)
	l.stopEvents = cancel
	var err error
	l.events, err = watchEvents(ctx, l.client, l.ns)
	return err
}

// awaitEarlierLoads waits until the namespaces of earlier runs' loads that are
// being deleted are gone: kube-controller-manager deletes their Services one by
// one (minutes at 10k), and until it has, their NodePorts and ClusterIPs are
// still allocated, so a new load of the same size would find the NodePort range
// full.
func awaitEarlierLoads(ctx context.Context, logf func(string, ...any), client kubernetes.Interface) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	nss, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, ns := range nss.Items {
		if !strings.HasPrefix(ns.Name, "bench-") || ns.DeletionTimestamp == nil {
			continue
		}
		start := time.Now()
		for {
			svcs, err := client.CoreV1().Services(ns.Name).List(ctx, metav1.ListOptions{Limit: 1})
			if err != nil {
				return fmt.Errorf("namespace %s of an earlier run, being deleted: %w", ns.Name, err)
			}
			left := int64(len(svcs.Items))
			if r := svcs.RemainingItemCount; r != nil {
				left += *r
			}
			if _, err := client.CoreV1().Namespaces().Get(ctx, ns.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				break
			} else if err != nil {
				return err
			}
			logf("namespace %s of an earlier run is being deleted: %d Services left (waiting %v)", ns.Name, left, time.Since(start).Round(time.Second))
			select {
			case <-ctx.Done():
				return fmt.Errorf("namespace %s of an earlier run still there after %v, %d Services left (hack/controlplane/down.sh, and the next run starts on an empty etcd)", ns.Name, time.Since(start).Round(time.Second), left)
			case <-time.After(10 * time.Second):
			}
		}
	}
	return nil
}

func newLoad(t testing.TB, cp *framework.ControlPlane, sizes []int, spread int) (*load, error) {
	if err := checkSpread(spread); err != nil {
		return nil, err
	}
	maxN := sizes[len(sizes)-1]
	cfg := rest.CopyConfig(cp.Config)
	cfg.QPS, cfg.Burst = 5000, 10000
	// Protobuf costs the API server less CPU than JSON.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if err := awaitEarlierLoads(context.Background(), t.Logf, client); err != nil {
		return nil, err
	}
	l := &load{
		t: t, cp: cp, client: client,
		ns: cp.Namespace(t, "bench"),
		// NodePortEvery as in the kernel bench: every 4th, at most 2500 NodePorts.
		w:      bench.Workload{EndpointsPerFamily: endpoints, CountSpread: spread, NodePortEvery: max(4, (maxN+2499)/2500)},
		sizes:  map[int]bool{},
		spread: spread,
	}
	for _, n := range sizes {
		l.sizes[n] = true
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	l.ctx = ctx
	if err := l.watchEvents(); err != nil {
		return nil, err
	}
	probe, err := l.createService(context.Background(), "probe", corev1.ServiceTypeClusterIP)
	if err != nil {
		return nil, err
	}
	l.probe = probe
	for i, f := range fams {
		if l.probeSlice[i], err = l.client.DiscoveryV1().EndpointSlices(l.ns).Create(context.Background(),
			l.slice("probe", f, []netip.Addr{podAddrs(0)[i]}), metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	}
	switch *flagLoad {
	case "api":
	case "etcd":
		if l.etcd, err = newEtcdLoad(context.Background(), l); err != nil {
			return nil, fmt.Errorf("-load=etcd: %w", err)
		}
		// Before the namespace's deletion (cleanups run last first).
		t.Cleanup(func() {
			if err := l.cleanEtcd(context.Background()); err != nil {
				t.Errorf("-load=etcd: deleting the load from etcd: %v", err)
			}
		})
	default:
		return nil, fmt.Errorf("-load=%q: want api or etcd", *flagLoad)
	}
	return l, nil
}

func checkSpread(k int) error {
	if k != 0 && (k < 2 || k > maxSpread) {
		return fmt.Errorf("-count-spread=%d: want 0 or 2 … %d", k, maxSpread)
	}
	return nil
}

// real reports whether Service i's endpoints are the server pods.
func (l *load) real(i int) bool { return i%realEvery == 0 || l.sizes[i+1] }

// count is Service i's number of endpoints per family: 10, or with a spread K
// 1 + i%K, and K for the real ones, so that W1's and W4's targets hold the
// largest of K endpoint counts (a proxy whose rules are per count and walked in
// turn, as dsproxy's were before 2f54501, pays for every smaller one).
func (l *load) count(i int) int {
	if l.spread > 0 && l.real(i) {
		return l.spread
	}
	return l.w.EndpointCount(i)
}

// pods is the number of server pods a node has: p0 … p(pods-1).
func (l *load) pods() int { return max(serverPods, l.spread) }

// nodePort reports whether Service i of the load is of type NodePort.
func (l *load) nodePort(i int) bool { return l.w.NodePortEvery > 0 && i%l.w.NodePortEvery == 0 }

// serviceToCreate is the selector-less RequireDualStack Service createService
// posts: ClusterIPs and NodePort left to the API server.
func (l *load) serviceToCreate(name string, typ corev1.ServiceType) *corev1.Service {
	s := l.w.Service(0)
	s.ObjectMeta = metav1.ObjectMeta{Name: name, Namespace: l.ns}
	s.Spec.Type = typ
	s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
	s.Spec.Ports[0].NodePort = 0
	return s
}

// createService creates a selector-less RequireDualStack Service (ClusterIPs
// and NodePort allocated by the API server) and returns its ClusterIPs.
func (l *load) createService(ctx context.Context, name string, typ corev1.ServiceType) ([2]netip.Addr, error) {
	s := l.serviceToCreate(name, typ)
	var got *corev1.Service
	err := retry.OnError(retry.DefaultBackoff, func(error) bool { return true }, func() error {
		var err error
		got, err = l.client.CoreV1().Services(l.ns).Create(ctx, s, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return [2]netip.Addr{}, fmt.Errorf("service %s: %w", name, err)
	}
	var ips [2]netip.Addr
	for _, c := range got.Spec.ClusterIPs {
		a, err := netip.ParseAddr(c)
		if err != nil {
			return ips, fmt.Errorf("service %s: clusterIP %q: %w", name, c, err)
		}
		if a.Is4() {
			ips[0] = a
		} else {
			ips[1] = a
		}
	}
	if !ips[0].IsValid() || !ips[1].IsValid() {
		return ips, fmt.Errorf("service %s: not dual-stack: %v", name, got.Spec.ClusterIPs)
	}
	return ips, nil
}

func sliceName(svc string, f *family.Family) string { return svc + "-" + strings.ToLower(f.Name) }

// slice returns Service svc's EndpointSlice of family f with the given
// endpoints, shaped as bench.Workload's.
func (l *load) slice(svc string, f *family.Family, addrs []netip.Addr) *discoveryv1.EndpointSlice {
	es := l.w.Slice(f, 0, len(addrs))
	es.ObjectMeta = metav1.ObjectMeta{
		Name: sliceName(svc, f), Namespace: l.ns,
		Labels: map[string]string{
			discoveryv1.LabelServiceName: svc,
			discoveryv1.LabelManagedBy:   managedBy,
		},
	}
	for j, a := range addrs {
		es.Endpoints[j].Addresses = []string{a.String()}
	}
	return es
}

// workloadSlice is Service i's slice: bench.Workload's endpoints, or the
// server pods for real Services.
func (l *load) workloadSlice(i int, fi int) *discoveryv1.EndpointSlice {
	f := fams[fi]
	addrs := make([]netip.Addr, l.count(i))
	for j := range addrs {
		if l.real(i) {
			addrs[j] = podAddrs(j)[fi]
		} else {
			addrs[j] = bench.EndpointIP(f, i, j)
		}
	}
	return l.slice(fmt.Sprintf("svc-%d", i), f, addrs)
}

// grow creates Services have…n-1 and their slices with concurrent writers.
func (l *load) grow(ctx context.Context, n int) error {
	l.prev = l.have
	l.ips = append(l.ips, make([][2]netip.Addr, n-l.have)...)
	if l.etcd != nil {
		if err := l.growEtcd(ctx, n); err != nil {
			return err
		}
		l.have = n
		return nil
	}
	idx := make(chan int)
	var (
		wg       sync.WaitGroup
		firstErr atomic.Pointer[error]
	)
	for range *flagWorkers {
		wg.Go(func() {
			for i := range idx {
				if firstErr.Load() != nil {
					continue
				}
				if err := l.createOne(ctx, i); err != nil {
					firstErr.CompareAndSwap(nil, &err)
				}
			}
		})
	}
	for i := l.have; i < n; i++ {
		idx <- i
	}
	close(idx)
	wg.Wait()
	if p := firstErr.Load(); p != nil {
		return *p
	}
	l.have = n
	return nil
}

func (l *load) createOne(ctx context.Context, i int) error {
	typ := corev1.ServiceTypeClusterIP
	if l.nodePort(i) {
		typ = corev1.ServiceTypeNodePort
	}
	ips, err := l.createService(ctx, fmt.Sprintf("svc-%d", i), typ)
	if err != nil {
		return err
	}
	l.ips[i] = ips
	for fi := range fams {
		es := l.workloadSlice(i, fi)
		err := retry.OnError(retry.DefaultBackoff, func(error) bool { return true }, func() error {
			_, err := l.client.DiscoveryV1().EndpointSlices(l.ns).Create(ctx, es, metav1.CreateOptions{})
			return err
		})
		if err != nil {
			return fmt.Errorf("slice %s: %w", es.Name, err)
		}
	}
	return nil
}

// sample returns the W1 targets for size n: the last Service and up to
// sampleTarget other real ones spread over 0…n-1.
func (l *load) sample(n int) []int {
	var real []int
	for i := 0; i < n-1; i++ {
		if l.real(i) {
			real = append(real, i)
		}
	}
	var out []int
	step := max(1, len(real)/sampleTarget)
	for k := 0; k < len(real) && len(out) < sampleTarget; k += step {
		out = append(out, real[k])
	}
	return append(out, n-1)
}

// setProbe points the probe Service's slice of family fi at server pod k with
// one Update of the slice as last written, as an EndpointSlice controller
// updates from its informer's copy (a read first would add a round trip to the
// measured change); only a conflict makes it read the slice and try again.
func (l *load) setProbe(ctx context.Context, fi, k int) error {
	want := l.slice("probe", fams[fi], []netip.Addr{podAddrs(k)[fi]}).Endpoints
	cur := l.probeSlice[fi].DeepCopy()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if cur == nil {
			var err error
			if cur, err = l.client.DiscoveryV1().EndpointSlices(l.ns).Get(ctx, sliceName("probe", fams[fi]), metav1.GetOptions{}); err != nil {
				return err
			}
		}
		cur.Endpoints = want
		got, err := l.client.DiscoveryV1().EndpointSlices(l.ns).Update(ctx, cur, metav1.UpdateOptions{})
		if err != nil {
			cur = nil
			return err
		}
		l.probeSlice[fi] = got
		return nil
	})
}

func (l *load) nextW3() int { l.w3++; return l.w3 }

// createSlices creates Service svc's two slices, each with the ten server pods.
func (l *load) createSlices(ctx context.Context, svc string) error {
	for fi, f := range fams {
		addrs := make([]netip.Addr, endpoints)
		for j := range addrs {
			addrs[j] = podAddrs(j)[fi]
		}
		if _, err := l.client.DiscoveryV1().EndpointSlices(l.ns).Create(ctx, l.slice(svc, f, addrs), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("slice %s: %w", sliceName(svc, f), err)
		}
	}
	return nil
}

// deleteService deletes Service svc, then its slices.
func (l *load) deleteService(ctx context.Context, svc string) error {
	if err := l.client.CoreV1().Services(l.ns).Delete(ctx, svc, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete service %s: %w", svc, err)
	}
	for _, f := range fams {
		if err := l.client.DiscoveryV1().EndpointSlices(l.ns).Delete(ctx, sliceName(svc, f), metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("delete slice %s: %w", sliceName(svc, f), err)
		}
	}
	return nil
}
