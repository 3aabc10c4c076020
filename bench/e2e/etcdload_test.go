//go:build e2e && netns

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/dsproxy/dsproxy/test/e2e/framework"
)

// -load=etcd: the load's Services, their IPAddresses and EndpointSlices are
// written straight into the control plane's etcd, in the API server's storage
// encoding, rather than created through the API server. A v1.36 API server's
// ClusterIP allocator lists every IPAddress of the family four times per
// Service created (apialloc/), so creating 30k Services through it takes longer
// than a session on this VM; the proxies cannot tell: they list and watch the
// same objects from the same API server either way. Only the load is written so;
// the probe Service and W3's Services are created through the API server, as
// in -load=api.

// etcdKV is the control plane's etcd, spoken to through its gRPC gateway (JSON
// over HTTP on the client port, which hack/controlplane/up.sh has on
// 127.0.0.1:2379 in the control plane's network namespace), so that no etcd
// client module is needed.
type etcdKV struct {
	hc  *http.Client
	url string
}

func newEtcdKV(cp *framework.ControlPlane) *etcdKV {
	tr := &http.Transport{
		DialContext:         framework.DialInNetNS(filepath.Join("/run/netns", cp.NetNS)),
		MaxIdleConnsPerHost: 8,
	}
	return &etcdKV{hc: &http.Client{Transport: tr, Timeout: time.Minute}, url: "http://127.0.0.1:2379"}
}

// etcdKeyValue is a key with its value as the gateway returns and takes them
// ([]byte is base64 in JSON, as the gateway wants).
type etcdKeyValue struct {
	Key         []byte `json:"key"`
	Value       []byte `json:"value,omitempty"`
	ModRevision int64  `json:"mod_revision,string,omitempty"`
}

type etcdRange struct {
	Key      []byte `json:"key"`
	RangeEnd []byte `json:"range_end,omitempty"`
}

type etcdOp struct {
	Put    *etcdKeyValue `json:"request_put,omitempty"`
	Delete *etcdRange    `json:"request_delete_range,omitempty"`
}

// etcdCmp is one compare of a transaction: key's create or mod revision
// ("CREATE" or "MOD") equals rev.
type etcdCmp struct {
	target string
	key    []byte
	rev    int64
}

func (c etcdCmp) MarshalJSON() ([]byte, error) {
	field := map[string]string{"CREATE": "create_revision", "MOD": "mod_revision"}[c.target]
	if field == "" {
		return nil, fmt.Errorf("compare target %q", c.target)
	}
	return json.Marshal(map[string]any{"target": c.target, "key": c.key, field: strconv.FormatInt(c.rev, 10), "result": "EQUAL"})
}

func (e *etcdKV) call(ctx context.Context, path string, req, resp any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	r.Header.Set("Content-Type", "application/json")
	res, err := e.hc.Do(r)
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s: %s", path, res.Status, bytes.TrimSpace(b))
	}
	if err := json.Unmarshal(b, resp); err != nil {
		return fmt.Errorf("etcd %s: %w in %.200q", path, err, b)
	}
	return nil
}

// get returns key's value and mod revision; found is false if it has none.
func (e *etcdKV) get(ctx context.Context, key string) (kv etcdKeyValue, found bool, err error) {
	var resp struct {
		Kvs []etcdKeyValue `json:"kvs"`
	}
	if err := e.call(ctx, "/v3/kv/range", etcdRange{Key: []byte(key)}, &resp); err != nil {
		return kv, false, err
	}
	if len(resp.Kvs) == 0 {
		return kv, false, nil
	}
	return resp.Kvs[0], true, nil
}

