//go:build netns

package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/dsproxy/dsproxy/pkg/endpointslice"
	"github.com/dsproxy/dsproxy/pkg/family"
	ipt "github.com/dsproxy/dsproxy/pkg/iptables"
	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/nodeport"
	"github.com/dsproxy/dsproxy/pkg/proxier"
	"github.com/dsproxy/dsproxy/pkg/proxier/iptables"
	"github.com/dsproxy/dsproxy/pkg/proxier/nftables"
	"github.com/dsproxy/dsproxy/test/netns"
)

// timedKernel is an nft.Kernel decorator that records how long each Apply takes:
// the kernel transaction alone (netlink encoding, send, commit, acks), without the
// model and diff work of the sync around it.
type timedKernel struct {
	nft.Kernel
	mu  sync.Mutex
	txs []txTime
}

// txTime is one transaction's duration; structural says it did more than add and
// delete elements (sets, chains, tables).
type txTime struct {
	d          time.Duration
	structural bool
}

func (k *timedKernel) Apply(ctx context.Context, tx *nft.Tx) error {
	start := time.Now()
	err := k.Kernel.Apply(ctx, tx)
	d := time.Since(start)
	structural := false
	for _, op := range tx.Ops {
		structural = structural || (op.Kind != nft.OpAddElements && op.Kind != nft.OpDeleteElements)
	}
	k.mu.Lock()
	k.txs = append(k.txs, txTime{d: d, structural: structural})
	k.mu.Unlock()
	return err
}

// take returns the transactions recorded since the last take.
func (k *timedKernel) take() []txTime {
	k.mu.Lock()
	defer k.mu.Unlock()
	t := k.txs
	k.txs = nil
	return t
}

func durations(ts []txTime) []time.Duration {
	ds := make([]time.Duration, len(ts))
	for i, t := range ts {
		ds[i] = t.d
	}
	return ds
}

// benchNodeName is the node the proxiers run as; workload endpoints are spread over
// node-0 … node-9.
const benchNodeName = "node-0"

// probePods is how many server pods back the probe Service of the latency test.
const probePods = 10

// familyProxier is one family's proxier over its own Netlink, as the daemon builds
// it (pkg/app.Daemon.newProxier).
type familyProxier struct {
	f *family.Family
	p *proxier.Proxier
	k *timedKernel // nil for the iptables backend, which commits with iptables-restore
	// ib is the iptables backend (nil for nftables).
	ib *iptables.Backend
}

// node is the proxy node under test: two family proxiers programming the Node
// namespace of a netns.Cluster, fed from one workload.
type node struct {
	c     *netns.Cluster
	reg   *nodeport.Registry
	fams  []*familyProxier
	w     Workload
	o     kernelObjects
	probe int // index of the Service whose endpoints are the probe pods
}

// kernelObjects is a workload's API objects. The cold start ingests each slice,
// as the informers' transform does, and then keeps only the ingested one.
type kernelObjects struct {
	svcs   []*v1.Service
	slices map[*family.Family][]*discovery.EndpointSlice
	objs   map[*family.Family][]*endpointslice.Object
}

// nodePortEvery keeps the NodePort Services of an n-Service workload within the
// default NodePort range (30000-32767): every 4th Service up to 10k, fewer beyond
// (2500 NodePorts at most).
func nodePortEvery(n int) int {
	return max(4, (n+2499)/2500)
}

// clusterIPService is Service i forced to type ClusterIP.
func (w Workload) clusterIPService(i int) *v1.Service {
	s := w.Service(i)
	s.Spec.Type = v1.ServiceTypeClusterIP
	s.Spec.Ports[0].NodePort = 0
	return s
}

func generateKernel(w Workload, probe int, pods []*netns.NS) kernelObjects {
	o := kernelObjects{slices: map[*family.Family][]*discovery.EndpointSlice{}, objs: map[*family.Family][]*endpointslice.Object{}}
	for i := range w.Services {
		o.svcs = append(o.svcs, w.Service(i))
		for _, f := range family.All {
			es := w.Slice(f, i, w.EndpointCount(i))
			if i == probe {
				// The probe Service is served by the probe pods.
				es = w.Slice(f, i, len(pods))
				for j, p := range pods {
					es.Endpoints[j].Addresses = []string{p.IP(f).String()}
				}
			}
			o.slices[f] = append(o.slices[f], es)
			o.objs[f] = append(o.objs[f], nil)
		}
	}
	return o
}

// fixedAddrs lists the node's addresses without looking at the host.
type fixedAddrs []netip.Addr

