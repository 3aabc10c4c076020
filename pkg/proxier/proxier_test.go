package proxier

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/endpointslice"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nodeport"
	"github.com/dsproxy/dsproxy/pkg/runner"
)

// recordingBackend records what each sync asked for; the orchestration is what is
// under test here, the backends have their own kernel models.
type recordingBackend struct {
	reqs []SyncRequest
	fail error
}

func (b *recordingBackend) Sync(_ context.Context, req *SyncRequest) (SyncResult, error) {
	r := *req
	r.Changed = append(r.Changed[:0:0], req.Changed...)
	b.reqs = append(b.reqs, r)
	if b.fail != nil {
		return SyncResult{}, b.fail
	}
	return SyncResult{Operations: len(req.Changed)}, nil
}

func (b *recordingBackend) Cleanup(context.Context) error { return nil }

func (b *recordingBackend) last(t *testing.T) SyncRequest {
	t.Helper()
	if len(b.reqs) == 0 {
		t.Fatal("backend was never called")
	}
	return b.reqs[len(b.reqs)-1]
}

// ingest is what the informer hands the proxier for es, on the test proxier's node.
func ingest(es *discovery.EndpointSlice) *endpointslice.Object {
	return endpointslice.Ingest(es, "node-a")
}

func newTestProxier(t *testing.T, f *family.Family, reg *nodeport.Registry) (*Proxier, *recordingBackend) {
	t.Helper()
	b := &recordingBackend{}
	addrs := nodeport.AddrListerFunc(func() ([]netip.Addr, error) {
		return []netip.Addr{testaddr.Node(f, 1), testaddr.Node(f.Other(), 1)}, nil
	})
	p, err := New(Config{Family: f, NodeName: "node-a", Backend: b, NodePorts: reg, Addrs: addrs, NodeIP: testaddr.Node(f, 1)})
	if err != nil {
		t.Fatal(err)
	}
	return p, b
}

func service(f *family.Family, name string, families ...*family.Family) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, CreationTimestamp: metav1.Unix(1, 0)},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeNodePort,
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, NodePort: 30080}}},
	}
	for _, g := range families {
		s.Spec.ClusterIPs = append(s.Spec.ClusterIPs, testaddr.Svc(g, 10).String())
		s.Spec.IPFamilies = append(s.Spec.IPFamilies, g.IPFamily)
	}
	s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
	return s
}

func endpointSlice(f *family.Family, svc string, pods ...int) *discovery.EndpointSlice {
	es := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: svc + "-" + f.Name, Labels: map[string]string{discovery.LabelServiceName: svc}},
		AddressType: f.AddressType,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for _, n := range pods {
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{testaddr.Pod(f, n).String()}})
	}
	return es
}

func TestSyncRequests(t *testing.T) {
	ctx := context.Background()
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			p, b := newTestProxier(t, f, nil)
			// The first sync is full even with nothing to do.
			if err := p.Sync(ctx, false); err != nil {
				t.Fatal(err)
			}
			if r := b.last(t); !r.Full || !r.NodeChanged || r.Node.NodeIP != testaddr.Node(f, 1) {
				t.Fatalf("first sync: %+v", r)
			}
			if got := r0(b).Node.NodePortAddresses; !got.MatchAll || len(got.Addrs) != 1 || got.Addrs[0] != testaddr.Node(f, 1) {
				t.Fatalf("nodeport addresses %+v", got)
			}
			p.OnServiceAdd(service(f, "web", f))
			p.OnEndpointSliceAdd(ingest(endpointSlice(f, "web", 1, 2)))
			n := len(b.reqs)
			if err := p.Sync(ctx, false); err != nil {
				t.Fatal(err)
			}
			r := b.last(t)
			if len(b.reqs) != n+1 || r.Full || r.NodeChanged || len(r.Changed) != 1 {
				t.Fatalf("partial sync: %+v", r)
			}
			if eps := r.State.Ports[r.Changed[0]].InternalEndpoints(); len(eps) != 2 {
				t.Fatalf("endpoints %v", eps)
			}
			// Nothing changed: no backend call.
			if err := p.Sync(ctx, false); err != nil || len(b.reqs) != n+1 {
				t.Fatalf("idle sync called the backend (%v)", err)
			}
			// A node zone change redoes everything; an unrelated node is ignored.
			p.OnNodeAdd(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "other", Labels: map[string]string{v1.LabelTopologyZone: "z9"}}})
			p.OnNodeAdd(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: "z1"}}})
			if err := p.Sync(ctx, false); err != nil || !b.last(t).Full {
				t.Fatalf("zone change did not force a full sync (%v)", err)
			}
			// Service CIDRs are node-wide: a change is a node change, not a full sync.
			p.OnServiceCIDRsChanged([]netip.Prefix{testaddr.Prefix(testaddr.Svc(f, 0), 16)})
			if err := p.Sync(ctx, false); err != nil || b.last(t).Full || !b.last(t).NodeChanged {
				t.Fatalf("service CIDR change: %+v (%v)", b.last(t), err)
			}
			// A backend error is returned with the family and the cause.
			b.fail = errors.New("boom")
			p.OnServiceDelete(service(f, "web", f))
			err := p.Sync(ctx, false)
			if err == nil || !errors.Is(err, b.fail) {
				t.Fatalf("error %v does not wrap the cause", err)
			}
		})
	}
}