// txn runs ops if every compare holds; ok is whether they held.
func (e *etcdKV) txn(ctx context.Context, cmps []etcdCmp, ops []etcdOp) (ok bool, err error) {
	var resp struct {
		Succeeded bool `json:"succeeded"`
	}
	req := map[string]any{"success": ops}
	if len(cmps) > 0 {
		req["compare"] = cmps
	}
	if err := e.call(ctx, "/v3/kv/txn", req, &resp); err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// prefixEnd is the end of the range of keys with prefix p.
func prefixEnd(p string) []byte {
	b := []byte(p)
	b[len(b)-1]++
	return b
}

// storageCodec writes objects as kube-apiserver stores them by default:
// protobuf behind the "k8s\x00" magic, with apiVersion and kind.
var storageCodec = protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)

func storageBytes(obj runtime.Object, gvk schema.GroupVersionKind) ([]byte, error) {
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	var b bytes.Buffer
	if err := storageCodec.Encode(obj, &b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

var (
	gvkService   = corev1.SchemeGroupVersion.WithKind("Service")
	gvkSlice     = discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice")
	gvkIPAddress = networkingv1.SchemeGroupVersion.WithKind("IPAddress")
	gvkRange     = corev1.SchemeGroupVersion.WithKind("RangeAllocation")
)

// The API server's keys (its default --etcd-prefix /registry).
const (
	nodePortsKey = "/registry/ranges/servicenodeports"
	ipAddrPrefix = "/registry/ipaddresses/"
)

func serviceKey(ns, name string) string { return "/registry/services/specs/" + ns + "/" + name }
func sliceKey(ns, name string) string   { return "/registry/endpointslices/" + ns + "/" + name }

// etcdLoad is what -load=etcd needs besides etcd: objects the API server made,
// to copy (so that the written ones are defaulted and carry managed fields as
// the API server's own), and the addresses and ports in use.
type etcdLoad struct {
	kv *etcdKV
	// svc[t] is a Service of type t as the API server returns it from a
	// dry-run create of what createService posts.
	svc map[corev1.ServiceType]*corev1.Service
	// sliceFields[fi] are the managed fields of a created slice of family fi.
	sliceFields [2][]metav1.ManagedFieldsEntry
	// ipAddr[fi] is the probe's IPAddress of family fi, as the allocator made it.
	ipAddr [2]*networkingv1.IPAddress
	cidrs  [2]netip.Prefix
	// next[fi] is the next address to try in cidrs[fi]; taken the addresses
	// in use when the load began, or written by it.
	next  [2]netip.Addr
	taken map[netip.Addr]bool
	// ports are the NodePorts the load has written (for the cleanup); uids
	// the UIDs of the IPAddresses it has written.
	ports []int32
	uids  map[string]types.UID
}

// newEtcdLoad prepares l for -load=etcd; l.probe must exist.
func newEtcdLoad(ctx context.Context, l *load) (*etcdLoad, error) {
	e := &etcdLoad{kv: newEtcdKV(l.cp), svc: map[corev1.ServiceType]*corev1.Service{}, taken: map[netip.Addr]bool{}, uids: map[string]types.UID{}}
	cidr, err := l.client.NetworkingV1().ServiceCIDRs().Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("ServiceCIDR kubernetes: %w", err)
	}
	for _, c := range cidr.Spec.CIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("ServiceCIDR kubernetes: %w", err)
		}
		fi := 0
		if p.Addr().Is6() {
			fi = 1
		}
		e.cidrs[fi] = p.Masked()
		// The network address is never allocated; start after it.
		e.next[fi] = p.Masked().Addr().Next()
	}
	if !e.cidrs[0].IsValid() || !e.cidrs[1].IsValid() {
		return nil, fmt.Errorf("ServiceCIDR kubernetes is not dual-stack: %v", cidr.Spec.CIDRs)
	}
	ips, err := l.client.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, ip := range ips.Items {
		if a, err := netip.ParseAddr(ip.Name); err == nil {
			e.taken[a] = true
		}
	}
	for fi := range fams {
		if e.ipAddr[fi], err = l.client.NetworkingV1().IPAddresses().Get(ctx, l.probe[fi].String(), metav1.GetOptions{}); err != nil {
			return nil, fmt.Errorf("the probe's IPAddress: %w", err)
		}
		e.sliceFields[fi] = l.probeSlice[fi].ManagedFields
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	for _, typ := range []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort} {
		s := l.serviceToCreate("svc-template", typ)
		got, err := l.client.CoreV1().Services(l.ns).Create(ctx, s, dry)
		if err != nil {
			return nil, fmt.Errorf("dry-run create of a %s Service: %w", typ, err)
		}
		e.svc[typ] = got
	}
	return e, nil
}