func (a fixedAddrs) InterfaceAddrs() ([]netip.Addr, error) { return a, nil }

// serviceCIDR is the family's service range of the workload (ServiceIP).
func serviceCIDR(f *family.Family) netip.Prefix {
	if f == family.IPv4 {
		return netip.MustParsePrefix("10.96.0.0/12")
	}
	return netip.PrefixFrom(ServiceIP(f, 0), 104)
}

func familyIndex(f *family.Family) int {
	if f == family.IPv4 {
		return 0
	}
	return 1
}

// newNode builds the proxiers for the cluster's Node namespace: one Netlink per
// family (as the daemon), a shared NodePort registry, NodeCIDR local detection.
func newNode(tb interface {
	Helper()
	Fatal(...any)
	Cleanup(func())
}, c *netns.Cluster, w Workload, probe int, pods []*netns.NS) *node {
	tb.Helper()
	return newNodeMode(tb, c, w, probe, pods, "nftables")
}

// newNodeMode is newNode with the backend of mode: "nftables", "iptables" (the
// node's default iptables binaries) or "iptables-legacy".
func newNodeMode(tb interface {
	Helper()
	Fatal(...any)
	Cleanup(func())
}, c *netns.Cluster, w Workload, probe int, pods []*netns.NS, mode string) *node {
	tb.Helper()
	n := &node{c: c, reg: nodeport.New(logr.Discard()), w: w, probe: probe}
	for _, f := range family.All {
		fp := &familyProxier{f: f}
		var backend proxier.Backend
		if mode == "iptables" || mode == "iptables-legacy" {
			flavor := ipt.FlavorDefault
			if mode == "iptables-legacy" {
				flavor = ipt.FlavorLegacy
			}
			r, err := ipt.New(f, flavor)
			if err != nil {
				tb.Fatal(err)
			}
			if fp.ib, err = iptables.New(f, r, iptables.Options{MasqueradeBit: 14}); err != nil {
				tb.Fatal(err)
			}
			backend = proxier.Within(fp.ib, func(fn func() error) error { return netns.RunIn(c.Node, fn) })
		} else {
			nl, err := nft.NewNetlink(nft.WithNetNSFd(int(c.Node.Handle())))
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() { _ = nl.Close() })
			fp.k = &timedKernel{Kernel: nl}
			var opts nftables.Options
			if v := os.Getenv("DSPROXY_BENCH_TX_ELEMENTS"); v != "" {
				if opts.MaxElementsPerTx, err = strconv.Atoi(v); err != nil {
					tb.Fatal(fmt.Sprintf("DSPROXY_BENCH_TX_ELEMENTS=%q: %v", v, err))
				}
			}
			backend = nftables.New(f, fp.k, opts)
		}
		p, err := proxier.New(proxier.Config{
			Family:    f,
			NodeName:  benchNodeName,
			Backend:   backend,
			NodePorts: n.reg,
			Addrs:     fixedAddrs{netns.NodeIPv4, netns.NodeIPv6},
			NodeIP:    c.Node.IP(f),
			Local:     proxier.LocalDetector{Mode: proxier.LocalModeNodeCIDR, CIDRs: []netip.Prefix{netns.LocalPodCIDRs[familyIndex(f)]}},
		})
		if err != nil {
			tb.Fatal(err)
		}
		p.OnServiceCIDRsChanged([]netip.Prefix{serviceCIDR(f)})
		fp.p = p
		n.fams = append(n.fams, fp)
	}
	n.o = generateKernel(w, probe, pods)
	return n
}

// coldStart is what one cold start measured.
type coldStart struct {
	feed     time.Duration // handlers: registry and both proxiers, all objects
	total    time.Duration // feed + both syncs (parallel) done
	sync     map[*family.Family]time.Duration
	done     map[*family.Family]time.Duration // from the start of the feed
	kernel   map[*family.Family][]time.Duration
	peakHeap uint64        // Go heap objects, sampled every 5 ms
	peakRSS  uint64        // VmHWM (reset before the start)
	liveHeap uint64        // heap after GC once programmed
	cpu      time.Duration // this process's user+system CPU during the cold start
	otherCPU time.Duration // CPU the rest of the machine used meanwhile (/proc/stat)
}

