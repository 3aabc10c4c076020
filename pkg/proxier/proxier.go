package proxier

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/conntrack"
	"github.com/dsproxy/dsproxy/pkg/endpointslice"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/metaproxier"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nodeport"
	"github.com/dsproxy/dsproxy/pkg/runner"
)

// Config assembles a family proxier. Only Family, NodeName and Backend are required.
type Config struct {
	Family   *family.Family
	NodeName string
	Backend  Backend
	// NodePorts is the registry shared by both families; nil means no cross-family
	// reservations (a single-family node).
	NodePorts *nodeport.Registry
	// NodePortSpec and Addrs decide where NodePorts are served; a zero Spec means
	// every local address of the family.
	NodePortSpec nodeport.Spec
	Addrs        nodeport.AddrLister
	// LocalAddrs fills NodeConfig.LocalAddrs (the IPVS mode's), so that a
	// change of the node's addresses is a node change; other backends leave it
	// off: with --nodeport-addresses restricting NodePorts, an unrelated address
	// (a VPN's, an IPv6 temporary one) would redo every rule.
	LocalAddrs bool
	// ObserveIdleSyncs tells the Observer of the periodic check with nothing
	// queued too, as a sync: kube-proxy's IPVS mode syncs every syncPeriod, so
	// its sync metrics (duration, last timestamp) move on an idle node.
	ObserveIdleSyncs bool
	// NodeIP is the node's IP of this family as the address-selection package chose
	// it; SetNodeIP updates it.
	NodeIP        netip.Addr
	Local         LocalDetector
	MasqueradeAll bool
	Runner        runner.Options
	// HealthTimeout is how long a change may wait for a successful sync before the
	// family reports unhealthy (kube-proxy's healthz rule); default 2 minutes.
	HealthTimeout time.Duration
	// Observer, if set, is told about every sync (metrics).
	Observer Observer
	// Conntrack, if set, deletes UDP and SCTP flows that changes made stale.
	Conntrack conntrack.Cleaner
	// NoExternalIPs ignores Services' spec.externalIPs (kube-proxy's
	// --feature-gates=AllowServiceExternalIPs=false).
	NoExternalIPs bool
	// LocalStateChanged, if set, is called on the sync goroutine after a successful
	// sync that may have changed what depends on local endpoints or on the node's
	// NodePort addresses (health check node ports, no-local-endpoint counts): every
	// full sync, and every sync that changed a port using local endpoints or the
	// node's config. It may read st and node until it returns.
	LocalStateChanged func(f *family.Family, st *model.State, node *NodeConfig)
	// LocalStateUnchanged, if set, is called on the sync goroutine after every
	// other successful sync, the periodic check with nothing to do included (the
	// daemon retries the health check node ports that failed to open, as
	// kube-proxy does after every sync).
	LocalStateUnchanged func(f *family.Family)
}

// Observer receives sync events; implementations must be cheap and thread-safe.
type Observer interface {
	SyncDone(f *family.Family, full bool, d time.Duration, res SyncResult, err error)
}

// Proxier is one family's proxier. Event handlers record changes and trigger the
// runner; the sync, run by the runner on one goroutine, turns them into a
// SyncRequest for the backend.
type Proxier struct {
	cfg      Config
	services *model.ServiceTracker
	slices   *endpointslice.Cache
	runner   *runner.Runner

	mu           sync.Mutex // guards the inputs below, written by handlers
	node         *v1.Node
	nodeIP       netip.Addr
	local        LocalDetector
	serviceCIDRs []netip.Prefix
	// triggers holds, per Service, the EndpointSlice trigger times
	// (endpoints.kubernetes.io/last-change-trigger-time) of the changes not yet
	// programmed, one per slice update, as kube-proxy's endpoints tracker keeps them.
	triggers map[types.NamespacedName][]time.Time

	// Owned by the sync goroutine.
	svcMap       model.ServiceMap
	epMap        model.EndpointsMap
	state        *model.State
	lastNode     *NodeConfig
	lastNodeZone string
	// lastCheck is when the kernel was last checked for drift (FlushDetector)
	// or fully synced; driftFound that a check after a partial sync found
	// drift, which makes the next sync a full one.
	lastCheck  time.Time
	driftFound bool
	// unflushed holds, for the ports a failed sync changed, their state before it:
	// the retry finds them unchanged (the state moved on), so the next successful
	// sync clears their stale flows from that state.
	unflushed map[model.ServicePortName]*model.PortState
}