// addr returns the next free address of family fi.
func (e *etcdLoad) addr(fi int) (netip.Addr, error) {
	for a := e.next[fi]; e.cidrs[fi].Contains(a); a = a.Next() {
		// The last address (IPv4's broadcast) is never allocated either.
		if e.taken[a] || !e.cidrs[fi].Contains(a.Next()) {
			continue
		}
		e.taken[a] = true
		e.next[fi] = a.Next()
		return a, nil
	}
	return netip.Addr{}, fmt.Errorf("service CIDR %v is full", e.cidrs[fi])
}

// nodePortBitmap is the API server's NodePort bitmap as read from etcd.
type nodePortBitmap struct {
	ra     *corev1.RangeAllocation
	base   int
	size   int
	bits   *big.Int
	modRev int64
}

func (e *etcdLoad) readNodePorts(ctx context.Context) (nodePortBitmap, error) {
	kv, found, err := e.kv.get(ctx, nodePortsKey)
	if err != nil {
		return nodePortBitmap{}, err
	}
	if !found {
		return nodePortBitmap{}, fmt.Errorf("%s: not in etcd", nodePortsKey)
	}
	obj, _, err := storageCodec.Decode(kv.Value, nil, nil)
	if err != nil {
		return nodePortBitmap{}, fmt.Errorf("%s: %w", nodePortsKey, err)
	}
	ra, ok := obj.(*corev1.RangeAllocation)
	if !ok {
		return nodePortBitmap{}, fmt.Errorf("%s: a %T", nodePortsKey, obj)
	}
	base, size, err := parsePortRange(ra.Range)
	if err != nil {
		return nodePortBitmap{}, fmt.Errorf("%s: %w", nodePortsKey, err)
	}
	return nodePortBitmap{ra: ra, base: base, size: size, bits: new(big.Int).SetBytes(ra.Data), modRev: kv.ModRevision}, nil
}

// write puts b's bits back if the range has not changed since it was read;
// ok is whether it had not.
func (e *etcdLoad) writeNodePorts(ctx context.Context, b nodePortBitmap) (ok bool, err error) {
	b.ra.Data, b.ra.ResourceVersion = b.bits.Bytes(), ""
	v, err := storageBytes(b.ra, gvkRange)
	if err != nil {
		return false, err
	}
	return e.kv.txn(ctx, []etcdCmp{{"MOD", []byte(nodePortsKey), b.modRev}},
		[]etcdOp{{Put: &etcdKeyValue{Key: []byte(nodePortsKey), Value: v}}})
}

// nodePorts marks count more NodePorts allocated in the API server's NodePort
// bitmap (one compare-and-swap of the range) and returns them.
func (e *etcdLoad) nodePorts(ctx context.Context, count int) ([]int32, error) {
	if count == 0 {
		return nil, nil
	}
	b, err := e.readNodePorts(ctx)
	if err != nil {
		return nil, err
	}
	var ports []int32
	for off := 0; off < b.size && len(ports) < count; off++ {
		if b.bits.Bit(off) == 0 {
			b.bits.SetBit(b.bits, off, 1)
			ports = append(ports, int32(b.base+off))
		}
	}
	if len(ports) < count {
		return nil, fmt.Errorf("NodePort range %s: %d free, want %d", b.ra.Range, len(ports), count)
	}
	ok, err := e.writeNodePorts(ctx, b)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%s changed while the load allocated NodePorts", nodePortsKey)
	}
	e.ports = append(e.ports, ports...)
	return ports, nil
}

