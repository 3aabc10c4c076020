package ipvs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/family"
	ipt "github.com/dsproxy/dsproxy/pkg/iptables"
	"github.com/dsproxy/dsproxy/pkg/ipvs"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// Kernel is the IPVS, dummy-link and ipset side of the kernel (*ipvs.Kernel).
type Kernel interface {
	Services() ([]ipvs.Service, error)
	AddService(ipvs.Service) error
	UpdateService(ipvs.Service) error
	DelService(ipvs.Key) error
	Dests(ipvs.Key) ([]ipvs.Dest, error)
	AddDest(ipvs.Key, ipvs.Dest) error
	UpdateDest(ipvs.Key, ipvs.Dest) error
	DelDest(ipvs.Key, ipvs.Dest) error
	EnsureLink() (bool, error)
	Addrs() ([]netip.Addr, error)
	AddAddr(netip.Addr) error
	DelAddr(netip.Addr) error
	DeleteLinkIfEmpty() error
	EnsureSet(name, typ string) error
	DestroySet(name string) error
	Entries(name string) ([]ipvs.Entry, bool, error)
	AddEntry(set string, e ipvs.Entry) error
	DelEntry(set string, e ipvs.Entry) error
}

var _ Kernel = (*ipvs.Kernel)(nil)

// Runner runs the family's iptables (*iptables.Runner).
type Runner interface {
	Restore(ctx context.Context, data []byte) error
	Save(ctx context.Context, table string) (string, error)
	EnsureRule(table, chain string, rule ...string) (bool, error)
	ChainExists(table, chain string) (bool, error)
	HasRandomFully() bool
}

// Options are the IPVS-mode settings (kube-proxy's ipvs section).
type Options struct {
	// Scheduler is the IPVS scheduler ("rr" when empty).
	Scheduler string
	// ExcludeCIDRs are addresses whose virtual servers dsproxy never deletes
	// (kube-proxy's --ipvs-exclude-cidrs); every other virtual server of the
	// family is dsproxy's, as it is kube-proxy's.
	ExcludeCIDRs []netip.Prefix
	// MasqueradeBit is the packet mark bit that asks for SNAT (default 14 when 0
	// is not meant: the caller passes kube-proxy's value).
	MasqueradeBit int
	// StrictARP sets arp_ignore=1 and arp_announce=2 so the node does not answer
	// ARP for the addresses on the dummy link (kube-proxy's --ipvs-strict-arp).
	StrictARP bool
	// TCPBeLiberal says the node sets net.netfilter.nf_conntrack_tcp_be_liberal:
	// then the forward rules do not drop packets conntrack marks invalid.
	TCPBeLiberal bool
	// Sysctl writes a sysctl ("net/ipv4/vs/conntrack", "1"); ipvs.SetSysctl when nil.
	Sysctl func(name, value string) error
	// IPSetLoaded says whether Cleanup may ask for ipsets; ipvs.IPSetLoaded
	// when nil.
	IPSetLoaded func() bool
}

// Backend implements proxier.Backend with IPVS for one family: a virtual server
// per Service address and port (ClusterIP, ExternalIPs, LoadBalancer VIPs, and
// NodePorts on each NodePort address), the Service addresses bound to a dummy
// link so the node accepts them, and a fixed set of iptables rules over ipsets
// for what IPVS does not do: masquerading, source ranges, rejecting.
type Backend struct {
	f    *family.Family
	k    Kernel
	r    Runner
	opts Options

	written map[model.ServicePortName]*objs // zero name: the node's members
	// vsOwners holds, per virtual server, what each service port that renders it
	// wants; two Services may share an address and port (ExternalIPs), and the
	// lowest port name wins, as in the nftables backend, whichever was written or
	// removed last.
	vsOwners map[ipvs.Key]map[model.ServicePortName]*virtual
	members  map[member]int
	addrs    map[netip.Addr]int
	// have is what the backend believes the kernel holds; exact while synced.
	have     map[ipvs.Key]*virtual
	draining map[ipvs.Key]map[ipvs.Dest]bool
	node     *proxier.NodeConfig
	synced   bool
	// rules are the family's iptables rules of dsproxy as iptables-save read them
	// after the last setup (ourRules); nil when that read failed. rulesDrift: the
	// periodic check found them changed, a repair for the next setup to count.
	rules      []string
	rulesDrift bool
	// destCursor is the last virtual server whose real servers the periodic
	// check read (driftedDests).
	destCursor ipvs.Key
}

// destChecks bounds the virtual servers whose real servers one periodic check
// reads (one netlink dump each); a var for tests. In the qemu guest (TCG
// emulation) a dump took 0.75 ms, 1000 of them 25 times one dump of 1000
// virtual servers; natively a dump is tens of µs, so 500 cost about 10-20 ms
// per check, and 10k virtual servers are all read within 20 checks (10 min at
// the default syncPeriod).
var destChecks = 500