var _ metaproxier.FamilyProxier = (*Proxier)(nil)

// New assembles a Proxier. It starts nothing; Run does.
func New(cfg Config) (*Proxier, error) {
	if cfg.Family == nil || cfg.Backend == nil {
		return nil, fmt.Errorf("proxier: Family and Backend are required")
	}
	if cfg.NodePortSpec.Family == nil {
		cfg.NodePortSpec.Family = cfg.Family
	}
	if cfg.NodePortSpec.Family != cfg.Family {
		return nil, fmt.Errorf("proxier %s: NodePortSpec is for %s", cfg.Family, cfg.NodePortSpec.Family)
	}
	if cfg.Addrs == nil {
		cfg.Addrs = nodeport.SystemAddrs{}
	}
	if cfg.HealthTimeout == 0 {
		cfg.HealthTimeout = 2 * time.Minute
	}
	p := &Proxier{
		cfg:      cfg,
		services: model.NewServiceTracker(cfg.Family),
		slices:   endpointslice.NewCache(cfg.Family),
		nodeIP:   cfg.NodeIP,
		local:    cfg.Local,
		svcMap:   model.ServiceMap{},
		epMap:    model.EndpointsMap{},
		state:    model.NewState(),
	}
	p.services.NoExternalIPs = cfg.NoExternalIPs
	p.runner = runner.New(cfg.Family.Name, p.sync, cfg.Runner)
	// The first sync is requested from the start; for the health check it is
	// queued when Run starts, once the caches have synced (runner
	// Status.LastQueued), as kube-proxy queues its first sync then: a family
	// whose first sync does not end within the health timeout of that reports
	// unhealthy, one whose caches are still syncing does not.
	p.runner.Trigger()
	if cfg.NodePorts != nil {
		cfg.NodePorts.OnChange(func(f *family.Family) {
			if f == cfg.Family {
				p.runner.Trigger()
			}
		})
	}
	return p, nil
}

// Family returns the proxier's family.
func (p *Proxier) Family() *family.Family { return p.cfg.Family }

// Run runs the sync loop until ctx is done.
func (p *Proxier) Run(ctx context.Context) error { return p.runner.Run(ctx) }

// Health reports the sync status.
func (p *Proxier) Health() metaproxier.Health {
	st := p.runner.Status()
	return metaproxier.Health{
		Healthy:             st.Healthy(time.Now(), p.cfg.HealthTimeout),
		LastSync:            st.LastSync,
		Started:             st.Started,
		LastQueued:          st.LastQueued,
		LastError:           st.LastError,
		ConsecutiveFailures: st.ConsecutiveFailures,
		FullSyncPending:     st.FullSyncPending,
	}
}

// State returns the desired state. Only for tests and debugging, and only while no
// sync runs.
func (p *Proxier) State() *model.State { return p.state }

// Sync runs one sync now, outside the runner; for tests and tools.
func (p *Proxier) Sync(ctx context.Context, full bool) error { return p.sync(ctx, full) }

// OnServiceAdd records a new Service.
func (p *Proxier) OnServiceAdd(svc *v1.Service) { p.onService(nil, svc) }

// OnServiceUpdate records a changed Service.
func (p *Proxier) OnServiceUpdate(old, cur *v1.Service) { p.onService(old, cur) }

// OnServiceDelete records a deleted Service.
func (p *Proxier) OnServiceDelete(svc *v1.Service) { p.onService(svc, nil) }

func (p *Proxier) onService(old, cur *v1.Service) {
	o, observed := p.cfg.Observer.(ChangeObserver)
	if observed {
		// kube-proxy counts every event its tracker receives, changed or not.
		o.AddServiceChanges(1)
	}
	if p.services.Update(old, cur) {
		if observed {
			o.SetServiceChangesPending(p.cfg.Family, p.services.Pending())
			o.SyncQueued(p.cfg.Family)
		}
		p.runner.Trigger()
	}
}