// releaseNodePorts clears ports in the NodePort bitmap.
func (e *etcdLoad) releaseNodePorts(ctx context.Context, ports []int32) error {
	for try := 0; ; try++ {
		b, err := e.readNodePorts(ctx)
		if err != nil {
			return err
		}
		for _, p := range ports {
			b.bits.SetBit(b.bits, int(p)-b.base, 0)
		}
		if ok, err := e.writeNodePorts(ctx, b); err != nil || ok {
			return err
		}
		if try == 5 {
			return fmt.Errorf("%s kept changing", nodePortsKey)
		}
	}
}

// parsePortRange parses a RangeAllocation's "30000-32767".
func parsePortRange(s string) (base, size int, err error) {
	lo, hi, ok := strings.Cut(s, "-")
	a, err1 := strconv.Atoi(lo)
	b, err2 := strconv.Atoi(hi)
	if !ok || err1 != nil || err2 != nil || a < 1 || b < a || b > 65535 {
		return 0, 0, fmt.Errorf("port range %q", s)
	}
	return a, b - a + 1, nil
}

// etcdMaxOps is how many puts or deletes one transaction carries: etcd takes
// at most 128 operations (and as many compares) per transaction by default.
const etcdMaxOps = 120

// etcdWriter runs transactions of at most etcdMaxOps operations on four
// connections at once; wait returns the first error.
type etcdWriter struct {
	kv    *etcdKV
	ch    chan etcdBatch
	wg    sync.WaitGroup
	mu    sync.Mutex
	err   error
	cur   etcdBatch
	built error
}

// etcdBatch is one transaction: the ops if the compares hold (else an error).
type etcdBatch struct {
	cmps []etcdCmp
	ops  []etcdOp
}

func newEtcdWriter(ctx context.Context, kv *etcdKV) *etcdWriter {
	w := &etcdWriter{kv: kv, ch: make(chan etcdBatch)}
	for range 4 {
		w.wg.Go(func() {
			for b := range w.ch {
				ok, err := kv.txn(ctx, b.cmps, b.ops)
				if err == nil && !ok {
					err = fmt.Errorf("etcd: %s was already there", b.cmps[0].key)
				}
				if err != nil {
					w.mu.Lock()
					if w.err == nil {
						w.err = err
					}
					w.mu.Unlock()
				}
			}
		})
	}
	return w
}

// put adds a put of obj at key to the transaction being built; with create,
// only if key is new.
func (w *etcdWriter) put(key string, obj runtime.Object, gvk schema.GroupVersionKind, create bool) {
	if w.built != nil {
		return
	}
	b, err := storageBytes(obj, gvk)
	if err != nil {
		w.built = fmt.Errorf("%s: %w", key, err)
		return
	}
	if create {
		w.cur.cmps = append(w.cur.cmps, etcdCmp{"CREATE", []byte(key), 0})
	}
	w.cur.ops = append(w.cur.ops, etcdOp{Put: &etcdKeyValue{Key: []byte(key), Value: b}})
}

func (w *etcdWriter) delete(key string, end []byte) {
	w.cur.ops = append(w.cur.ops, etcdOp{Delete: &etcdRange{Key: []byte(key), RangeEnd: end}})
}

// cut ends the transaction being built if it has room for fewer than next
// more operations (next 0: whatever it holds).
func (w *etcdWriter) cut(next int) {
	if len(w.cur.ops) > 0 && len(w.cur.ops)+next > etcdMaxOps || next == 0 && len(w.cur.ops) > 0 {
		w.ch <- w.cur
		w.cur = etcdBatch{}
	}
}

func (w *etcdWriter) wait() error {
	w.cut(0)
	close(w.ch)
	w.wg.Wait()
	if w.built != nil {
		return w.built
	}
	return w.err
}