var _ proxier.FlushDetector = (*Backend)(nil)

// New returns the IPVS backend for f.
func New(f *family.Family, k Kernel, r Runner, opts Options) *Backend {
	if opts.Scheduler == "" {
		opts.Scheduler = "rr"
	}
	if opts.Sysctl == nil {
		opts.Sysctl = ipvs.SetSysctl
	}
	if opts.IPSetLoaded == nil {
		opts.IPSetLoaded = ipvs.IPSetLoaded
	}
	b := &Backend{f: f, k: k, r: r, opts: opts}
	b.reset()
	return b
}

func (b *Backend) reset() {
	b.written, b.vsOwners = map[model.ServicePortName]*objs{}, map[ipvs.Key]map[model.ServicePortName]*virtual{}
	b.members, b.addrs, b.have = map[member]int{}, map[netip.Addr]int{}, map[ipvs.Key]*virtual{}
	b.draining = map[ipvs.Key]map[ipvs.Dest]bool{}
	b.synced = false
	b.rules = nil
}

// account adds (n = 1) or removes (n = -1) the contributions o of the service
// port name, noting the virtual servers whose wanted state may have changed, and
// for members and addresses whether they were wanted before the first change
// (apply acts on those whose presence changed).
func (b *Backend) account(name model.ServicePortName, o *objs, n int, vs map[ipvs.Key]bool, ms map[member]bool, as map[netip.Addr]bool) {
	if o == nil {
		return
	}
	for i := range o.vs {
		v := &o.vs[i]
		k := v.svc.Key
		owners := b.vsOwners[k]
		if n > 0 {
			if owners == nil {
				owners = make(map[model.ServicePortName]*virtual, 1)
				b.vsOwners[k] = owners
			}
			owners[name] = v
		} else if delete(owners, name); len(owners) == 0 {
			delete(b.vsOwners, k)
		}
		vs[k] = true
	}
	for _, m := range o.members {
		if _, seen := ms[m]; !seen {
			ms[m] = b.members[m] > 0
		}
		b.members[m] += n
		if b.members[m] <= 0 {
			delete(b.members, m)
		}
	}
	for _, a := range o.addrs {
		if _, seen := as[a]; !seen {
			as[a] = b.addrs[a] > 0
		}
		b.addrs[a] += n
		if b.addrs[a] <= 0 {
			delete(b.addrs, a)
		}
	}
}

// Sync implements proxier.Backend.
func (b *Backend) Sync(ctx context.Context, req *proxier.SyncRequest) (proxier.SyncResult, error) {
	var res proxier.SyncResult
	full := req.Full || !b.synced || (req.NodeChanged && !b.onlyReservedChanged(req.Node))
	if full {
		err := b.fullSync(ctx, req, &res)
		if err != nil {
			b.synced = false
		}
		return res, err
	}
	vs, ms, as := map[ipvs.Key]bool{}, map[member]bool{}, map[netip.Addr]bool{}
	changed := req.Changed
	if req.NodeChanged {
		changed = append(slices.Clip(changed), model.ServicePortName{})
		b.node = req.Node
	}
	for _, name := range changed {
		b.account(name, b.written[name], -1, vs, ms, as)
		o := b.renderName(req, name)
		b.account(name, o, 1, vs, ms, as)
		if o == nil {
			delete(b.written, name)
		} else {
			b.written[name] = o
		}
	}
	err := b.apply(&res, vs, ms, as)
	b.pruneDrained(&res, vs)
	if err != nil {
		b.synced = false
	}
	return res, err
}

func (b *Backend) renderName(req *proxier.SyncRequest, name model.ServicePortName) *objs {
	if name == (model.ServicePortName{}) {
		return renderNode(req.Node)
	}
	if ps := req.State.Ports[name]; ps != nil {
		return render(ps, req.Node, b.opts.Scheduler)
	}
	return nil
}

// onlyReservedChanged reports whether node differs from the last synced one in
// the other family's reserved NodePorts only: those are members of their own.
func (b *Backend) onlyReservedChanged(node *proxier.NodeConfig) bool {
	if b.node == nil || node == nil {
		return false
	}
	c := *node
	c.ReservedNodePorts = b.node.ReservedNodePorts
	return c.Equal(b.node)
}