// ChangeObserver is the optional part of an Observer that counts changes as they
// are queued (kube-proxy's *_changes_pending, *_changes_total and
// last_queued_timestamp metrics).
type ChangeObserver interface {
	AddServiceChanges(n int)
	AddEndpointChanges(n int)
	SetServiceChangesPending(f *family.Family, n int)
	SetEndpointChangesPending(f *family.Family, n int)
	SyncQueued(f *family.Family)
}

// ConntrackObserver is the optional part of an Observer that times the deletion
// of stale conntrack entries after a sync (kube-proxy's
// conntrack_reconciler_sync_duration_seconds and
// conntrack_reconciler_deleted_entries_total).
type ConntrackObserver interface {
	ConntrackCleared(f *family.Family, d time.Duration, deleted int)
}

// OnEndpointSliceAdd records a new slice of this family.
func (p *Proxier) OnEndpointSliceAdd(o *endpointslice.Object) { p.onSlice(o, false) }

// OnEndpointSliceUpdate records a changed slice.
func (p *Proxier) OnEndpointSliceUpdate(_, cur *endpointslice.Object) { p.onSlice(cur, false) }

// OnEndpointSliceDelete records a deleted slice.
func (p *Proxier) OnEndpointSliceDelete(o *endpointslice.Object) { p.onSlice(o, true) }

func (p *Proxier) onSlice(o *endpointslice.Object, deleted bool) {
	obs, observed := p.cfg.Observer.(ChangeObserver)
	if observed {
		// kube-proxy counts every event its tracker receives, changed or not.
		obs.AddEndpointChanges(1)
	}
	// The trigger time is recorded with the change, under p.mu, under which a
	// sync takes the changes and their times together: a sync finds the time of
	// every change it programs, and none of a change it does not. (Recorded after
	// the change was let go of, a sync in between took the change without its
	// time, which then waited for the Service's next change.)
	changed := false
	p.mu.Lock()
	if deleted {
		changed = p.slices.Delete(o)
	} else {
		changed = p.slices.Update(o)
	}
	if testHookSliceChanged != nil {
		testHookSliceChanged()
	}
	if changed {
		p.recordTriggerLocked(o, deleted)
	}
	p.mu.Unlock()
	if changed {
		if observed {
			obs.SetEndpointChangesPending(p.cfg.Family, p.slices.Pending())
			obs.SyncQueued(p.cfg.Family)
		}
		p.runner.Trigger()
	}
}

// maxTriggers bounds the trigger times kept per Service while its changes wait
// for a sync (a family whose syncs keep failing under churn); later ones are not
// kept.
const maxTriggers = 256

// testHookSliceChanged, when set by a test, runs between a slice change and the
// recording of its trigger time.
var testHookSliceChanged func()

// recordTriggerLocked remembers when the controller saw the change behind o, for
// kubeproxy_network_programming_duration_seconds. As in kube-proxy, a deleted
// slice's annotation is its last update's, not the deletion's, so a deletion
// records nothing and forgets the Service's pending times. p.mu is held.
func (p *Proxier) recordTriggerLocked(o *endpointslice.Object, deleted bool) {
	if o == nil || o.Slice == nil {
		return
	}
	nn := o.Slice.Service
	if deleted {
		delete(p.triggers, nn)
		return
	}
	if o.Trigger.IsZero() {
		return // hand-made slices have no trigger time
	}
	if p.triggers == nil {
		p.triggers = map[types.NamespacedName][]time.Time{}
	}
	if ts := p.triggers[nn]; len(ts) < maxTriggers {
		p.triggers[nn] = append(ts, o.Trigger)
	}
}