func r0(b *recordingBackend) SyncRequest { return b.reqs[0] }

func TestReservedNodePortsFollowTheOtherFamily(t *testing.T) {
	ctx := context.Background()
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			reg := nodeport.New(klog.Background())
			p, b := newTestProxier(t, f, reg)
			if err := p.Sync(ctx, false); err != nil {
				t.Fatal(err)
			}
			// A single-stack Service of the other family claims NodePort 30080.
			other := service(f.Other(), "other", f.Other())
			reg.Update(other)
			p.OnServiceAdd(other)
			if err := p.Sync(ctx, false); err != nil {
				t.Fatal(err)
			}
			r := b.last(t)
			want := nodeport.Key{Protocol: v1.ProtocolTCP, Port: 30080}
			if !r.NodeChanged || len(r.Node.ReservedNodePorts) != 1 || r.Node.ReservedNodePorts[0] != want || len(r.Changed) != 0 {
				t.Fatalf("reservation not passed on: %+v", r)
			}
			reg.Delete(other)
			p.OnServiceDelete(other)
			if err := p.Sync(ctx, false); err != nil || len(b.last(t).Node.ReservedNodePorts) != 0 {
				t.Fatalf("reservation not released: %+v (%v)", b.last(t).Node, err)
			}
		})
	}
}

type programmingObserver struct {
	got   []time.Time
	syncs int // successful SyncDone calls
}

func (o *programmingObserver) SyncDone(_ *family.Family, _ bool, _ time.Duration, _ SyncResult, err error) {
	if err == nil {
		o.syncs++
	}
}
func (o *programmingObserver) ObserveProgramming(_ *family.Family, t time.Time) {
	o.got = append(o.got, t)
}

func TestNetworkProgrammingTriggerTimes(t *testing.T) {
	f := family.IPv6
	p, _ := newTestProxier(t, f, nil)
	obs := &programmingObserver{}
	p.cfg.Observer = obs
	p.OnServiceAdd(service(f, "web", f))
	es := endpointSlice(f, "web", 1)
	trigger := time.Date(2026, 11, 22, 1, 2, 3, 0, time.UTC)
	es.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: trigger.Format(time.RFC3339Nano)}
	p.OnEndpointSliceAdd(ingest(es))
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if len(obs.got) != 1 || !obs.got[0].Equal(trigger) {
		t.Fatalf("observed %v, want [%v]", obs.got, trigger)
	}
	if err := p.Sync(context.Background(), false); err != nil || len(obs.got) != 1 {
		t.Fatalf("a trigger time was observed twice: %v (%v)", obs.got, err)
	}

	// Every update's time is observed, as kube-proxy observes each.
	obs.got = nil
	var want []time.Time
	for i := 2; i <= 4; i++ {
		upd := endpointSlice(f, "web", i)
		ti := trigger.Add(time.Duration(i) * time.Second)
		upd.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: ti.Format(time.RFC3339Nano)}
		p.OnEndpointSliceUpdate(nil, ingest(upd))
		want = append(want, ti)
	}
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(obs.got, time.Time.Compare)
	if !slices.EqualFunc(obs.got, want, time.Time.Equal) {
		t.Fatalf("three updates in one sync observed %v, want %v", obs.got, want)
	}

	// A deletion's annotation is the slice's last update, possibly hours old: it is
	// not observed, and it drops the Service's times still pending.
	obs.got = nil
	upd := endpointSlice(f, "web", 1)
	upd.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: trigger.Add(time.Minute).Format(time.RFC3339Nano)}
	p.OnEndpointSliceUpdate(nil, ingest(upd))
	p.OnEndpointSliceDelete(ingest(upd))
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if len(obs.got) != 0 {
		t.Fatalf("an update then the slice's deletion observed %v, want nothing", obs.got)
	}
}