// apply makes the kernel match the wanted state for the given virtual servers,
// and for the members and addresses whose presence (the map's value: present in
// the kernel, as far as the backend knows) differs from the wanted one, in an
// order that keeps traffic flowing: addresses and members come before the
// virtual servers that need them and go after. An address joins setIPs only
// after its ports' members: the INPUT rules refuse new connections to a member
// of setIPs at a port no set lets through, and the virtual servers a full sync
// adopts (kube-proxy's, on its own link) serve them meanwhile.
func (b *Backend) apply(res *proxier.SyncResult, vs map[ipvs.Key]bool, ms map[member]bool, as map[netip.Addr]bool) error {
	var errs []error
	op := func(err error) {
		res.Operations++
		if err != nil {
			errs = append(errs, err)
		}
	}
	ipsSet := setName(b.f, setIPs)
	added := slices.DeleteFunc(sortedAddrs(as), func(a netip.Addr) bool { return b.addrs[a] == 0 || as[a] })
	for _, a := range added {
		op(b.k.AddAddr(a))
	}
	for m, present := range ms {
		if b.members[m] > 0 && !present {
			op(b.k.AddEntry(setName(b.f, m.set), m.e))
		}
	}
	for _, a := range added {
		op(b.k.AddEntry(ipsSet, ipvs.Entry{IP: a}))
	}
	for k := range vs {
		errs = append(errs, b.syncVirtual(res, k))
	}
	for m, present := range ms {
		if b.members[m] == 0 && present {
			op(b.k.DelEntry(setName(b.f, m.set), m.e))
		}
	}
	for _, a := range sortedAddrs(as) {
		if b.addrs[a] == 0 && as[a] {
			op(b.k.DelEntry(ipsSet, ipvs.Entry{IP: a}))
			op(b.k.DelAddr(a))
		}
	}
	return errors.Join(errs...)
}

// exists reports an EEXIST from the kernel: the object was there already.
func exists(err error) bool {
	return errors.Is(err, unix.EEXIST) || strings.Contains(err.Error(), "file exists")
}

func sortedAddrs(as map[netip.Addr]bool) []netip.Addr {
	return slices.SortedFunc(maps.Keys(as), netip.Addr.Compare)
}

// want is what the lowest service port name rendering virtual server k wants; nil
// if none does.
func (b *Backend) want(k ipvs.Key) *virtual {
	var (
		first model.ServicePortName
		w     *virtual
	)
	for name, v := range b.vsOwners[k] {
		if w == nil || name.Compare(first) < 0 {
			first, w = name, v
		}
	}
	return w
}

// syncVirtual makes virtual server k what the backend wants, from what it
// believes the kernel has.
func (b *Backend) syncVirtual(res *proxier.SyncResult, k ipvs.Key) error {
	want, have := b.want(k), b.have[k]
	switch {
	case want == nil && have == nil:
		return nil
	case want == nil:
		if b.noEndpoints(k) && b.carries(k, have) {
			// As kube-proxy, which keeps the virtual server of a port without
			// endpoints: its real servers drain, so established connections
			// go on (new ones are refused by the filter rules), and the
			// virtual server goes with the last of them (pruneDrained). A
			// virtual server no port renders at all (a Service, address or
			// port gone) goes at once, as in kube-proxy.
			err := b.syncDests(res, k, nil, have)
			if len(have.dests) > 0 {
				return err
			}
		}
		res.Operations++
		delete(b.have, k)
		delete(b.draining, k)
		return b.k.DelService(k)
	case have == nil:
		res.Operations++
		if err := b.k.AddService(want.svc); err != nil && !exists(err) {
			return err
		}
		have = &virtual{svc: want.svc}
		b.have[k] = have
	case have.svc != want.svc:
		res.Operations++
		if err := b.k.UpdateService(want.svc); err != nil {
			return err
		}
		have.svc = want.svc
	}
	return b.syncDests(res, k, want.dests, have)
}

// noEndpoints reports whether k is a TCP address and port a Service port still
// has, without endpoints (its filter rules refuse or drop new connections).
func (b *Backend) noEndpoints(k ipvs.Key) bool {
	e := ipvs.Entry{IP: k.Addr, Proto: k.Proto, Port: k.Port}
	return k.Proto == unix.IPPROTO_TCP && (b.members[member{setNoEndpoints, e}] > 0 || b.members[member{setNoLocal, e}] > 0)
}

// carries reports whether virtual server k has real servers with connections
// (or whose counts cannot be read). Without, it goes at once rather than
// draining each real server first: two operations per real server instead of
// one for the virtual server, when a Service with many endpoints is deleted.
func (b *Backend) carries(k ipvs.Key, have *virtual) bool {
	if len(have.dests) == 0 {
		return false
	}
	counts := b.destCounts(k)
	if counts == nil {
		return true
	}
	for _, c := range counts {
		if c.Active+c.Inactive > 0 {
			return true
		}
	}
	return false
}