// checkout takes the Services whose Service or slices changed since the last
// sync (every one for a full sync) into svcMap and epMap, with the slice
// changes' trigger times: those are taken together, under p.mu, as onSlice
// records them.
func (p *Proxier) checkout(full bool) (map[types.NamespacedName]bool, map[types.NamespacedName][]time.Time) {
	changed := p.services.Checkout(p.svcMap, full)
	p.mu.Lock()
	defer p.mu.Unlock()
	for nn := range p.slices.Checkout(p.epMap, full) {
		changed[nn] = true
	}
	return changed, p.takeTriggersLocked(changed, full)
}

// takeTriggersLocked takes the trigger times of the changed Services (all of
// them for a full sync, which programs everything), to be observed once the sync
// that took the changes succeeds. p.mu is held, since the slice changes were
// taken: a change recorded later (during the sync) keeps its time for the sync
// that programs it, as kube-proxy takes both in one checkout.
func (p *Proxier) takeTriggersLocked(changed map[types.NamespacedName]bool, full bool) map[types.NamespacedName][]time.Time {
	var taken map[types.NamespacedName][]time.Time
	for nn, ts := range p.triggers {
		if full || changed[nn] {
			if taken == nil {
				taken = map[types.NamespacedName][]time.Time{}
			}
			taken[nn] = ts
			delete(p.triggers, nn)
		}
	}
	return taken
}

// returnTriggers gives a failed sync's trigger times back, for the retry.
func (p *Proxier) returnTriggers(taken map[types.NamespacedName][]time.Time) {
	if len(taken) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.triggers == nil {
		p.triggers = map[types.NamespacedName][]time.Time{}
	}
	for nn, ts := range taken {
		if later := p.triggers[nn]; len(ts)+len(later) <= maxTriggers {
			p.triggers[nn] = append(ts, later...)
		} else {
			p.triggers[nn] = ts
		}
	}
}

// observeProgramming reports the trigger times a successful sync took, each
// one, as kube-proxy does.
func (p *Proxier) observeProgramming(taken map[types.NamespacedName][]time.Time) {
	po, ok := p.cfg.Observer.(interface {
		ObserveProgramming(f *family.Family, trigger time.Time)
	})
	if !ok {
		return
	}
	for _, ts := range taken {
		for _, t := range ts {
			po.ObserveProgramming(p.cfg.Family, t)
		}
	}
}

// OnNodeAdd records this node's object; other nodes are ignored.
func (p *Proxier) OnNodeAdd(node *v1.Node) { p.onNode(node) }

// OnNodeUpdate records a change of this node's object.
func (p *Proxier) OnNodeUpdate(_, cur *v1.Node) { p.onNode(cur) }

// OnNodeDelete keeps the last Node object's labels, as kube-proxy does: the
// node's zone still chooses endpoints while its Node is gone (re-registered, or
// the node going away), rather than every Service spreading over all zones.
func (p *Proxier) OnNodeDelete(*v1.Node) {}

// onNode records this node's object and syncs when what a sync reads of it
// (model.NodeInfoFrom: the zone label) changed. Updates of anything else (the
// kubelet's status reports, annotations) sync nothing, as kube-proxy syncs on a
// Node update only when its labels changed; a sync with nothing to do would
// still run the periodic drift check, which costs 0.4 s for iptables at 10k
// Services. The node's IPs and PodCIDRs reach the proxier through SetNodeIP and
// SetLocalDetector.
func (p *Proxier) onNode(node *v1.Node) {
	if node == nil || node.Name != p.cfg.NodeName {
		return
	}
	p.mu.Lock()
	changed := p.node == nil || model.NodeInfoFrom(p.cfg.NodeName, p.node) != model.NodeInfoFrom(p.cfg.NodeName, node)
	p.node = node
	p.mu.Unlock()
	if changed {
		p.runner.Trigger()
	}
}

// SetNodeIP records a new node IP of this family (the daemon follows Node changes
// through the address-selection package and calls this).
func (p *Proxier) SetNodeIP(ip netip.Addr) {
	p.mu.Lock()
	changed := p.nodeIP != ip
	p.nodeIP = ip
	p.mu.Unlock()
	if changed {
		p.runner.Trigger()
	}
}