// growEtcd writes Services have…n-1 into etcd, with their IPAddresses and
// slices, while the API server is down: restarted, it lists them as it would
// list a cluster's objects after a restart, and its IPAddress repair loop starts
// once its informers hold them all. (Written under a running API server, a
// burst of tens of thousands of objects makes it close its informers' watches
// as unresponsive; the repair loop then sees Services before their IPAddresses,
// "repairs" them, and deletes IPAddresses whose Services it has not seen 60 s
// after their creation.) kube-controller-manager is stopped (SIGSTOP)
// meanwhile, and once resumed its first pass over tens of thousands of new
// selector-less Services (endpointslice-mirroring lists the namespace's slices
// for each; minutes of both cores at 30k) ends before growEtcd returns, as the
// same work ends during a load through the API server. Last, the API server must
// serve every IPAddress as written: none replaced by the repair loop.
func (l *load) growEtcd(ctx context.Context, n int) error {
	e := l.etcd
	kcm, err := l.cp.PIDs("kube-controller-manager")
	if err != nil {
		return err
	}
	if err := syscall.Kill(kcm[0], syscall.SIGSTOP); err != nil {
		return fmt.Errorf("stopping kube-controller-manager: %w", err)
	}
	stopped := true
	resume := func() error {
		if !stopped {
			return nil
		}
		stopped = false
		if err := syscall.Kill(kcm[0], syscall.SIGCONT); err != nil {
			return fmt.Errorf("resuming kube-controller-manager: %w", err)
		}
		return nil
	}
	defer resume()
	// quiet waits for quiet, up to perK for each thousand Services written
	// (at least 20 s).
	quiet := func(what string, perK time.Duration) {
		ok, busy, took, err := awaitQuiet(max(20*time.Second, perK*time.Duration(n-l.have)/1000))
		switch {
		case err != nil:
			l.t.Logf("load: waiting for quiet after %s: %v", what, err)
		case !ok:
			l.t.Logf("load: still %.2f cores busy %v after %s; going on", busy, took.Round(time.Second), what)
		default:
			l.t.Logf("load: quiet %v after %s", took.Round(100*time.Millisecond), what)
		}
	}

	var nodePortSvcs []int
	for i := l.have; i < n; i++ {
		if l.nodePort(i) {
			nodePortSvcs = append(nodePortSvcs, i)
		}
	}
	ports, err := e.nodePorts(ctx, len(nodePortSvcs))
	if err != nil {
		return err
	}
	portOf := make(map[int]int32, len(ports))
	for k, i := range nodePortSvcs {
		portOf[i] = ports[k]
	}
	var wrote time.Duration
	l.stopEvents() // their watches would end with the API server
	down, err := l.cp.RestartAPIServerWith(ctx, func() error {
		start := time.Now()
		defer func() { wrote = time.Since(start) }()
		return l.writeEtcd(ctx, n, portOf)
	})
	if err != nil {
		return err
	}
	l.t.Logf("load: %d Services, %d IPAddresses and %d EndpointSlices written into etcd in %v; kube-apiserver down %v",
		n-l.have, 2*(n-l.have), 2*(n-l.have), wrote.Round(time.Millisecond), down.Round(time.Millisecond))
	if err := l.watchEvents(); err != nil {
		return err
	}
	if err := l.awaitServed(ctx, n); err != nil {
		return err
	}
	quiet("kube-apiserver's restart", 6*time.Second)
	if err := resume(); err != nil {
		return err
	}
	quiet("kube-controller-manager's resumption", 40*time.Second)
	if err := l.checkServed(ctx, n); err != nil {
		return err
	}
	return l.checkIPAddresses(ctx)
}