// syncDests adds, reweights and removes real servers, removing last (as
// kube-proxy does): when every endpoint is replaced at once, the virtual server
// never goes without a real server, which would refuse new connections. A
// removed TCP real server is drained (see removeDest).
func (b *Backend) syncDests(res *proxier.SyncResult, k ipvs.Key, want []ipvs.Dest, have *virtual) error {
	var errs []error
	out := make([]ipvs.Dest, 0, len(want))
	// keep records what the kernel holds after one step (nothing: a zero Dest).
	keep := func(d ipvs.Dest, err error) {
		if err != nil {
			errs = append(errs, err)
		}
		if d.Addr.IsValid() {
			out = append(out, d)
		}
	}
	var gone []ipvs.Dest
	i, j := 0, 0
	for i < len(want) || j < len(have.dests) {
		switch {
		case j == len(have.dests) || i < len(want) && cmpDest(want[i], have.dests[j]) < 0:
			keep(b.addDest(res, k, want[i]))
			i++
		case i == len(want) || cmpDest(want[i], have.dests[j]) > 0:
			gone = append(gone, have.dests[j])
			j++
		default:
			keep(b.reweightDest(res, k, want[i], have.dests[j]))
			i, j = i+1, j+1
		}
	}
	for _, d := range gone {
		keep(b.removeDest(res, k, d))
	}
	slices.SortFunc(out, cmpDest)
	have.dests = out
	return errors.Join(errs...)
}

// addDest adds real server d to k (or sets its weight if it is there).
func (b *Backend) addDest(res *proxier.SyncResult, k ipvs.Key, d ipvs.Dest) (ipvs.Dest, error) {
	res.Operations++
	err := b.k.AddDest(k, d)
	if err != nil && exists(err) {
		err = b.k.UpdateDest(k, d)
	}
	if err != nil {
		return ipvs.Dest{}, err
	}
	b.undrain(k, d)
	return d, nil
}

// reweightDest gives have, a real server the backend keeps, want's weight.
func (b *Backend) reweightDest(res *proxier.SyncResult, k ipvs.Key, want, have ipvs.Dest) (ipvs.Dest, error) {
	if want.Weight == have.Weight {
		return want, nil
	}
	res.Operations++
	if err := b.k.UpdateDest(k, want); err != nil {
		return have, err
	}
	b.undrain(k, want)
	return want, nil
}

// removeDest deletes a UDP or SCTP real server d from k at once, as kube-proxy
// does: expire_nodest_conn ends its flows on their next packet, as the other
// modes' conntrack cleanup ends theirs, and the client's next datagram or new
// association goes to another endpoint. A TCP one it drains: weight 0, so IPVS
// schedules no new connection to it, and pruneDrained deletes it once a count
// read after that shows no connection. Deleting on a count read while the real
// server could still be scheduled would lose a connection scheduled between the
// read and the delete (its next packet dropped, then reset by the node), and one
// at weight 0 already (drained by an earlier process, or by kube-proxy) may
// still have connections.
func (b *Backend) removeDest(res *proxier.SyncResult, k ipvs.Key, d ipvs.Dest) (ipvs.Dest, error) {
	key := ipvs.Dest{Addr: d.Addr, Port: d.Port}
	if b.draining[k][key] {
		return d, nil // pruneDrained deletes it
	}
	if k.Proto != unix.IPPROTO_TCP {
		res.Operations++
		if err := b.k.DelDest(k, d); err != nil {
			return d, err
		}
		return ipvs.Dest{}, nil
	}
	drained := d
	if d.Weight != 0 {
		res.Operations++
		drained.Weight = 0
		if err := b.k.UpdateDest(k, drained); err != nil {
			return d, err
		}
	}
	if b.draining[k] == nil {
		b.draining[k] = map[ipvs.Dest]bool{}
	}
	b.draining[k][key] = true
	return drained, nil
}

func (b *Backend) undrain(k ipvs.Key, d ipvs.Dest) {
	if m := b.draining[k]; m != nil {
		delete(m, ipvs.Dest{Addr: d.Addr, Port: d.Port})
		if len(m) == 0 {
			delete(b.draining, k)
		}
	}
}

func (b *Backend) destCounts(k ipvs.Key) map[netip.AddrPort]ipvs.Dest {
	ds, err := b.k.Dests(k)
	if err != nil {
		klog.V(2).ErrorS(err, "Reading IPVS real servers' connection counts", "ipFamily", b.f.Name, "service", k.String())
		return nil
	}
	out := make(map[netip.AddrPort]ipvs.Dest, len(ds))
	for _, d := range ds {
		out[netip.AddrPortFrom(d.Addr, d.Port)] = d
	}
	return out
}