// A sync of queued changes that program nothing (the slices of a deleted Service
// going) is a sync for the metrics, so last_timestamp passes last_queued; the
// periodic check with nothing queued is not.
func TestNoOpSyncIsObserved(t *testing.T) {
	f := family.IPv4
	p, _ := newTestProxier(t, f, nil)
	obs := &changeCounter{}
	p.cfg.Observer = obs
	ctx := context.Background()
	svc, es := service(f, "web", f), ingest(endpointSlice(f, "web", 1))
	p.OnServiceAdd(svc)
	p.OnEndpointSliceAdd(es)
	if err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	p.OnServiceDelete(svc)
	if err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	before := obs.syncs
	p.OnEndpointSliceDelete(es)
	if obs.queued != 4 {
		t.Fatalf("queued %d times, want 4", obs.queued)
	}
	if err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if obs.syncs != before+1 {
		t.Fatalf("the sync of a deleted Service's slice: %d syncs observed, want 1", obs.syncs-before)
	}
	if err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if obs.syncs != before+1 {
		t.Fatalf("a sync with nothing queued was observed")
	}
	// In the IPVS mode's metrics it is one, as kube-proxy's IPVS mode syncs
	// every syncPeriod.
	p.cfg.ObserveIdleSyncs = true
	if err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if obs.syncs != before+2 {
		t.Fatalf("IPVS mode: the periodic check with nothing queued was not observed as a sync")
	}
}

// The daemon's metrics implement ChangeObserver; this checks the proxier feeds it.
func TestChangeObserver(t *testing.T) {
	f := family.IPv4
	p, _ := newTestProxier(t, f, nil)
	obs := &changeCounter{}
	p.cfg.Observer = obs
	p.OnServiceAdd(service(f, "web", f))
	p.OnServiceAdd(service(f, "web", f)) // still pending: counted, as kube-proxy counts every event
	p.OnEndpointSliceAdd(ingest(endpointSlice(f, "web", 1)))
	if obs.svc != 2 || obs.eps != 1 || obs.queued != 3 || obs.pendingSvc != 1 || obs.pendingEps != 1 {
		t.Fatalf("before sync: %+v", obs)
	}
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if obs.pendingSvc != 0 || obs.pendingEps != 0 {
		t.Fatalf("after sync: %+v", obs)
	}
	// Events that change nothing are counted too, but queue nothing.
	svc := service(f, "web", f)
	p.OnServiceUpdate(svc, svc)
	es := ingest(endpointSlice(f, "web", 1))
	p.OnEndpointSliceUpdate(es, es)
	if obs.svc != 3 || obs.eps != 2 || obs.queued != 3 {
		t.Fatalf("unchanging updates: %+v, want 3 Service and 2 slice events counted, 3 queued", obs)
	}
}

type changeCounter struct {
	programmingObserver
	svc, eps, queued, pendingSvc, pendingEps int
}

func (c *changeCounter) AddServiceChanges(n int)                           { c.svc += n }
func (c *changeCounter) AddEndpointChanges(n int)                          { c.eps += n }
func (c *changeCounter) SetServiceChangesPending(_ *family.Family, n int)  { c.pendingSvc = n }
func (c *changeCounter) SetEndpointChangesPending(_ *family.Family, n int) { c.pendingEps = n }
func (c *changeCounter) SyncQueued(*family.Family)                         { c.queued++ }