// coldStart feeds every object to the proxiers through their handlers (as the
// informers would, one goroutine), then runs both families' first full sync in
// parallel, one goroutine each (as metaproxier.Run does).
func (n *node) coldStart(ctx context.Context) (coldStart, error) {
	cs := coldStart{sync: map[*family.Family]time.Duration{}, done: map[*family.Family]time.Duration{},
		kernel: map[*family.Family][]time.Duration{}}
	runtime.GC()
	resetPeakRSS()
	mp := startMemPeak()
	cpu0, busy0 := processCPU(), machineBusy()
	start := time.Now()
	for i, s := range n.o.svcs {
		n.reg.Update(s)
		for _, fp := range n.fams {
			fp.p.OnServiceAdd(s)
		}
		for _, fp := range n.fams {
			obj := endpointslice.Ingest(n.o.slices[fp.f][i], benchNodeName)
			n.o.objs[fp.f][i], n.o.slices[fp.f][i] = obj, nil
			fp.p.OnEndpointSliceAdd(obj)
		}
	}
	cs.feed = time.Since(start)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, fp := range n.fams {
		wg.Go(func() {
			s := time.Now()
			err := fp.p.Sync(ctx, true)
			end := time.Now()
			mu.Lock()
			defer mu.Unlock()
			cs.sync[fp.f], cs.done[fp.f] = end.Sub(s), end.Sub(start)
			errs = append(errs, err)
		})
	}
	wg.Wait()
	cs.total = time.Since(start)
	cs.cpu = processCPU() - cpu0
	cs.otherCPU = max(machineBusy()-busy0-cs.cpu, 0)
	cs.peakHeap = mp.stop()
	cs.peakRSS = peakRSS()
	for _, fp := range n.fams {
		if fp.k != nil {
			cs.kernel[fp.f] = durations(fp.k.take())
		}
	}
	runtime.GC()
	cs.liveHeap = heapObjects()
	if f := os.Getenv("DSPROXY_BENCH_HEAPPROFILE"); f != "" {
		if err := writeHeapProfile(f); err != nil {
			errs = append(errs, err)
		}
	}
	return cs, errors.Join(errs...)
}

// syncOne runs one partial sync of family fp and returns its wall time and the
// transactions it committed.
func syncOne(ctx context.Context, fp *familyProxier) (time.Duration, []txTime, error) {
	if fp.k == nil { // iptables: one restore per sync, timed as the sync
		start := time.Now()
		err := fp.p.Sync(ctx, false)
		d := time.Since(start)
		return d, []txTime{{d: d}}, err
	}
	fp.k.take()
	start := time.Now()
	err := fp.p.Sync(ctx, false)
	d := time.Since(start)
	return d, fp.k.take(), err
}

// churn is what a series of partial syncs measured, per family.
type churn struct {
	kernel     map[*family.Family][]time.Duration // every transaction
	structural map[*family.Family][]time.Duration // those that also changed sets or chains
	sync       map[*family.Family][]time.Duration // every proxier Sync (model + diff + kernel)
}

func newChurn() churn {
	return churn{kernel: map[*family.Family][]time.Duration{}, structural: map[*family.Family][]time.Duration{},
		sync: map[*family.Family][]time.Duration{}}
}

// record syncs every family after a change; each must commit exactly one
// transaction.
func (n *node) record(ctx context.Context, ch churn, what string) error {
	for _, fp := range n.fams {
		d, txs, err := syncOne(ctx, fp)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if len(txs) != 1 {
			return fmt.Errorf("%s %s: %d transactions, want 1", fp.f, what, len(txs))
		}
		ch.kernel[fp.f] = append(ch.kernel[fp.f], txs[0].d)
		if txs[0].structural {
			ch.structural[fp.f] = append(ch.structural[fp.f], txs[0].d)
		}
		ch.sync[fp.f] = append(ch.sync[fp.f], d)
	}
	return nil
}

// endpointChurn adds an 11th endpoint to a random Service and removes it again,
// changes/2 times (both families each time: a dual-stack pod comes and goes). All
// are measured, including the few structural ones: an endpoint count no group
// has yet (not even as a spare) creates its group chains (clusterip-lb-svc-N,
// nodeport-lb-np-N) and their verdict map elements.
func (n *node) endpointChurn(ctx context.Context, changes int, rnd func(int) int) (churn, error) {
	ch := newChurn()
	for range (changes + 1) / 2 {
		i := rnd(n.w.Services)
		if i == n.probe {
			i = (i + 1) % n.w.Services
		}
		for _, step := range []int{n.w.EndpointsPerFamily + 1, n.w.EndpointsPerFamily} {
			for _, fp := range n.fams {
				old := n.o.objs[fp.f][i]
				fp.p.OnEndpointSliceUpdate(old, endpointslice.Ingest(n.w.Slice(fp.f, i, step), benchNodeName))
			}
			what := fmt.Sprintf("service %d to %d endpoints", i, step)
			if err := n.record(ctx, ch, what); err != nil {
				return ch, err
			}
		}
	}
	return ch, nil
}