// pruneDrained deletes drained real servers that have no connection left, of
// the virtual servers in only (all when nil: a partial sync reads the counts of
// those it touched, the periodic check those of the rest). When the counts
// cannot be read it keeps them for the next try (a full sync, which reads the
// kernel, forgets one that is gone).
func (b *Backend) pruneDrained(res *proxier.SyncResult, only map[ipvs.Key]bool) {
	for k, ds := range b.draining {
		if only != nil && !only[k] {
			continue
		}
		counts := map[netip.AddrPort]ipvs.Dest{}
		if len(ds) > 0 { // empty: a kept virtual server's delete to retry
			if counts = b.destCounts(k); counts == nil {
				continue
			}
		}
		for d := range ds {
			c, ok := counts[netip.AddrPortFrom(d.Addr, d.Port)]
			if ok && c.Active+c.Inactive > 0 {
				continue
			}
			delete(ds, d)
			if ok {
				res.Operations++
				if err := b.k.DelDest(k, c); err != nil {
					klog.ErrorS(err, "Deleting a drained IPVS real server", "ipFamily", b.f.Name, "service", k.String())
					continue
				}
			}
			if h := b.have[k]; h != nil {
				h.dests = slices.DeleteFunc(h.dests, func(x ipvs.Dest) bool { return x.Addr == d.Addr && x.Port == d.Port })
			}
		}
		if len(ds) == 0 {
			if h := b.have[k]; h != nil && len(h.dests) == 0 && b.want(k) == nil {
				// The virtual server was kept for these (syncVirtual). On an
				// error the empty drain stays, for the next check to retry.
				res.Operations++
				if err := b.k.DelService(k); err != nil {
					klog.ErrorS(err, "Deleting a drained IPVS virtual server", "ipFamily", b.f.Name, "service", k.String())
					continue
				}
				delete(b.have, k)
			}
			delete(b.draining, k)
		}
	}
}

// Flushed implements proxier.FlushDetector: the dummy link, an ipset or one of
// the chains gone (a firewall reload empties every table), or a virtual server,
// address or ipset member written gone (drifted), means someone removed
// dsproxy's state. It also deletes drained real servers whose connections ended,
// since it runs on every periodic check.
func (b *Backend) Flushed(ctx context.Context) bool {
	if !b.synced {
		return false
	}
	var res proxier.SyncResult
	b.pruneDrained(&res, nil)
	if b.rulesChanged(ctx) {
		return true
	}
	for s := range numSets {
		if _, ok, err := b.k.Entries(setName(b.f, s)); err == nil && !ok {
			return true
		}
	}
	if len(b.addrs) > 0 {
		if as, err := b.k.Addrs(); err == nil && len(as) == 0 {
			return true
		}
	}
	return b.drifted()
}

// drifted reports whether a virtual server, a bound address, an ipset member
// or a real server the backend wrote is gone from the kernel (someone's
// ipvsadm -D, -C or -d, ip addr del, ipset del), or a virtual server's
// settings (ipvsadm -E) or a real server's weight (ipvsadm -e) changed:
// kube-proxy's IPVS mode
// reconciles them at every sync, so the periodic check notices them and asks
// for the full sync that repairs them. It costs one dump of the family's
// virtual servers, one of the link's addresses, one per ipset, and one per
// virtual server for the real servers of at most destChecks of them
// (driftedDests): with more, a deleted real server is seen within
// ceil(virtual servers / destChecks) checks. A failed read answers no: the full
// sync reads the same and reports it.
func (b *Backend) drifted() bool {
	svcs, err := b.k.Services()
	if err != nil {
		return false
	}
	live := make(map[ipvs.Key]ipvs.Service, len(svcs))
	for _, s := range svcs {
		live[s.Key] = s
	}
	for k, v := range b.have {
		switch s, ok := live[k]; {
		case !ok:
			klog.V(2).InfoS("IPVS virtual server gone", "ipFamily", b.f.Name, "service", k.String())
			return true
		case s != v.svc:
			// ipvsadm -E: another scheduler, persistence or timeout, which
			// kube-proxy's IPVS mode sets back at every sync.
			klog.V(2).InfoS("IPVS virtual server changed", "ipFamily", b.f.Name, "service", k.String(),
				"scheduler", s.Scheduler, "persistent", s.Persistent, "timeout", s.Timeout)
			return true
		}
	}
	kmem, err := b.kernelMembers()
	if err != nil {
		return false
	}
	for m, n := range b.members {
		if n > 0 && !kmem[m] {
			klog.V(2).InfoS("IPVS ipset member gone", "ipFamily", b.f.Name, "set", setName(b.f, m.set), "entry", m.e)
			return true
		}
	}
	addrs, err := b.k.Addrs()
	if err != nil {
		return false
	}
	bound := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		bound[a] = true
	}
	for a, n := range b.addrs {
		if n > 0 && (!bound[a] || !kmem[member{setIPs, ipvs.Entry{IP: a}}]) {
			klog.V(2).InfoS("IPVS service address gone", "ipFamily", b.f.Name, "address", a)
			return true
		}
	}
	return b.driftedDests()
}