// The local-state hooks: a sync that may change what depends on local endpoints
// calls LocalStateChanged; every other successful sync, the periodic check with
// nothing queued included, calls LocalStateUnchanged (the daemon's retry of health
// check node ports that failed to open).
func TestLocalStateHooks(t *testing.T) {
	f := family.IPv4
	p, _ := newTestProxier(t, f, nil)
	var calls []string
	p.cfg.LocalStateChanged = func(*family.Family, *model.State, *NodeConfig) { calls = append(calls, "changed") }
	p.cfg.LocalStateUnchanged = func(*family.Family) { calls = append(calls, "unchanged") }
	ctx := context.Background()
	step := func(what, want string, change func()) {
		t.Helper()
		calls = nil
		if change != nil {
			change()
		}
		if err := p.Sync(ctx, false); err != nil {
			t.Fatal(err)
		}
		if len(calls) != 1 || calls[0] != want {
			t.Errorf("%s: hooks %v, want [%s]", what, calls, want)
		}
	}
	step("first (full) sync", "changed", nil)
	step("a Service of cluster policy", "unchanged", func() { p.OnServiceAdd(service(f, "web", f)) })
	step("nothing queued", "unchanged", nil)
	step("a Service with a health check node port", "changed", func() {
		svc := service(f, "local", f)
		svc.Spec.Type = v1.ServiceTypeLoadBalancer
		svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		svc.Spec.HealthCheckNodePort = 31000
		svc.Spec.Ports[0].NodePort = 30081
		p.OnServiceAdd(svc)
	})
}