// serviceChurn adds a new ClusterIP Service with its endpoints and deletes it
// again, pairs times; kernel transactions of adds and deletes are kept apart.
func (n *node) serviceChurn(ctx context.Context, pairs int) (add, del churn, err error) {
	add, del = newChurn(), newChurn()
	for k := range pairs {
		i := n.w.Services + k
		s := n.w.clusterIPService(i)
		n.reg.Update(s)
		for _, fp := range n.fams {
			fp.p.OnServiceAdd(s)
			fp.p.OnEndpointSliceAdd(endpointslice.Ingest(n.w.Slice(fp.f, i, n.w.EndpointsPerFamily), benchNodeName))
		}
		if err := n.record(ctx, add, fmt.Sprintf("add service %d", i)); err != nil {
			return add, del, err
		}
		n.reg.Delete(s)
		for _, fp := range n.fams {
			fp.p.OnServiceDelete(s)
			fp.p.OnEndpointSliceDelete(endpointslice.Ingest(n.w.Slice(fp.f, i, n.w.EndpointsPerFamily), benchNodeName))
		}
		if err := n.record(ctx, del, fmt.Sprintf("delete service %d", i)); err != nil {
			return add, del, err
		}
	}
	return add, del, nil
}

// fullSyncs runs k periodic full syncs of each family, one family after the other,
// and returns their wall times. Nothing changed since the last sync, so each must
// commit nothing beyond repairs, and there must be none.
func (n *node) fullSyncs(ctx context.Context, k int) (map[*family.Family][]time.Duration, error) {
	out := map[*family.Family][]time.Duration{}
	for range k {
		for _, fp := range n.fams {
			if fp.k == nil { // iptables rewrites everything on a full sync
				start := time.Now()
				err := fp.p.Sync(ctx, true)
				out[fp.f] = append(out[fp.f], time.Since(start))
				if err != nil {
					return out, fmt.Errorf("%s: %w", fp.f, err)
				}
				continue
			}
			fp.k.take()
			start := time.Now()
			err := fp.p.Sync(ctx, true)
			out[fp.f] = append(out[fp.f], time.Since(start))
			if err != nil {
				return out, fmt.Errorf("%s: %w", fp.f, err)
			}
			if txs := fp.k.take(); len(txs) != 0 {
				return out, fmt.Errorf("%s: a full sync of an unchanged, undisturbed ruleset committed %d transactions", fp.f, len(txs))
			}
		}
	}
	return out, nil
}

// cleanup removes the proxiers' tables.
func (n *node) cleanup(ctx context.Context) error {
	var errs []error
	for _, fp := range n.fams {
		if fp.ib != nil {
			errs = append(errs, netns.RunIn(n.c.Node, func() error { return fp.ib.Cleanup(ctx) }))
			continue
		}
		fp.k.take()
		errs = append(errs, nftables.New(fp.f, fp.k.Kernel, nftables.Options{}).Cleanup(ctx))
	}
	return errors.Join(errs...)
}

// memPeak samples the Go heap until stopped.
type memPeak struct {
	stopc chan struct{}
	done  chan uint64
}

func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func startMemPeak() *memPeak {
	m := &memPeak{stopc: make(chan struct{}), done: make(chan uint64, 1)}
	go func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		var peak uint64
		for {
			peak = max(peak, heapObjects())
			select {
			case <-m.stopc:
				m.done <- peak
				return
			case <-t.C:
			}
		}
	}()
	return m
}

func (m *memPeak) stop() uint64 {
	close(m.stopc)
	return max(<-m.done, heapObjects())
}

// machineBusy returns the non-idle CPU time of all CPUs so far (/proc/stat, in
// USER_HZ = 10 ms ticks).
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	var busy uint64
	for i, v := range f[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseUint(v, 10, 64)
		busy += n
	}
	return time.Duration(busy) * 10 * time.Millisecond
}

// resetPeakRSS resets the process's VmHWM (Linux ≥ 4.0).
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// peakRSS returns VmHWM in bytes (0 if unreadable).
func peakRSS() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// percentile returns the nearest-rank p-th percentile (0 < p ≤ 100).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func sum(ds []time.Duration) time.Duration {
	var t time.Duration
	for _, d := range ds {
		t += d
	}
	return t
}

// writeHeapProfile writes the heap profile (as of the last GC) to file, for
// DSPROXY_BENCH_HEAPPROFILE: where a cold start's live memory sits.
func writeHeapProfile(file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