// driftedDests reads the real servers of the next destChecks virtual servers
// (in key order, after destCursor, wrapping around) and reports whether one the
// backend wrote with a weight is gone or has another weight. Draining ones
// (weight 0) go on their own.
func (b *Backend) driftedDests() bool {
	keys := slices.SortedFunc(maps.Keys(b.have), ipvs.Key.Compare)
	if len(keys) == 0 {
		return false
	}
	start, found := slices.BinarySearchFunc(keys, b.destCursor, ipvs.Key.Compare)
	if found {
		start++
	}
	for i := range min(destChecks, len(keys)) {
		k := keys[(start+i)%len(keys)]
		b.destCursor = k
		if !slices.ContainsFunc(b.have[k].dests, func(d ipvs.Dest) bool { return d.Weight > 0 }) {
			continue
		}
		ds, err := b.k.Dests(k)
		if err != nil {
			continue
		}
		live := make(map[netip.AddrPort]int, len(ds))
		for _, d := range ds {
			live[netip.AddrPortFrom(d.Addr, d.Port)] = d.Weight
		}
		for _, d := range b.have[k].dests {
			if d.Weight == 0 {
				continue
			}
			switch w, ok := live[netip.AddrPortFrom(d.Addr, d.Port)]; {
			case !ok:
				klog.V(2).InfoS("IPVS real server gone", "ipFamily", b.f.Name, "service", k.String(), "realServer", netip.AddrPortFrom(d.Addr, d.Port))
				return true
			case w != d.Weight:
				// ipvsadm -e -w: the full sync sets it back.
				klog.V(2).InfoS("IPVS real server's weight changed", "ipFamily", b.f.Name, "service", k.String(),
					"realServer", netip.AddrPortFrom(d.Addr, d.Port), "weight", w, "want", d.Weight)
				return true
			}
		}
	}
	return false
}

// fullSync rebuilds the wanted state, reads the kernel's, and repairs every
// difference; differences from what the backend believed are counted as repairs.
func (b *Backend) fullSync(ctx context.Context, req *proxier.SyncRequest, res *proxier.SyncResult) error {
	wasSynced, belief, draining := b.synced, b.have, b.draining
	oldMembers, oldAddrs := b.members, b.addrs
	b.reset()
	b.draining = draining
	b.node = req.Node
	vs, ms, as := map[ipvs.Key]bool{}, map[member]bool{}, map[netip.Addr]bool{}
	for name := range req.State.Ports {
		if o := b.renderName(req, name); o != nil {
			b.written[name] = o
			b.account(name, o, 1, vs, ms, as)
		}
	}
	node := renderNode(req.Node)
	b.written[model.ServicePortName{}] = node
	b.account(model.ServicePortName{}, node, 1, vs, ms, as)
	if err := b.setup(ctx, req.Node, res, wasSynced); err != nil {
		return err
	}
	kernel, err := b.readVirtuals()
	if err != nil {
		return err
	}
	for k := range kernel {
		vs[k] = true
	}
	if wasSynced {
		res.Repairs += countVSDiff(belief, kernel)
	}
	b.have = kernel
	// A virtual server gone from the kernel (deleted by someone else) has
	// nothing left to drain: its entries would otherwise stay forever, their
	// counts unreadable at every periodic check.
	for k := range b.draining {
		if kernel[k] == nil {
			delete(b.draining, k)
		}
	}
	if err := b.diffSets(res, ms, as, wasSynced, oldMembers, oldAddrs); err != nil {
		return err
	}
	err = b.apply(res, vs, ms, as)
	b.pruneDrained(res, nil)
	if err != nil {
		return err
	}
	b.synced = true
	return nil
}

// readVirtuals lists the kernel's virtual servers of the family (but those in
// ExcludeCIDRs) with their real servers.
func (b *Backend) readVirtuals() (map[ipvs.Key]*virtual, error) {
	svcs, err := b.k.Services()
	if err != nil {
		return nil, err
	}
	kernel := make(map[ipvs.Key]*virtual, len(svcs))
	for _, s := range svcs {
		if b.excluded(s.Addr) {
			continue
		}
		ds, err := b.k.Dests(s.Key)
		if err != nil {
			return nil, err
		}
		v := &virtual{svc: s}
		for _, d := range ds {
			v.dests = append(v.dests, ipvs.Dest{Addr: d.Addr, Port: d.Port, Weight: d.Weight})
		}
		slices.SortFunc(v.dests, cmpDest)
		kernel[s.Key] = v
	}
	return kernel, nil
}

// kernelMembers reads the members of every ipset of the family.
func (b *Backend) kernelMembers() (map[member]bool, error) {
	kmem := map[member]bool{}
	for s := range numSets {
		entries, _, err := b.k.Entries(setName(b.f, s))
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			kmem[member{s, e}] = true
		}
	}
	return kmem, nil
}

// diffSets reads the kernel's ipset members and link addresses into ms and as
// (present or not; the addresses, bound to the link and members of setIPs, go
// together), for apply to change what differs from the wanted ones; differences
// from the old counts are repairs when the kernel was synced before.
func (b *Backend) diffSets(res *proxier.SyncResult, ms map[member]bool, as map[netip.Addr]bool,
	wasSynced bool, oldMembers map[member]int, oldAddrs map[netip.Addr]int) error {
	kmem, err := b.kernelMembers()
	if err != nil {
		return err
	}
	addrs, err := b.k.Addrs()
	if err != nil {
		return err
	}
	bound := map[netip.Addr]bool{}
	for _, a := range addrs {
		bound[a] = true
		as[a] = false
	}
	for m := range kmem {
		if m.set == setIPs {
			as[m.e.IP] = false
		} else {
			ms[m] = false
		}
	}
	for m := range ms {
		if wasSynced && oldMembers[m] > 0 != kmem[m] {
			res.Repairs++
		}
		ms[m] = kmem[m]
	}
	for a := range as {
		inIPs := kmem[member{setIPs, ipvs.Entry{IP: a}}]
		if wasSynced && (oldAddrs[a] > 0 != bound[a] || oldAddrs[a] > 0 != inIPs) {
			res.Repairs++
		}
		// Present only when both are: a wanted address gets both (again), an
		// unwanted one loses both.
		if b.addrs[a] > 0 {
			as[a] = bound[a] && inIPs
		} else {
			as[a] = bound[a] || inIPs
		}
	}
	return nil
}