// A new local-traffic detection reaches the backend as a node change; the same
// one again syncs nothing.
func TestSetLocalDetector(t *testing.T) {
	f := family.IPv6
	p, b := newTestProxier(t, f, nil)
	ctx := context.Background()
	if err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	d := LocalDetector{Mode: LocalModeNodeCIDR, CIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:10:244:1::/64")}}
	p.SetLocalDetector(d)
	if err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if r := b.last(t); !r.NodeChanged || !r.Node.Local.Equal(d) {
		t.Fatalf("detector not passed on: NodeChanged %v, Local %+v", r.NodeChanged, r.Node.Local)
	}
	n := len(b.reqs)
	p.SetLocalDetector(LocalDetector{Mode: LocalModeNodeCIDR, CIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:10:244:1::/64")}})
	if err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if len(b.reqs) != n {
		t.Fatalf("the same detector again made a backend sync: %+v", b.last(t))
	}
}

// blockingBackend's syncs wait until release is closed.
type blockingBackend struct{ release chan struct{} }

func (b *blockingBackend) Sync(ctx context.Context, _ *SyncRequest) (SyncResult, error) {
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return SyncResult{}, ctx.Err()
}

func (b *blockingBackend) Cleanup(context.Context) error { return nil }

// Health before the first sync, as kube-proxy's: healthy while the caches sync
// (before Run), however long, and even with changes already received; from
// Run's start the first sync is queued, and a first sync that takes longer than
// the health timeout is unhealthy until it ends. The family reads as updated
// when its loop started.
func TestFirstSyncQueuedWhenRunStarts(t *testing.T) {
	f := family.IPv4
	b := &blockingBackend{release: make(chan struct{})}
	p, err := New(Config{Family: f, NodeName: "node-a", Backend: b, HealthTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p.OnServiceAdd(service(f, "web", f))
	time.Sleep(60 * time.Millisecond)
	if h := p.Health(); !h.Healthy || !h.LastQueued.IsZero() || !h.Started.IsZero() {
		t.Fatalf("before Run, past the health timeout: %+v, want healthy, nothing queued", h)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	go func() { _ = p.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for p.Health().Started.IsZero() {
		if time.Now().After(deadline) {
			t.Fatal("Run did not start")
		}
		time.Sleep(time.Millisecond)
	}
	if h := p.Health(); h.LastQueued.Before(start) || h.Started.Before(start) {
		t.Fatalf("Run started at %v: %+v, want the first sync queued then", start, h)
	}
	time.Sleep(60 * time.Millisecond)
	if h := p.Health(); h.Healthy {
		t.Fatalf("the first sync has run past the health timeout: %+v, want unhealthy", h)
	}
	close(b.release)
	for !p.Health().Healthy {
		if time.Now().After(deadline) {
			t.Fatalf("still unhealthy after the first sync: %+v", p.Health())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Deleting the Node keeps its zone for the endpoint choice, as in kube-proxy.
func TestNodeDeleteKeepsZone(t *testing.T) {
	f := family.IPv4
	p, b := newTestProxier(t, f, nil)
	ctx := context.Background()
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: "zone-a"}}}
	p.OnNodeAdd(node)
	p.OnServiceAdd(service(f, "web", f))
	es := endpointSlice(f, "web", 1, 2)
	es.Endpoints[0].Hints = &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "zone-a"}}}
	es.Endpoints[1].Hints = &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "zone-b"}}}
	p.OnEndpointSliceAdd(ingest(es))
	if err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	name := b.last(t).Changed[0]
	if n := len(p.State().Ports[name].Cluster); n != 1 {
		t.Fatalf("zone hints not honoured: %d cluster endpoints", n)
	}
	p.OnNodeDelete(node)
	if err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if n := len(p.State().Ports[name].Cluster); n != 1 {
		t.Fatalf("after the Node's deletion: %d cluster endpoints, want the zone's 1", n)
	}
}

// The node config follows the node's addresses: a new global address is a node
// change (NodePorts on it; in IPVS mode, Service addresses that are the node's
// are not bound), a link-local one (each pod's host-side veth has its own) is not;
// without Config.LocalAddrs (nftables, iptables) and with NodePorts restricted, an
// unrelated address is not either.
func TestNodeAddressChanges(t *testing.T) {
	ctx := context.Background()
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			b := &recordingBackend{}
			local := []netip.Addr{testaddr.Node(f, 1), f.Loopback.Addr(), testaddr.Node(f.Other(), 1)}
			addrs := nodeport.AddrListerFunc(func() ([]netip.Addr, error) { return slices.Clone(local), nil })
			p, err := New(Config{Family: f, NodeName: "node-a", Backend: b, Addrs: addrs, LocalAddrs: true, NodeIP: testaddr.Node(f, 1)})
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Sync(ctx, false); err != nil {
				t.Fatal(err)
			}
			if got, want := b.last(t).Node.LocalAddrs, []netip.Addr{f.Loopback.Addr(), testaddr.Node(f, 1)}; !slices.Equal(got, want) {
				t.Fatalf("LocalAddrs %v, want %v", got, want)
			}
			linkLocal := netip.MustParseAddr("169.254.7.7")
			if f.BitLen == 128 {
				linkLocal = netip.MustParseAddr("fe80::7")
			}
			local = append(local, linkLocal)
			p.OnServiceAdd(service(f, "web", f))
			if err := p.Sync(ctx, false); err != nil {
				t.Fatal(err)
			}
			if r := b.last(t); r.NodeChanged || r.Full {
				t.Errorf("a link-local address came: node changed %v, full %v", r.NodeChanged, r.Full)
			}
			local = append(local, testaddr.Node(f, 2))
			p.OnServiceDelete(service(f, "web", f))
			if err := p.Sync(ctx, false); err != nil {
				t.Fatal(err)
			}
			if r := b.last(t); !r.NodeChanged || !slices.Contains(r.Node.LocalAddrs, testaddr.Node(f, 2)) ||
				!slices.Contains(r.Node.NodePortAddresses.Addrs, testaddr.Node(f, 2)) {
				t.Errorf("a global address came: node changed %v, %+v", r.NodeChanged, r.Node)
			}
		})
	}
}