// SetLocalDetector records a new local-traffic detection (the daemon follows the
// Node's PodCIDRs with --detect-local-mode=NodeCIDR and calls this); a change
// reprograms the node-wide rules.
func (p *Proxier) SetLocalDetector(d LocalDetector) {
	p.mu.Lock()
	changed := !d.Equal(p.local)
	p.local = d
	p.mu.Unlock()
	if changed {
		p.runner.Trigger()
	}
}

// OnServiceCIDRsChanged records this family's service CIDRs.
func (p *Proxier) OnServiceCIDRsChanged(cidrs []netip.Prefix) {
	p.mu.Lock()
	p.serviceCIDRs = slices.Clone(cidrs)
	p.mu.Unlock()
	p.runner.Trigger()
}

// sync turns the recorded changes into one backend sync. Node-wide inputs that
// change the endpoint choice (the node's zone) make it a full sync.
func (p *Proxier) sync(ctx context.Context, full bool) error {
	start := time.Now()
	nodeInfo, nodeCfg, err := p.nodeInputs()
	if err != nil {
		return err
	}
	// The endpoint choice depends on the node's zone: a new zone redoes everything.
	full = full || p.lastNode == nil || p.lastNodeZone != nodeInfo.Zone || p.driftFound
	changed, triggers := p.checkout(full)
	if o, ok := p.cfg.Observer.(ChangeObserver); ok {
		o.SetServiceChangesPending(p.cfg.Family, 0)
		o.SetEndpointChangesPending(p.cfg.Family, 0)
	}
	req := &SyncRequest{
		Full:        full,
		State:       p.state,
		Changed:     p.state.Update(p.svcMap, p.epMap, nodeInfo, changed, full),
		Node:        nodeCfg,
		NodeChanged: !nodeCfg.Equal(p.lastNode),
	}
	idle := !req.Full && !req.NodeChanged && len(req.Changed) == 0
	// The periodic check of what someone else changed in the kernel: at every
	// sync with nothing to do (where drift makes it a full sync), and once per
	// check period after a partial sync (where drift makes the next sync a full
	// one), so that a node whose changes keep coming (every sync partial, none
	// idle) is checked as often as an idle one, as kube-proxy polls its
	// iptables canaries whatever it syncs. After, not before: the change that
	// came is programmed without waiting for the check (at 10k Services
	// iptables' costs 0.4 s).
	checkAfter := !idle && p.checkDue(start, req.Full)
	if idle {
		p.lastCheck = start
		d, ok := p.cfg.Backend.(FlushDetector)
		flushed := ok && d.Flushed(ctx)
		if !flushed {
			if (len(changed) > 0 || p.cfg.ObserveIdleSyncs) && p.cfg.Observer != nil {
				// Queued changes that program nothing (the slices of a deleted
				// Service going) still end in a sync, as in kube-proxy: its
				// timestamp must pass the queued one. The periodic check, with
				// nothing queued, is no sync but in the IPVS mode's metrics.
				p.cfg.Observer.SyncDone(p.cfg.Family, false, time.Since(start), SyncResult{}, nil)
			}
			p.observeProgramming(triggers)
			if p.cfg.LocalStateUnchanged != nil {
				p.cfg.LocalStateUnchanged(p.cfg.Family)
			}
			return nil
		}
		if flushed {
			klog.InfoS("Rules were flushed by someone else; resyncing everything", "ipFamily", p.cfg.Family.Name)
			full, req.Full = true, true
		}
	}
	res, err := p.cfg.Backend.Sync(ctx, req)
	if err != nil {
		if p.cfg.Observer != nil {
			p.cfg.Observer.SyncDone(p.cfg.Family, full, time.Since(start), res, err)
		}
		p.keepUnflushed(req.Changed)
		p.returnTriggers(triggers)
		return fmt.Errorf("%s sync (full=%v, %d changed service ports): %w", p.cfg.Family, full, len(req.Changed), err)
	}
	p.lastNode = nodeCfg
	p.lastNodeZone = nodeInfo.Zone
	if full {
		p.lastCheck = start // a full sync compares or rewrites everything
		p.driftFound = false
	}
	// As kube-proxy: the changes are programmed once the rules are in the
	// kernel, before stale flows go; the sync's duration covers it all, the
	// flows and the health check servers' update included.
	p.observeProgramming(triggers)
	p.clearStaleFlows(req.Changed)
	if p.cfg.LocalStateChanged != nil && (full || req.NodeChanged || p.localChanged(req.Changed)) {
		p.cfg.LocalStateChanged(p.cfg.Family, p.state, nodeCfg)
	} else if p.cfg.LocalStateUnchanged != nil {
		p.cfg.LocalStateUnchanged(p.cfg.Family)
	}
	if p.cfg.Observer != nil {
		p.cfg.Observer.SyncDone(p.cfg.Family, full, time.Since(start), res, nil)
	}
	klog.V(2).InfoS("Synced", "ipFamily", p.cfg.Family.Name, "full", full, "changedPorts", len(req.Changed),
		"operations", res.Operations, "repairs", res.Repairs, "elapsed", time.Since(start))
	if checkAfter {
		p.lastCheck = start
		if d, ok := p.cfg.Backend.(FlushDetector); ok && d.Flushed(ctx) {
			klog.InfoS("Rules were flushed by someone else; resyncing everything", "ipFamily", p.cfg.Family.Name)
			p.driftFound = true
			p.runner.Trigger()
		}
	}
	return nil
}