// countVSDiff counts the virtual servers whose kernel state differs from belief.
func countVSDiff(belief, kernel map[ipvs.Key]*virtual) int {
	n := 0
	for k, v := range belief {
		kv := kernel[k]
		if kv == nil || kv.svc != v.svc || !slices.Equal(kv.dests, v.dests) {
			n++
		}
	}
	for k := range kernel {
		if belief[k] == nil {
			n++
		}
	}
	return n
}

func (b *Backend) excluded(a netip.Addr) bool {
	for _, p := range b.opts.ExcludeCIDRs {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Sysctls are the sysctls (name under /proc/sys, value) the IPVS mode sets for
// family f; with strictARP the node does not answer ARP for the addresses on the
// dummy link.
func Sysctls(f *family.Family, strictARP bool) [][2]string {
	sysctls := [][2]string{
		// IPVS keeps conntrack entries, so the nat table can masquerade.
		{"net/ipv4/vs/conntrack", "1"},
		// Connections to a deleted real server are dropped at their next packet
		// rather than hanging; templates of a drained one expire.
		{"net/ipv4/vs/expire_nodest_conn", "1"},
		{"net/ipv4/vs/expire_quiescent_template", "1"},
		// As kube-proxy's IPVS mode: the node forwards what IPVS sends on.
		{"net/ipv4/ip_forward", "1"},
	}
	if connReuseModeFix(kernelRelease()) {
		// As kube-proxy: kernels 4.1 to 5.8 delay a connection that reuses a
		// source port of one IPVS still tracks by a second unless this is 0
		// (kubernetes#93297); later kernels fixed that, earlier lack it.
		sysctls = append(sysctls, [2]string{"net/ipv4/vs/conn_reuse_mode", "0"})
	}
	if strictARP && f.BitLen == 32 {
		sysctls = append(sysctls, [2]string{"net/ipv4/conf/all/arp_ignore", "1"}, [2]string{"net/ipv4/conf/all/arp_announce", "2"})
	}
	return sysctls
}

// kernelRelease is the running kernel's release ("6.1.0-28-amd64"), "" when
// unknown.
func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// connReuseModeFix reports whether a kernel release is one of those (4.1 to 5.8)
// where kube-proxy sets net/ipv4/vs/conn_reuse_mode to 0.
func connReuseModeFix(release string) bool {
	major, rest, _ := strings.Cut(release, ".")
	minor, _, _ := strings.Cut(rest, ".")
	minor, _, _ = strings.Cut(minor, "-")
	ma, err1 := strconv.Atoi(major)
	mi, err2 := strconv.Atoi(minor)
	if err1 != nil || err2 != nil {
		return false
	}
	v := ma*1000 + mi
	return v >= 4001 && v < 5009
}

// setup creates the dummy link and the ipsets, sets IPVS's sysctls, and writes
// the iptables rules with the jumps to them; a missing jump counts as a repair
// when the kernel was synced before.
func (b *Backend) setup(ctx context.Context, node *proxier.NodeConfig, res *proxier.SyncResult, wasSynced bool) error {
	if _, err := b.k.EnsureLink(); err != nil {
		return err
	}
	for s := range numSets {
		if err := b.k.EnsureSet(setName(b.f, s), setDefs[s].typ); err != nil {
			return err
		}
	}
	for _, s := range Sysctls(b.f, b.opts.StrictARP) {
		if err := b.opts.Sysctl(s[0], s[1]); err != nil {
			return err
		}
	}
	if err := b.r.Restore(ctx, []byte(ruleset(node, b.opts.MasqueradeBit, b.r.HasRandomFully(), b.opts.TCPBeLiberal))); err != nil {
		res.RestoreFailed = true
		return err
	}
	res.Transactions++
	repairs := res.Repairs
	for _, j := range jumps {
		added, err := b.r.EnsureRule(j[0], j[1], "-m", "comment", "--comment", "dsproxy ipvs", "-j", j[2])
		if err != nil {
			return err
		}
		if added && wasSynced {
			res.Repairs++
		}
	}
	if b.rulesDrift && wasSynced && res.Repairs == repairs {
		res.Repairs++ // a chain's rules, rewritten by the restore
	}
	b.rules, b.rulesDrift = nil, false
	if save, err := b.r.Save(ctx, ""); err == nil {
		b.rules = ourRules(save)
	} else {
		klog.V(2).InfoS("Reading back the IPVS mode's iptables rules", "ipFamily", b.f.Name, "err", err)
	}
	return nil
}

// rulesChanged reports whether dsproxy's iptables rules differ from those the
// last setup wrote: a jump deleted from a built-in chain, a chain flushed,
// deleted or edited (iptables -D, iptables -F, a firewall reload). kube-proxy's
// IPVS mode writes them again at every sync; here the periodic check reads them
// (one iptables-save) and asks for the full sync that does. When the setup could
// not read them back, or this read fails, only the two chains' presence is
// checked; a failed check answers no: the full sync reads the same and reports it.
func (b *Backend) rulesChanged(ctx context.Context) bool {
	if b.rules != nil {
		if save, err := b.r.Save(ctx, ""); err == nil {
			now := ourRules(save)
			changed := !slices.Equal(now, b.rules)
			if changed {
				klog.V(2).InfoS("The IPVS mode's iptables rules changed", "ipFamily", b.f.Name, "rules", len(now), "written", len(b.rules))
				b.rulesDrift = true
			}
			return changed
		}
	}
	for _, c := range [][2]string{{"nat", chainServices}, {"filter", chainInput}} {
		if ok, err := b.r.ChainExists(c[0], c[1]); err == nil && !ok {
			return true
		}
	}
	return false
}

// ourRules returns, from an iptables-save of every table, dsproxy's chains and
// the rules that name them (its chains' rules and the jumps to them), each line
// prefixed with its table, in save order; chain lines without their counters.
func ourRules(save string) []string {
	var out []string
	table := ""
	for line := range strings.SplitSeq(save, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
		case strings.HasPrefix(line, ":"+Prefix):
			name, _, _ := strings.Cut(line, " ")
			out = append(out, table+" "+name)
		case strings.HasPrefix(line, "-A ") && strings.Contains(line, Prefix):
			out = append(out, table+" "+line)
		}
	}
	return out
}

// UnbindAddrs removes the family's Service addresses from the dummy link and
// returns them; Cleanup does it first. Leaving IPVS mode, it is the first thing
// to do, for both families: while a Service address is local, the node's own
// new connections to it take it as their source address, and once it is
// removed their replies (de-NATed back to it) are no longer delivered locally.
// The other mode's rules already serve the node's connections, so the window
// in which such a connection can start is kept as short as it can be.
func UnbindAddrs(k Kernel) ([]netip.Addr, error) {
	addrs, err := k.Addrs()
	errs := []error{err}
	for _, a := range addrs {
		errs = append(errs, k.DelAddr(a))
	}
	return addrs, errors.Join(errs...)
}

// Cleanup implements proxier.Backend: it removes the family's iptables chains,
// the virtual servers dsproxy made (those on the dummy link's addresses and the
// NodePorts its ipsets name; never those in ExcludeCIDRs), the family's
// addresses on the dummy link (and the link when no family uses it), and its
// ipsets. Where ipset is not loaded no set is asked for, which would load it.
func (b *Backend) Cleanup(ctx context.Context) error {
	b.reset()
	var errs []error
	addrs, err := UnbindAddrs(b.k)
	errs = append(errs, err)
	bound := map[netip.Addr]bool{}
	for _, a := range addrs {
		bound[a] = true
	}
	save, err := b.r.Save(ctx, "")
	if err != nil {
		errs = append(errs, err)
	} else if undo := ipt.Undo(save, Prefix); undo != "" {
		errs = append(errs, b.r.Restore(ctx, []byte(undo)))
	}
	ours := map[ipvs.Key]bool{}
	sets := b.opts.IPSetLoaded()
	if sets {
		// The addresses may be unbound already (UnbindAddrs); setIPs still
		// names them.
		entries, _, err := b.k.Entries(setName(b.f, setIPs))
		errs = append(errs, err)
		for _, e := range entries {
			bound[e.IP] = true
		}
		for _, s := range []setID{setExternal, setExternalLocal} {
			entries, _, err := b.k.Entries(setName(b.f, s))
			errs = append(errs, err)
			for _, e := range entries {
				ours[ipvs.Key{Addr: e.IP, Proto: e.Proto, Port: e.Port}] = true
			}
		}
	}
	svcs, err := b.k.Services()
	errs = append(errs, err)
	for _, s := range svcs {
		if (bound[s.Addr] || ours[s.Key]) && !b.excluded(s.Addr) {
			errs = append(errs, b.k.DelService(s.Key))
		}
	}
	errs = append(errs, b.k.DeleteLinkIfEmpty())
	if sets {
		for s := range numSets {
			errs = append(errs, b.k.DestroySet(setName(b.f, s)))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s: ipvs mode cleanup: %w", b.f, err)
	}
	return nil
}