// writeEtcd writes Services have…n-1 (NodePorts from portOf), their
// IPAddresses and slices, in the API server's order: IPAddresses first.
func (l *load) writeEtcd(ctx context.Context, n int, portOf map[int]int32) error {
	e := l.etcd
	name := func(i int) string { return fmt.Sprintf("svc-%d", i) }
	w := newEtcdWriter(ctx, e.kv)
	now := metav1.Now()
	for i := l.have; i < n && w.built == nil; i++ {
		for fi := range fams {
			a, err := e.addr(fi)
			if err != nil {
				w.built = err
				break
			}
			l.ips[i][fi] = a
			ip := e.ipAddr[fi].DeepCopy()
			ip.Name, ip.UID, ip.CreationTimestamp, ip.ResourceVersion = a.String(), uuid.NewUUID(), now, ""
			e.uids[ip.Name] = ip.UID
			ip.Spec.ParentRef = &networkingv1.ParentReference{Resource: "services", Namespace: l.ns, Name: name(i)}
			w.cut(1)
			w.put(ipAddrPrefix+ip.Name, ip, gvkIPAddress, true)
		}
	}
	if err := w.wait(); err != nil {
		return err
	}
	w = newEtcdWriter(ctx, e.kv)
	for i := l.have; i < n; i++ {
		typ := corev1.ServiceTypeClusterIP
		if l.nodePort(i) {
			typ = corev1.ServiceTypeNodePort
		}
		s := e.svc[typ].DeepCopy()
		s.Name, s.UID, s.CreationTimestamp, s.ResourceVersion = name(i), uuid.NewUUID(), now, ""
		s.Spec.ClusterIPs = []string{l.ips[i][0].String(), l.ips[i][1].String()}
		s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
		if typ == corev1.ServiceTypeNodePort {
			s.Spec.Ports[0].NodePort = portOf[i]
		}
		w.cut(1 + len(fams))
		w.put(serviceKey(l.ns, s.Name), s, gvkService, true)
		for fi := range fams {
			es := l.workloadSlice(i, fi)
			es.UID, es.CreationTimestamp, es.Generation, es.ManagedFields = uuid.NewUUID(), now, 1, e.sliceFields[fi]
			w.put(sliceKey(l.ns, es.Name), es, gvkSlice, true)
		}
	}
	return w.wait()
}