func TestNodeAddressChangesRestricted(t *testing.T) {
	ctx := context.Background()
	f := family.IPv4
	b := &recordingBackend{}
	local := []netip.Addr{testaddr.Node(f, 1)}
	addrs := nodeport.AddrListerFunc(func() ([]netip.Addr, error) { return slices.Clone(local), nil })
	spec, err := nodeport.ParseAddresses([]string{"primary"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{Family: f, NodeName: "node-a", Backend: b, Addrs: addrs, NodePortSpec: spec[f], NodeIP: testaddr.Node(f, 1)})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	local = append(local, netip.MustParseAddr("198.18.0.1"))
	p.OnServiceAdd(service(f, "web", f))
	if err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if r := b.last(t); r.NodeChanged || r.Node.LocalAddrs != nil {
		t.Errorf("an address outside the NodePort addresses came: node changed %v, LocalAddrs %v", r.NodeChanged, r.Node.LocalAddrs)
	}
}

// A sync that runs while a slice change is being recorded still observes the
// change's trigger time: the change and its time are recorded under one lock,
// under which the sync takes the changes and their times. Before, the time was
// recorded after the change was let go of: a sync in between took the change
// without it, and the time waited for the Service's next change, then was
// observed with that change's delay.
func TestTriggerTimeOfAChangeTakenMidway(t *testing.T) {
	f := family.IPv4
	p, _ := newTestProxier(t, f, nil)
	obs := &programmingObserver{}
	p.cfg.Observer = obs
	ctx := context.Background()
	p.OnServiceAdd(service(f, "web", f))
	if err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	es := endpointSlice(f, "web", 1)
	trigger := time.Date(2026, 11, 29, 1, 2, 3, 0, time.UTC)
	es.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: trigger.Format(time.RFC3339Nano)}
	synced := make(chan error, 1)
	t.Cleanup(func() { testHookSliceChanged = nil })
	testHookSliceChanged = func() {
		testHookSliceChanged = nil
		go func() { synced <- p.Sync(ctx, false) }()
		time.Sleep(100 * time.Millisecond) // the sync runs now, as far as it can
	}
	p.OnEndpointSliceAdd(ingest(es))
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if len(obs.got) != 1 || !obs.got[0].Equal(trigger) {
		t.Fatalf("the sync that programmed the change observed %v, want [%v]", obs.got, trigger)
	}
}

// orderObserver records the order of a sync's observations and its duration.
type orderObserver struct {
	events    []string
	durations []time.Duration
}

func (o *orderObserver) SyncDone(_ *family.Family, _ bool, d time.Duration, _ SyncResult, err error) {
	if err == nil {
		o.events = append(o.events, "sync")
		o.durations = append(o.durations, d)
	}
}
func (o *orderObserver) ObserveProgramming(*family.Family, time.Time) {
	o.events = append(o.events, "programmed")
}

// As kube-proxy's: a change is programmed once the rules are in the kernel, and
// the sync's duration covers what follows them too (stale flows, the health
// check servers' update): before, it ended with the rules, and the programming
// latency included the conntrack cleanup.
func TestSyncObservationsOrder(t *testing.T) {
	f := family.IPv4
	p, _ := newTestProxier(t, f, nil)
	obs := &orderObserver{}
	p.cfg.Observer = obs
	p.cfg.LocalStateChanged = func(*family.Family, *model.State, *NodeConfig) {
		obs.events = append(obs.events, "local state")
		time.Sleep(30 * time.Millisecond)
	}
	p.OnServiceAdd(service(f, "web", f))
	es := endpointSlice(f, "web", 1)
	es.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().Format(time.RFC3339Nano)}
	p.OnEndpointSliceAdd(ingest(es))
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if want := []string{"programmed", "local state", "sync"}; !slices.Equal(obs.events, want) {
		t.Errorf("observations %v, want %v", obs.events, want)
	}
	if len(obs.durations) != 1 || obs.durations[0] < 30*time.Millisecond {
		t.Errorf("sync durations %v: want one covering the 30 ms after the rules", obs.durations)
	}
}

// duringBackend runs during once, inside its first Sync.
type duringBackend struct {
	recordingBackend
	during func()
}

func (b *duringBackend) Sync(ctx context.Context, req *SyncRequest) (SyncResult, error) {
	if b.during != nil {
		d := b.during
		b.during = nil
		d()
	}
	return b.recordingBackend.Sync(ctx, req)
}