// checkDue reports whether a partial sync starting at now also checks the
// kernel for drift: the check period (runner.Options.CheckPeriod) has passed
// since the last check or full sync.
func (p *Proxier) checkDue(now time.Time, full bool) bool {
	period := p.cfg.Runner.CheckPeriod
	return !full && period > 0 && !p.lastCheck.IsZero() && now.Sub(p.lastCheck) >= period
}

// nodeInputs snapshots the node-wide inputs recorded by the handlers.
func (p *Proxier) nodeInputs() (model.NodeInfo, *NodeConfig, error) {
	p.mu.Lock()
	node, nodeIP, cidrs, local := p.node, p.nodeIP, p.serviceCIDRs, p.local
	p.mu.Unlock()
	ifAddrs, err := p.cfg.Addrs.InterfaceAddrs()
	if err != nil {
		return model.NodeInfo{}, nil, fmt.Errorf("%s: listing local addresses for NodePorts: %w", p.cfg.Family, err)
	}
	addrs, err := p.cfg.NodePortSpec.Resolve(nodeport.AddrListerFunc(func() ([]netip.Addr, error) { return ifAddrs, nil }), nodeIP)
	if err != nil {
		return model.NodeInfo{}, nil, fmt.Errorf("%s: resolving --nodeport-addresses: %w", p.cfg.Family, err)
	}
	cfg := &NodeConfig{
		Family:            p.cfg.Family,
		NodeIP:            nodeIP,
		NodePortAddresses: addrs,
		ServiceCIDRs:      cidrs,
		Local:             local,
		MasqueradeAll:     p.cfg.MasqueradeAll,
	}
	if p.cfg.LocalAddrs {
		cfg.LocalAddrs = localAddrs(p.cfg.Family, ifAddrs)
	}
	if p.cfg.NodePorts != nil {
		cfg.ReservedNodePorts = p.cfg.NodePorts.ReservedFor(p.cfg.Family).Keys
	}
	return model.NodeInfoFrom(p.cfg.NodeName, node), cfg, nil
}

// localAddrs are the addresses of f in local, sorted, unique, link-local ones
// aside (see NodeConfig.LocalAddrs).
func localAddrs(f *family.Family, local []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range local {
		if a = a.Unmap().WithZone(""); f.Contains(a) && !a.IsLinkLocalUnicast() {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// localChanged reports whether a changed port, before or after, depends on local
// endpoints.
func (p *Proxier) localChanged(changed []model.ServicePortName) bool {
	for _, name := range changed {
		for _, ps := range []*model.PortState{p.state.Previous[name], p.state.Ports[name]} {
			if ps != nil && (ps.HealthCheckNodePort != 0 || ps.UsesLocalEndpoints()) {
				return true
			}
		}
	}
	return false
}