// checkIPAddresses fails if the API server serves any IPAddress of the load
// other than as written (its repair loop replaced it), or not at all.
func (l *load) checkIPAddresses(ctx context.Context) error {
	list, err := l.client.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	served := make(map[string]types.UID, len(list.Items))
	for _, ip := range list.Items {
		served[ip.Name] = ip.UID
	}
	var bad []string
	for name, uid := range l.etcd.uids {
		if served[name] != uid {
			bad = append(bad, name)
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		return fmt.Errorf("the API server replaced or deleted %d of the load's %d IPAddresses (its repair loop: see its log), e.g. %v", len(bad), len(l.etcd.uids), bad[:min(5, len(bad))])
	}
	return nil
}

// served counts the Services and EndpointSlices the API server lists in the
// load's namespace (a consistent list of one item and the remaining count).
func (l *load) served(ctx context.Context) (svcs, slices int64, err error) {
	one := metav1.ListOptions{Limit: 1}
	sl, err := l.client.CoreV1().Services(l.ns).List(ctx, one)
	if err != nil {
		return 0, 0, err
	}
	el, err := l.client.DiscoveryV1().EndpointSlices(l.ns).List(ctx, one)
	if err != nil {
		return 0, 0, err
	}
	return listed(len(sl.Items), sl.RemainingItemCount), listed(len(el.Items), el.RemainingItemCount), nil
}

// awaitServed waits until the API server lists n load Services (and the probe)
// and their slices: its watch cache has caught up with what etcd was given.
func (l *load) awaitServed(ctx context.Context, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for {
		svcs, nSlices, err := l.served(ctx)
		if err != nil {
			return err
		}
		if svcs >= int64(n+1) && nSlices >= int64(2*n+2) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the API server lists %d Services and %d EndpointSlices in %s, want %d and %d", svcs, nSlices, l.ns, n+1, 2*n+2)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func listed(items int, remaining *int64) int64 {
	if remaining != nil {
		return int64(items) + *remaining
	}
	return int64(items)
}

// checkServed reads the first and the last Service of the grow back through the
// API server, with a slice and an IPAddress: what etcd was given is what the
// API server serves.
func (l *load) checkServed(ctx context.Context, n int) error {
	for _, i := range []int{l.have, n - 1} {
		name := fmt.Sprintf("svc-%d", i)
		s, err := l.client.CoreV1().Services(l.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("the API server on a Service written to etcd: %w", err)
		}
		want := []string{l.ips[i][0].String(), l.ips[i][1].String()}
		if strings.Join(s.Spec.ClusterIPs, ",") != strings.Join(want, ",") {
			return fmt.Errorf("service %s: clusterIPs %v, want %v", name, s.Spec.ClusterIPs, want)
		}
		if got := s.Spec.Type == corev1.ServiceTypeNodePort; got != l.nodePort(i) || got && s.Spec.Ports[0].NodePort == 0 {
			return fmt.Errorf("service %s: type %s, nodePort %d", name, s.Spec.Type, s.Spec.Ports[0].NodePort)
		}
		for fi, f := range fams {
			es, err := l.client.DiscoveryV1().EndpointSlices(l.ns).Get(ctx, sliceName(name, f), metav1.GetOptions{})
			if err != nil {
				return err
			}
			if w := l.workloadSlice(i, fi); len(es.Endpoints) != len(w.Endpoints) || es.Endpoints[0].Addresses[0] != w.Endpoints[0].Addresses[0] {
				return fmt.Errorf("slice %s: %d endpoints from %v, want %d from %v", es.Name, len(es.Endpoints), es.Endpoints[0].Addresses, len(w.Endpoints), w.Endpoints[0].Addresses)
			}
			ip, err := l.client.NetworkingV1().IPAddresses().Get(ctx, want[fi], metav1.GetOptions{})
			if err != nil {
				return err
			}
			if r := ip.Spec.ParentRef; r == nil || r.Namespace != l.ns || r.Name != name {
				return fmt.Errorf("IPAddress %s: parent %+v, want Service %s/%s", ip.Name, r, l.ns, name)
			}
		}
	}
	return nil
}

// cleanEtcd deletes what growEtcd wrote, straight from etcd (through the API
// server, the namespace's deletion would take an hour at 30k Services: each
// release lists the IPAddresses too), while the API server is down, for the
// reason growEtcd writes so: its repair loop would recreate the IPAddresses of
// Services its informers still show.
func (l *load) cleanEtcd(ctx context.Context) error {
	e := l.etcd
	if len(l.ips) == 0 && len(e.ports) == 0 {
		return nil
	}
	if l.stopEvents != nil {
		l.stopEvents()
	}
	_, err := l.cp.RestartAPIServerWith(ctx, func() error {
		svcKeys, sliceKeys := serviceKey(l.ns, "svc-"), sliceKey(l.ns, "svc-")
		w := newEtcdWriter(ctx, e.kv)
		w.delete(svcKeys, prefixEnd(svcKeys))
		w.delete(sliceKeys, prefixEnd(sliceKeys))
		// Every address handed out, written or not (a failed grow stops midway).
		for _, ips := range l.ips {
			for _, a := range ips {
				if a.IsValid() {
					w.cut(1)
					w.delete(ipAddrPrefix+a.String(), nil)
				}
			}
		}
		if err := w.wait(); err != nil {
			return err
		}
		return e.releaseNodePorts(ctx, e.ports)
	})
	if err != nil {
		return err
	}
	// A second call has nothing to do.
	l.ips, l.have, l.prev, e.ports, e.uids = nil, 0, 0, nil, map[string]types.UID{}
	return nil
}