// A slice change recorded while a sync programs earlier ones keeps its trigger
// time for the sync that programs it: the changes and their times are taken
// together. Before, the running sync observed the new time too (before its
// change was in the kernel) and the next one observed nothing.
func TestTriggerTimeOfAChangeDuringASync(t *testing.T) {
	f := family.IPv4
	p, _ := newTestProxier(t, f, nil)
	b := &duringBackend{}
	p.cfg.Backend = b
	obs := &programmingObserver{}
	p.cfg.Observer = obs
	ctx := context.Background()
	p.OnServiceAdd(service(f, "web", f))
	t1 := time.Date(2026, 11, 29, 1, 0, 0, 0, time.UTC)
	t2 := t1.Add(time.Minute)
	slice := func(pod int, at time.Time) *endpointslice.Object {
		es := endpointSlice(f, "web", pod)
		es.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: at.Format(time.RFC3339Nano)}
		return ingest(es)
	}
	p.OnEndpointSliceAdd(slice(1, t1))
	b.during = func() { p.OnEndpointSliceUpdate(nil, slice(2, t2)) }
	if err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if len(obs.got) != 1 || !obs.got[0].Equal(t1) {
		t.Fatalf("the first sync observed %v, want [%v] (the change made during it is not programmed yet)", obs.got, t1)
	}
	if err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if len(obs.got) != 2 || !obs.got[1].Equal(t2) {
		t.Fatalf("the second sync: observed %v, want [%v %v]", obs.got, t1, t2)
	}

	// A failed sync gives its times back for the retry.
	obs.got = nil
	b.fail = errors.New("boom")
	t3 := t2.Add(time.Minute)
	p.OnEndpointSliceUpdate(nil, slice(3, t3))
	if err := p.Sync(ctx, false); err == nil {
		t.Fatal("the failing backend's sync succeeded")
	}
	b.fail = nil
	if err := p.Sync(ctx, true); err != nil {
		t.Fatal(err)
	}
	if len(obs.got) != 1 || !obs.got[0].Equal(t3) {
		t.Fatalf("after a failed sync, the retry observed %v, want [%v]", obs.got, t3)
	}
}

// checkingBackend counts the periodic drift checks and reports a flush when told.
type checkingBackend struct {
	recordingBackend
	checks  int
	flushed bool
	synced  []int // the backend syncs done at each check
}

func (b *checkingBackend) Flushed(context.Context) bool {
	b.checks++
	b.synced = append(b.synced, len(b.reqs))
	return b.flushed
}

// The drift check runs at every idle sync (a flush it finds makes that sync
// full) and, while changes keep coming (no sync idle), after the first partial
// sync once the check period has passed since the last check or full sync (a
// flush it finds makes the next sync full).
func TestDriftCheckUnderChurn(t *testing.T) {
	ctx := context.Background()
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			b := &checkingBackend{}
			addrs := nodeport.AddrListerFunc(func() ([]netip.Addr, error) { return []netip.Addr{testaddr.Node(f, 1)}, nil })
			p, err := New(Config{Family: f, NodeName: "node-a", Backend: b, Addrs: addrs, NodeIP: testaddr.Node(f, 1),
				Runner: runner.Options{CheckPeriod: time.Minute}})
			if err != nil {
				t.Fatal(err)
			}
			p.OnServiceAdd(service(f, "web", f))
			pods := []int{1}
			change := func() SyncRequest {
				t.Helper()
				pods = append(pods, len(pods)+1)
				p.OnEndpointSliceUpdate(nil, ingest(endpointSlice(f, "web", pods...)))
				if err := p.Sync(ctx, false); err != nil {
					t.Fatal(err)
				}
				return b.last(t)
			}
			if err := p.Sync(ctx, false); err != nil || !b.last(t).Full || b.checks != 0 {
				t.Fatalf("first sync: full %v, %d checks (%v)", b.last(t).Full, b.checks, err)
			}
			if r := change(); r.Full || b.checks != 0 {
				t.Fatalf("a change right after the full sync: full %v, %d checks", r.Full, b.checks)
			}
			p.lastCheck = time.Now().Add(-2 * time.Minute) // a while of changes only
			if r := change(); r.Full || len(r.Changed) != 1 || b.checks != 1 {
				t.Fatalf("a change once the check was due: full %v, changed %v, %d checks; want a check", r.Full, r.Changed, b.checks)
			}
			if b.synced[0] != len(b.reqs) {
				t.Fatalf("the due check ran before the change was programmed (%d of %d backend syncs done)", b.synced[0], len(b.reqs))
			}
			if r := change(); r.Full || b.checks != 1 {
				t.Fatalf("a change right after a check: full %v, %d checks", r.Full, b.checks)
			}
			p.lastCheck = time.Now().Add(-2 * time.Minute)
			b.flushed = true
			// The check runs after the change is programmed: the change's sync
			// stays partial, the next one is full.
			if r := change(); r.Full || len(r.Changed) != 1 || b.checks != 2 {
				t.Fatalf("a flush found at a due check: full %v, changed %v, %d checks; want a partial sync, then the check", r.Full, r.Changed, b.checks)
			}
			b.flushed = false
			if r := change(); !r.Full || b.checks != 2 {
				t.Fatalf("the sync after a flush was found: full %v, %d checks; want a full sync", r.Full, b.checks)
			}
			if r := change(); r.Full {
				t.Fatal("the sync after that full one: full, want partial")
			}
			n := len(b.reqs)
			if err := p.Sync(ctx, false); err != nil || b.checks != 3 || len(b.reqs) != n {
				t.Fatalf("an idle sync: %d checks, %d backend syncs (%v); want a check and no sync", b.checks, len(b.reqs)-n, err)
			}
		})
	}
}

// countingBackend counts syncs and drift checks; safe for a running proxier.
type countingBackend struct {
	mu            sync.Mutex
	syncs, checks int
	lastFull      bool
}

func (b *countingBackend) Sync(_ context.Context, req *SyncRequest) (SyncResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.syncs++
	b.lastFull = req.Full
	return SyncResult{}, nil
}

func (b *countingBackend) Cleanup(context.Context) error { return nil }

func (b *countingBackend) Flushed(context.Context) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.checks++
	return false
}

func (b *countingBackend) counts() (syncs, checks int, full bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.syncs, b.checks, b.lastFull
}

// A Node update that changes nothing a sync reads of the Node (status,
// annotations, other labels) syncs nothing, not even a sync with nothing to
// do (which would run the drift check); a new zone label syncs everything.
func TestNodeUpdateSyncsOnlyOnZoneChange(t *testing.T) {
	f := family.IPv4
	b := &countingBackend{}
	p, err := New(Config{Family: f, NodeName: "node-a", Backend: b, NodeIP: testaddr.Node(f, 1),
		Addrs: nodeport.AddrListerFunc(func() ([]netip.Addr, error) { return []netip.Addr{testaddr.Node(f, 1)}, nil })})
	if err != nil {
		t.Fatal(err)
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: "z1"}}}
	p.OnNodeAdd(node)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = p.Run(ctx) }()
	wait := func(what string, ok func(syncs, checks int, full bool) bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			s, c, full := b.counts()
			if ok(s, c, full) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d syncs, %d checks", what, s, c)
			}
		}
	}
	wait("the first sync", func(s, _ int, _ bool) bool { return s == 1 })
	for i := range 3 {
		n := node.DeepCopy()
		n.Annotations = map[string]string{"heartbeat": fmt.Sprint(i)}
		n.Labels["other"] = fmt.Sprint(i)
		n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}
		p.OnNodeUpdate(node, n)
		node = n
	}
	time.Sleep(100 * time.Millisecond)
	if s, c, _ := b.counts(); s != 1 || c != 0 {
		t.Fatalf("after Node updates that change no zone: %d syncs, %d checks; want the first sync only", s, c)
	}
	n := node.DeepCopy()
	n.Labels[v1.LabelTopologyZone] = "z2"
	p.OnNodeUpdate(node, n)
	wait("a new zone", func(s, _ int, full bool) bool { return s == 2 && full })
}
