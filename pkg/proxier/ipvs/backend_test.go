package ipvs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/dsproxy/dsproxy/internal/porttest"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/ipvs"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nodeport"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// fakeKernel models IPVS, the dummy link and ipsets the way the kernel keeps
// them: adding what exists, or removing what does not, fails.
type fakeKernel struct {
	svcs  map[ipvs.Key]ipvs.Service
	dests map[ipvs.Key]map[netip.AddrPort]ipvs.Dest
	link  bool
	addrs map[netip.Addr]bool
	sets  map[string]map[ipvs.Entry]bool
	// conns are connection counts per real server (for draining).
	conns map[netip.AddrPort]int
	// quiet holds the real servers whose connection counts were read while they
	// were at weight 0 (no connection can have come since); lost records TCP
	// real servers deleted otherwise: a connection scheduled after the deleter
	// read the counts (or one it never read) would be lost.
	quiet map[ipvs.Key]map[netip.AddrPort]bool
	lost  []string
	// destsErr, when set, fails every read of real servers; reads counts them.
	destsErr error
	// delSvcErr, when set, fails every virtual server deletion.
	delSvcErr error
	reads     int
	ops       int
	// observe, when set, runs after every change to the kernel.
	observe func()
}

// op counts one kernel operation; deferred, it lets observe see its outcome.
func (k *fakeKernel) op() {
	k.ops++
	if k.observe != nil {
		k.observe()
	}
}

func newFake() *fakeKernel {
	return &fakeKernel{svcs: map[ipvs.Key]ipvs.Service{}, dests: map[ipvs.Key]map[netip.AddrPort]ipvs.Dest{},
		addrs: map[netip.Addr]bool{}, sets: map[string]map[ipvs.Entry]bool{}, conns: map[netip.AddrPort]int{},
		quiet: map[ipvs.Key]map[netip.AddrPort]bool{}}
}

var errExist = errors.New("file exists")

func (k *fakeKernel) Services() ([]ipvs.Service, error) {
	return slices.Collect(maps.Values(k.svcs)), nil
}
func (k *fakeKernel) AddService(s ipvs.Service) error {
	defer k.op()
	if _, ok := k.svcs[s.Key]; ok {
		return errExist
	}
	k.svcs[s.Key] = s
	k.dests[s.Key] = map[netip.AddrPort]ipvs.Dest{}
	return nil
}
func (k *fakeKernel) UpdateService(s ipvs.Service) error {
	defer k.op()
	if _, ok := k.svcs[s.Key]; !ok {
		return fmt.Errorf("update: no service %s", s.Key)
	}
	k.svcs[s.Key] = s
	return nil
}
func (k *fakeKernel) DelService(s ipvs.Key) error {
	defer k.op()
	if k.delSvcErr != nil {
		return k.delSvcErr
	}
	if _, ok := k.svcs[s]; !ok {
		return fmt.Errorf("delete: no service %s", s)
	}
	delete(k.svcs, s)
	delete(k.dests, s)
	delete(k.quiet, s)
	return nil
}
func (k *fakeKernel) Dests(s ipvs.Key) ([]ipvs.Dest, error) {
	k.reads++
	if k.destsErr != nil {
		return nil, k.destsErr
	}
	if _, ok := k.svcs[s]; !ok {
		return nil, fmt.Errorf("dests: no service %s", s)
	}
	var out []ipvs.Dest
	for ap, d := range k.dests[s] {
		d.Active = k.conns[ap]
		out = append(out, d)
		if d.Weight == 0 {
			if k.quiet[s] == nil {
				k.quiet[s] = map[netip.AddrPort]bool{}
			}
			k.quiet[s][ap] = true
		}
	}
	return out, nil
}
func (k *fakeKernel) destOp(s ipvs.Key, d ipvs.Dest, add, del bool) error {
	defer k.op()
	ds, ok := k.dests[s]
	if !ok {
		return fmt.Errorf("no service %s", s)
	}
	if add && !unicastForLinux(d.Addr) {
		return unix.EINVAL // ip_vs_ctl: a real server must be unicast (or local)
	}
	ap := netip.AddrPortFrom(d.Addr, d.Port)
	_, have := ds[ap]
	switch {
	case add && have:
		return errExist
	case !add && !have:
		return fmt.Errorf("no real server %s in %s", ap, s)
	case del:
		if s.Proto == unix.IPPROTO_TCP && !k.quiet[s][ap] {
			k.lost = append(k.lost, fmt.Sprintf("%s in %s", ap, s))
		}
		delete(ds, ap)
		delete(k.quiet[s], ap)
	default:
		ds[ap] = ipvs.Dest{Addr: d.Addr, Port: d.Port, Weight: d.Weight}
		if d.Weight != 0 {
			delete(k.quiet[s], ap)
		}
	}
	return nil
}
func (k *fakeKernel) AddDest(s ipvs.Key, d ipvs.Dest) error    { return k.destOp(s, d, true, false) }
func (k *fakeKernel) UpdateDest(s ipvs.Key, d ipvs.Dest) error { return k.destOp(s, d, false, false) }
func (k *fakeKernel) DelDest(s ipvs.Key, d ipvs.Dest) error    { return k.destOp(s, d, false, true) }
func (k *fakeKernel) EnsureLink() (bool, error) {
	created := !k.link
	k.link = true
	return created, nil
}
func (k *fakeKernel) Addrs() ([]netip.Addr, error) {
	// As the real kernel's dump is read: without the link's own addresses.
	var out []netip.Addr
	for a := range k.addrs {
		if !ipvs.KernelOwnAddr(a) {
			out = append(out, a)
		}
	}
	return out, nil
}
func (k *fakeKernel) AddAddr(a netip.Addr) error {
	defer k.op()
	if !k.link {
		return errors.New("no link")
	}
	if a.Is6() && a.IsMulticast() {
		return unix.EINVAL // "Cannot assign multicast address without IFA_F_MCAUTOJOIN"
	}
	k.addrs[a] = true
	return nil
}
func (k *fakeKernel) DelAddr(a netip.Addr) error {
	defer k.op()
	delete(k.addrs, a)
	return nil
}
func (k *fakeKernel) DeleteLinkIfEmpty() error {
	if len(k.addrs) == 0 {
		k.link = false
	}
	return nil
}
func (k *fakeKernel) EnsureSet(name, _ string) error {
	if k.sets[name] == nil {
		k.sets[name] = map[ipvs.Entry]bool{}
	}
	return nil
}
func (k *fakeKernel) DestroySet(name string) error {
	delete(k.sets, name)
	return nil
}
func (k *fakeKernel) Entries(name string) ([]ipvs.Entry, bool, error) {
	s, ok := k.sets[name]
	return slices.Collect(maps.Keys(s)), ok, nil
}
func (k *fakeKernel) AddEntry(set string, e ipvs.Entry) error {
	defer k.op()
	s, ok := k.sets[set]
	if !ok {
		return fmt.Errorf("no set %s", set)
	}
	s[e] = true
	return nil
}
func (k *fakeKernel) DelEntry(set string, e ipvs.Entry) error {
	defer k.op()
	s, ok := k.sets[set]
	if !ok {
		return fmt.Errorf("no set %s", set)
	}
	delete(s, e)
	return nil
}

// dump is the kernel state as sorted lines, for comparing kernels.
func (k *fakeKernel) dump() []string {
	var out []string
	for key, s := range k.svcs {
		line := fmt.Sprintf("vs %s %s p=%v t=%d ->", key, s.Scheduler, s.Persistent, s.Timeout)
		ds := slices.SortedFunc(maps.Values(k.dests[key]), cmpDest)
		for _, d := range ds {
			line += fmt.Sprintf(" %s w%d", netip.AddrPortFrom(d.Addr, d.Port), d.Weight)
		}
		out = append(out, line)
	}
	for a := range k.addrs {
		out = append(out, "addr "+a.String())
	}
	for name, s := range k.sets {
		for e := range s {
			out = append(out, fmt.Sprintf("set %s %+v", name, e))
		}
	}
	slices.Sort(out)
	return out
}

// fakeRunner records the iptables input.
type fakeRunner struct {
	restored []string
	jumps    map[string]bool
	// flushed makes ChainExists say no (a firewall reload).
	flushed bool
	// saveErr makes Save fail.
	saveErr error
	// observe, when set, runs after every restore.
	observe func()
}

func (r *fakeRunner) ChainExists(string, string) (bool, error) {
	return len(r.restored) > 0 && !r.flushed, nil
}

func (r *fakeRunner) Restore(_ context.Context, data []byte) error {
	r.restored = append(r.restored, string(data))
	if r.observe != nil {
		r.observe()
	}
	return nil
}

// Save answers what the last restore wrote, and the jumps, in iptables-save's
// form; nothing when flushed.
func (r *fakeRunner) Save(context.Context, string) (string, error) {
	if r.saveErr != nil {
		return "", r.saveErr
	}
	if r.flushed || len(r.restored) == 0 {
		return "", nil
	}
	var b strings.Builder
	b.WriteString(r.restored[len(r.restored)-1])
	for _, k := range slices.Sorted(maps.Keys(r.jumps)) {
		table, rest, _ := strings.Cut(k, " ")
		chain, rule, _ := strings.Cut(rest, " ")
		fmt.Fprintf(&b, "*%s\n-A %s %s\nCOMMIT\n", table, chain, rule)
	}
	return b.String(), nil
}
func (r *fakeRunner) EnsureRule(table, chain string, rule ...string) (bool, error) {
	if r.jumps == nil {
		r.jumps = map[string]bool{}
	}
	k := table + " " + chain + " " + strings.Join(rule, " ")
	had := r.jumps[k]
	r.jumps[k] = true
	return !had, nil
}
func (r *fakeRunner) HasRandomFully() bool { return true }

// The unit tests' service ports and states (internal/porttest).
var (
	portName = porttest.Name
	addr     = porttest.Addr
	port     = porttest.Port
	state    = porttest.State
)

// node is porttest's node with two NodePort addresses.
func node(f *family.Family) *proxier.NodeConfig {
	return porttest.Node(f, addr(f, "192.0.2.1", "2001:db8::1"), addr(f, "198.51.100.1", "2001:db8:1::1"))
}

func newBackend(f *family.Family, k *fakeKernel) *Backend {
	return New(f, k, &fakeRunner{}, Options{MasqueradeBit: 14, Sysctl: func(string, string) error { return nil }})
}

func sync(t *testing.T, b *Backend, req *proxier.SyncRequest) proxier.SyncResult {
	t.Helper()
	res, err := b.Sync(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestRender(t *testing.T) {
	f := family.IPv4
	ps := port(f, "web", 10, 1, 2)
	ps.Cluster[0].Local = true
	ps.NodePort = 30010
	ps.ExternalIPs = []netip.Addr{netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("2001:db8::9")}
	ps.LoadBalancerVIPs = []netip.Addr{netip.MustParseAddr("203.0.113.2")}
	ps.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("192.0.2.7/32")}
	ps.AffinitySeconds = 60
	ps.HealthCheckNodePort = 32000
	o := render(ps, node(f), "rr")
	var got []string
	for _, v := range o.vs {
		line := fmt.Sprintf("%s p=%v t=%d:", v.svc.Key, v.svc.Persistent, v.svc.Timeout)
		for _, d := range v.dests {
			line += " " + netip.AddrPortFrom(d.Addr, d.Port).String()
		}
		got = append(got, line)
	}
	for _, m := range o.members {
		got = append(got, fmt.Sprintf("%s %s %d %d %s/%d", setDefs[m.set].name, m.e.IP, m.e.Proto, m.e.Port, m.e.IP2, m.e.CIDR2))
	}
	for _, a := range o.addrs {
		got = append(got, "bind "+a.String())
	}
	want := []string{
		"tcp/10.96.0.10:80 p=true t=60: 10.64.0.1:8080 10.64.0.2:8080",
		"tcp/203.0.113.1:80 p=true t=60: 10.64.0.1:8080 10.64.0.2:8080",
		"tcp/203.0.113.2:80 p=true t=60: 10.64.0.1:8080 10.64.0.2:8080",
		"tcp/192.0.2.1:30010 p=true t=60: 10.64.0.1:8080 10.64.0.2:8080",
		"tcp/198.51.100.1:30010 p=true t=60: 10.64.0.1:8080 10.64.0.2:8080",
		"CLUSTER-IP 10.96.0.10 6 80 invalid IP/0",
		"EXTERNAL 203.0.113.1 6 80 invalid IP/0",
		"EXTERNAL 203.0.113.2 6 80 invalid IP/0",
		"FIREWALL 203.0.113.2 6 80 invalid IP/0",
		"SOURCE-RANGES 203.0.113.2 6 80 198.51.100.0/24",
		"SOURCE-RANGES 203.0.113.2 6 80 192.0.2.7/0",
		"EXTERNAL 192.0.2.1 6 30010 invalid IP/0",
		"EXTERNAL 198.51.100.1 6 30010 invalid IP/0",
		"LOOP-BACK 10.64.0.1 6 8080 10.64.0.1/0",
		"HEALTH-CHECK 192.0.2.1 6 32000 invalid IP/0",
		"HEALTH-CHECK 198.51.100.1 6 32000 invalid IP/0",
		"HEALTH-CHECK 203.0.113.1 6 32000 invalid IP/0",
		"HEALTH-CHECK 203.0.113.2 6 32000 invalid IP/0",
		"bind 10.96.0.10",
		"bind 203.0.113.1",
		"bind 203.0.113.2",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("render:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Without endpoints: no virtual server, a refusal (none anywhere) or a drop
	// (traffic policy Local, endpoints elsewhere only).
	empty := port(f, "empty", 11)
	empty.NodePort = 30011
	o = render(empty, node(f), "rr")
	noEps := slices.DeleteFunc(slices.Clone(o.members), func(m member) bool { return m.set != setNoEndpoints })
	if len(o.vs) != 0 || len(noEps) != 3 { // the ClusterIP and two NodePort addresses
		t.Fatalf("no endpoints: %+v", o)
	}
	// Traffic policy Local, endpoints elsewhere only: the NodePorts keep virtual
	// servers with the cluster endpoints, for local sources, and are marked for
	// the filter rules that drop the others.
	remote := port(f, "remote", 12, 3)
	remote.NodePort, remote.ExternalPolicyLocal = 30012, true
	o = render(remote, node(f), "rr")
	nodePortVS := 0
	for _, v := range o.vs {
		if v.svc.Port == 30012 && len(v.dests) == 1 && v.dests[0].Addr == remote.Cluster[0].Addr {
			nodePortVS++
		}
	}
	noLocalExt := slices.DeleteFunc(slices.Clone(o.members), func(m member) bool { return m.set != setNoLocalExt || m.e.Port != 30012 })
	if len(o.vs) != 3 || nodePortVS != 2 || len(noLocalExt) != 2 || slices.ContainsFunc(o.members, func(m member) bool { return m.set == setNoLocal }) {
		t.Fatalf("ETP Local without local endpoints: %+v", o)
	}
	// loadBalancerSourceRanges: the node's own connections to the VIP (which
	// take it as source) are allowed only when a range holds the node's IP.
	for _, c := range []struct {
		ranges   string
		fromNode bool
	}{{"198.51.100.0/24", false}, {"192.0.2.0/24", true}} {
		lb := port(f, "lb", 13, 1)
		vip, r := netip.MustParseAddr("203.0.113.9"), netip.MustParsePrefix(c.ranges)
		lb.LoadBalancerVIPs, lb.SourceRanges = []netip.Addr{vip}, []netip.Prefix{r}
		o = render(lb, node(f), "rr")
		self := slices.ContainsFunc(o.members, func(m member) bool { return m.set == setSourceRanges && m.e.IP == vip && m.e.IP2 == vip })
		if self != c.fromNode {
			t.Errorf("source range %s: the VIP as an allowed source is %v, want %v: %+v", r, self, c.fromNode, o.members)
		}
	}

	// With internal traffic policy Local too there are no cluster endpoints:
	// no virtual server, dropped for every source.
	remote.InternalPolicyLocal, remote.Cluster = true, nil
	o = render(remote, node(f), "rr")
	noLocal := slices.DeleteFunc(slices.Clone(o.members), func(m member) bool { return m.set != setNoLocal })
	if len(o.vs) != 0 || len(noLocal) != 3 {
		t.Fatalf("both traffic policies Local without local endpoints: %+v", o)
	}
}

// TestRandomPartialSyncs applies random one-port changes and checks after each
// that the kernel holds exactly what a full sync of the same state writes into
// an empty kernel, and that a full sync then finds nothing to repair.
func TestRandomPartialSyncs(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(11, uint64(f.BitLen)))
			k := newFake()
			b := newBackend(f, k)
			ports := map[model.ServicePortName]*model.PortState{}
			randomPort := func(i int) *model.PortState {
				var eps []int
				for e := range rnd.IntN(6) {
					if rnd.IntN(4) > 0 {
						eps = append(eps, 1+e)
					}
				}
				ps := port(f, fmt.Sprintf("s%d", i), 1+i, eps...)
				for j := range ps.Cluster {
					ps.Cluster[j].Local = rnd.IntN(3) == 0
					if ps.Cluster[j].Local {
						ps.Local = append(ps.Local, ps.Cluster[j])
					}
				}
				if rnd.IntN(5) == 0 { // endpoints on other nodes only
					ps.HasAny = true
				}
				if rnd.IntN(3) == 0 {
					ps.NodePort = uint16(30000 + i)
					ps.ExternalPolicyLocal = rnd.IntN(2) == 0
				}
				if rnd.IntN(4) == 0 {
					ps.AffinitySeconds = uint32(10 + rnd.IntN(2))
				}
				if rnd.IntN(4) == 0 {
					// Shared between Services: the address stays while any uses it,
					// and a virtual server two Services render (the same port) is
					// the lowest name's.
					ps.ExternalIPs = []netip.Addr{addr(f, "203.0.113.1", "2001:db8:7::1")}
					ps.Port = uint16(80 + i%3)
				}
				if rnd.IntN(5) == 0 {
					ps.LoadBalancerVIPs = []netip.Addr{addr(f, fmt.Sprintf("203.0.113.%d", 100+i), fmt.Sprintf("2001:db8:8::%d", i))}
					ps.SourceRanges = []netip.Prefix{netip.PrefixFrom(addr(f, "198.51.100.0", "2001:db8:9::"), map[int]int{32: 24, 128: 64}[f.BitLen])}
				}
				if rnd.IntN(6) == 0 {
					ps.HealthCheckNodePort = uint16(32000 + i)
				}
				return ps
			}
			st := func() *model.State {
				s := model.NewState()
				maps.Copy(s.Ports, ports)
				return s
			}
			for i := range 6 {
				ps := randomPort(i)
				ports[ps.Name] = ps
			}
			sync(t, b, &proxier.SyncRequest{Full: true, State: st(), Node: node(f)})
			for step := range 400 {
				var changed []model.ServicePortName
				for range 1 + rnd.IntN(2) {
					i := rnd.IntN(10)
					name := portName(fmt.Sprintf("s%d", i))
					if _, ok := ports[name]; ok && rnd.IntN(4) == 0 {
						delete(ports, name)
					} else {
						ports[name] = randomPort(i)
					}
					changed = append(changed, name)
				}
				// A port served before and after the sync is served after every
				// kernel operation of it.
				nd := node(f)
				isLocal := func(a netip.Addr) bool { return k.addrs[a] || slices.Contains(nodePortAddrs(nd), a) }
				servedBefore := map[ipvs.Key]bool{}
				for key := range k.svcs {
					servedBefore[key] = k.refusal(f, true, isLocal, key) == ""
				}
				refused := map[ipvs.Key]string{}
				k.observe = func() {
					for key, ok := range servedBefore {
						if _, seen := refused[key]; ok && !seen {
							if why := k.refusal(f, true, isLocal, key); why != "" {
								refused[key] = fmt.Sprintf("after kernel operation %d: %s", k.ops, why)
							}
						}
					}
				}
				k.ops = 0
				sync(t, b, &proxier.SyncRequest{State: st(), Changed: changed, Node: nd})
				k.observe = nil
				if len(k.lost) > 0 {
					t.Fatalf("step %d (%v): real servers deleted on no count read at weight 0 (a connection scheduled meanwhile would be lost): %v", step, changed, k.lost)
				}
				for key, why := range refused {
					if k.refusal(f, true, isLocal, key) == "" {
						t.Fatalf("step %d (%v): a new connection to %s, served before and after the sync, refused %s", step, changed, key, why)
					}
				}
				if k.ops > 60 {
					t.Fatalf("step %d: a partial sync of %d ports made %d kernel operations", step, len(changed), k.ops)
				}
				fresh := newFake()
				sync(t, newBackend(f, fresh), &proxier.SyncRequest{Full: true, State: st(), Node: node(f)})
				if got, want := k.dump(), fresh.dump(); !slices.Equal(got, want) {
					t.Fatalf("step %d (%v): kernel holds\n%s\nwant\n%s", step, changed, strings.Join(got, "\n"), strings.Join(want, "\n"))
				}
				if step%50 == 0 {
					if res := sync(t, b, &proxier.SyncRequest{Full: true, State: st(), Node: node(f)}); res.Repairs != 0 {
						t.Fatalf("step %d: full sync repaired %d", step, res.Repairs)
					}
				}
			}
		})
	}
}

// TestFullSyncRepairs breaks the kernel's state in every way the backend keeps
// and checks that a full sync counts each break as a repair and puts it back.
func TestFullSyncRepairs(t *testing.T) {
	f := family.IPv4
	web := port(f, "web", 10, 1, 2)
	web.NodePort = 30010
	st := state(web, port(f, "other", 11, 3))
	breaks := []struct {
		name   string
		break_ func(k *fakeKernel)
	}{
		{"virtual server deleted", func(k *fakeKernel) { _ = k.DelService(ipvs.Key{Addr: web.ClusterIP, Proto: 6, Port: 80}) }},
		{"real server deleted", func(k *fakeKernel) {
			_ = k.DelDest(ipvs.Key{Addr: web.ClusterIP, Proto: 6, Port: 80}, ipvs.Dest{Addr: web.Cluster[0].Addr, Port: 8080})
		}},
		{"stranger's virtual server", func(k *fakeKernel) {
			_ = k.AddService(ipvs.Service{Key: ipvs.Key{Addr: netip.MustParseAddr("10.96.9.9"), Proto: 6, Port: 1}})
		}},
		{"address unbound", func(k *fakeKernel) { delete(k.addrs, web.ClusterIP) }},
		{"set flushed", func(k *fakeKernel) { clear(k.sets[setName(f, setClusterIP)]) }},
		{"jump deleted", func(*fakeKernel) {}},
		{"member added", func(k *fakeKernel) {
			k.sets[setName(f, setNoEndpoints)][ipvs.Entry{IP: web.ClusterIP, Proto: 6, Port: 80}] = true
		}},
	}
	for _, br := range breaks {
		t.Run(br.name, func(t *testing.T) {
			k := newFake()
			b := newBackend(f, k)
			r := b.r.(*fakeRunner)
			sync(t, b, &proxier.SyncRequest{Full: true, State: st, Node: node(f)})
			want := k.dump()
			br.break_(k)
			if br.name == "jump deleted" {
				delete(r.jumps, "nat POSTROUTING -m comment --comment dsproxy ipvs -j "+chainPostrouting)
			}
			if res := sync(t, b, &proxier.SyncRequest{Full: true, State: st, Node: node(f)}); res.Repairs == 0 {
				t.Fatal("full sync after the break: 0 repairs")
			}
			if got := k.dump(); !slices.Equal(got, want) {
				t.Fatalf("after repair:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if res := sync(t, b, &proxier.SyncRequest{Full: true, State: st, Node: node(f)}); res.Repairs != 0 {
				t.Fatalf("second full sync: %d repairs", res.Repairs)
			}
		})
	}
}

// TestAdoptKeepsServing: a full sync that adopts virtual servers another
// program made (kube-proxy's IPVS mode, its addresses on its own link and
// none of dsproxy's ipsets or rules), or that a restarted dsproxy finds, never
// turns away a new connection from a pod to any of them, after any single
// kernel operation. refusal models the INPUT rules and IPVS.
func TestAdoptKeepsServing(t *testing.T) {
	for _, f := range family.All {
		var ports []*model.PortState
		for n := 10; n < 40; n++ {
			ports = append(ports, port(f, fmt.Sprintf("s%d", n), n, 1, 2))
		}
		web := ports[0]
		web.NodePort = 30010
		web.ExternalIPs = []netip.Addr{addr(f, "203.0.113.1", "2001:db8:9::1")}
		web.LoadBalancerVIPs = []netip.Addr{addr(f, "203.0.113.2", "2001:db8:9::2")}
		local := ports[1]
		local.NodePort = 30011
		local.ExternalPolicyLocal = true
		local.Cluster[0].Local = true
		local.Local = local.Cluster[:1]
		st := state(ports...)
		nd := node(f)

		want := newFake()
		sync(t, newBackend(f, want), &proxier.SyncRequest{Full: true, State: st, Node: nd})
		if len(want.svcs) < 30 {
			t.Fatalf("%s: %d virtual servers", f, len(want.svcs))
		}
		for _, restart := range []bool{false, true} {
			name := f.Name + " from kube-proxy"
			if restart {
				name = f.Name + " restart"
			}
			t.Run(name, func(t *testing.T) {
				k := newFake()
				for key, s := range want.svcs {
					k.svcs[key] = s
					k.dests[key] = maps.Clone(want.dests[key])
				}
				foreign := maps.Clone(want.addrs) // on kube-ipvs0
				b := newBackend(f, k)
				r := b.r.(*fakeRunner)
				if restart {
					k.link, k.addrs, foreign = true, maps.Clone(want.addrs), nil
					for n, s := range want.sets {
						k.sets[n] = maps.Clone(s)
					}
					r.restored = []string{"the last run's rules"}
				}
				first := map[ipvs.Key]string{}
				isLocal := func(a netip.Addr) bool {
					return k.addrs[a] || foreign[a] || slices.Contains(nodePortAddrs(nd), a)
				}
				check := func() {
					for key := range want.svcs {
						if _, seen := first[key]; seen {
							continue
						}
						if why := k.refusal(f, len(r.restored) > 0, isLocal, key); why != "" {
							first[key] = fmt.Sprintf("after kernel operation %d: %s", k.ops, why)
						}
					}
				}
				k.observe, r.observe = check, check
				check()
				sync(t, b, &proxier.SyncRequest{Full: true, State: st, Node: nd})
				if len(r.restored) == 0 {
					t.Fatal("no rules written")
				}
				for _, key := range slices.SortedFunc(maps.Keys(first), func(a, b ipvs.Key) int { return strings.Compare(a.String(), b.String()) }) {
					t.Errorf("a new connection to %s refused %s", key, first[key])
				}
				if got, w := k.dump(), want.dump(); !slices.Equal(got, w) {
					t.Fatalf("after the sync:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(w, "\n"))
				}
			})
		}
	}
}

// refusal says why a new TCP connection from a local pod to key would not
// reach a real server, with the rules of ruleset in filter INPUT (if rules)
// and the fake's ipsets and IPVS: "" when it would.
func (k *fakeKernel) refusal(f *family.Family, rules bool, isLocal func(netip.Addr) bool, key ipvs.Key) string {
	e := ipvs.Entry{IP: key.Addr, Proto: key.Proto, Port: key.Port}
	in := func(s setID, e ipvs.Entry) bool { return k.sets[setName(f, s)][e] }
	if rules {
		switch {
		case in(setFirewall, e):
			return "" // no source ranges here
		case in(setNoEndpoints, e):
			return "rejected: no endpoints"
		case in(setNoLocal, e):
			return "dropped: no local endpoints"
		case in(setClusterIP, e) || in(setExternal, e) || in(setExternalLocal, e):
			// RETURN: on to IPVS (NO-LOCAL-EXTERNAL returns for local pods)
		case in(setIPs, ipvs.Entry{IP: key.Addr}):
			return "rejected: a Service address without a Service port"
		case in(setReserved, e):
			return "rejected: the other family's NodePort"
		}
	}
	if !isLocal(key.Addr) {
		return "not a local address"
	}
	if _, ok := k.svcs[key]; !ok {
		return "no virtual server (no listener: reset)"
	}
	for _, d := range k.dests[key] {
		if d.Weight > 0 {
			return ""
		}
	}
	return "no real server of weight > 0"
}

// TestExcludeCIDRs: virtual servers in the excluded ranges are never deleted.
func TestExcludeCIDRs(t *testing.T) {
	f := family.IPv4
	k := newFake()
	b := New(f, k, &fakeRunner{}, Options{ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("172.16.0.0/12")},
		Sysctl: func(string, string) error { return nil }, IPSetLoaded: func() bool { return true }})
	keep := ipvs.Key{Addr: netip.MustParseAddr("172.16.0.5"), Proto: 6, Port: 443}
	drop := ipvs.Key{Addr: netip.MustParseAddr("10.200.0.5"), Proto: 6, Port: 443}
	_ = k.AddService(ipvs.Service{Key: keep})
	_ = k.AddService(ipvs.Service{Key: drop})
	sync(t, b, &proxier.SyncRequest{Full: true, State: state(port(f, "web", 10, 1)), Node: node(f)})
	if _, ok := k.svcs[keep]; !ok {
		t.Fatal("full sync deleted a virtual server in --ipvs-exclude-cidrs")
	}
	if _, ok := k.svcs[drop]; ok {
		t.Fatal("full sync kept a virtual server nobody wants outside the excluded ranges")
	}
	if err := b.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ok := k.svcs[keep]; !ok || len(k.svcs) != 1 || len(k.addrs) != 0 || len(k.sets) != 0 || k.link {
		t.Fatalf("after cleanup: %v", k.dump())
	}
}

// TestDrain: a removed TCP real server goes to weight 0 and is deleted only on
// connection counts read after that: one with connections stays until they end
// (a check, Flushed, then deletes it), one without goes in the same sync, and
// one a new process finds at weight 0 is drained too.
func TestDrain(t *testing.T) {
	f := family.IPv4
	k := newFake()
	b := newBackend(f, k)
	sync(t, b, &proxier.SyncRequest{Full: true, State: state(port(f, "web", 10, 1, 2)), Node: node(f)})
	gone := netip.AddrPortFrom(addr(f, "10.64.0.1", ""), 8080)
	k.conns[gone] = 3
	name := portName("web")
	sync(t, b, &proxier.SyncRequest{State: state(port(f, "web", 10, 2)), Changed: []model.ServicePortName{name}, Node: node(f)})
	vs := ipvs.Key{Addr: addr(f, "10.96.0.10", ""), Proto: 6, Port: 80}
	if d, ok := k.dests[vs][gone]; !ok || d.Weight != 0 {
		t.Fatalf("removed real server with connections: %+v (present %v), want weight 0", d, ok)
	}
	if b.Flushed(context.Background()) {
		t.Fatal("Flushed with nothing flushed")
	}
	if _, ok := k.dests[vs][gone]; !ok {
		t.Fatal("drained real server deleted while it has connections")
	}
	// A partial sync of another Service reads no counts of this one: the
	// periodic check does.
	k.reads = 0
	other := port(f, "other", 12, 1)
	sync(t, b, &proxier.SyncRequest{State: state(port(f, "web", 10, 2), other), Changed: []model.ServicePortName{other.Name}, Node: node(f)})
	if k.reads != 0 {
		t.Fatalf("a partial sync of another Service read real servers %d times", k.reads)
	}
	if res := sync(t, b, &proxier.SyncRequest{Full: true, State: state(port(f, "web", 10, 2)), Node: node(f)}); res.Repairs != 0 {
		t.Fatalf("full sync while draining: %d repairs", res.Repairs)
	}
	if _, ok := k.dests[vs][gone]; !ok {
		t.Fatal("full sync deleted a draining real server")
	}
	k.conns[gone] = 0
	// A check that cannot read the counts keeps the drain for the next one.
	k.destsErr = errors.New("netlink: interrupted")
	b.Flushed(context.Background())
	k.destsErr = nil
	if _, ok := k.dests[vs][gone]; !ok {
		t.Fatal("drained real server deleted without a count read")
	}
	b.Flushed(context.Background())
	if _, ok := k.dests[vs][gone]; ok {
		t.Fatal("drained real server without connections not deleted by the check")
	}
	if len(k.lost) > 0 {
		t.Fatalf("real servers deleted on no count read at weight 0: %v", k.lost)
	}
	// One without connections is deleted by the sync that drains it, on counts
	// read after its weight went to 0.
	sync(t, b, &proxier.SyncRequest{State: state(port(f, "web", 10, 1, 2)), Changed: []model.ServicePortName{name}, Node: node(f)})
	sync(t, b, &proxier.SyncRequest{State: state(port(f, "web", 10, 2)), Changed: []model.ServicePortName{name}, Node: node(f)})
	if _, ok := k.dests[vs][gone]; ok || len(k.lost) > 0 {
		t.Fatalf("removed real server without connections: present %v, deleted on no count read at weight 0: %v", ok, k.lost)
	}
	// One at weight 0 already (an earlier process's, or kube-proxy's, drain)
	// is kept while it has connections: a new process adopts the drain.
	_ = k.AddDest(vs, ipvs.Dest{Addr: gone.Addr(), Port: gone.Port(), Weight: 0})
	k.conns[gone] = 2
	b = newBackend(f, k)
	sync(t, b, &proxier.SyncRequest{Full: true, State: state(port(f, "web", 10, 2)), Node: node(f)})
	if _, ok := k.dests[vs][gone]; !ok {
		t.Fatal("a new process deleted a drained real server with connections")
	}
	k.conns[gone] = 0
	b.Flushed(context.Background())
	if _, ok := k.dests[vs][gone]; ok || len(k.lost) > 0 {
		t.Fatalf("adopted drained real server without connections: present %v, deleted on no count read at weight 0: %v", ok, k.lost)
	}
	// UDP and SCTP real servers are not drained, as in kube-proxy.
	k.conns[gone] = 3
	for _, proto := range []v1.Protocol{v1.ProtocolUDP, v1.ProtocolSCTP} {
		p := port(f, "dns", 11, 1, 2)
		p.Protocol = proto
		sync(t, b, &proxier.SyncRequest{Full: true, State: state(p), Node: node(f)})
		p2 := port(f, "dns", 11, 2)
		p2.Protocol = proto
		sync(t, b, &proxier.SyncRequest{State: state(p2), Changed: []model.ServicePortName{p.Name}, Node: node(f)})
		vs := ipvs.Key{Addr: p.ClusterIP, Proto: model.ProtoNumber(proto), Port: 80}
		if _, ok := k.svcs[vs]; !ok {
			t.Fatalf("%s: no virtual server %s", proto, vs)
		}
		if _, ok := k.dests[vs][gone]; ok {
			t.Fatalf("%s real server with connections drained, want deleted", proto)
		}
	}
}

// TestFlushed: a deleted set, dummy link or chain is noticed by the check.
func TestFlushed(t *testing.T) {
	f := family.IPv6
	k := newFake()
	b := newBackend(f, k)
	sync(t, b, &proxier.SyncRequest{Full: true, State: state(port(f, "web", 10, 1)), Node: node(f)})
	if b.Flushed(context.Background()) {
		t.Fatal("Flushed right after a full sync")
	}
	delete(k.sets, setName(f, setLoopBack))
	if !b.Flushed(context.Background()) {
		t.Fatal("a destroyed ipset went unnoticed")
	}
	sync(t, b, &proxier.SyncRequest{Full: true, State: state(port(f, "web", 10, 1)), Node: node(f)})
	clear(k.addrs)
	k.link = false
	if !b.Flushed(context.Background()) {
		t.Fatal("a deleted dummy link went unnoticed")
	}
	sync(t, b, &proxier.SyncRequest{Full: true, State: state(port(f, "web", 10, 1)), Node: node(f)})
	r := b.r.(*fakeRunner)
	r.flushed = true
	if !b.Flushed(context.Background()) {
		t.Fatal("emptied iptables tables went unnoticed")
	}
	// When iptables-save fails, the chains' presence is still checked.
	r.saveErr = errors.New("iptables-save: killed")
	if !b.Flushed(context.Background()) {
		t.Fatal("emptied iptables tables went unnoticed while iptables-save fails")
	}
	r.flushed = false
	if b.Flushed(context.Background()) {
		t.Fatal("Flushed with the chains there while iptables-save fails")
	}
	r.saveErr = nil
	// iptables -D of a jump, and a chain's rule deleted or edited: kube-proxy's
	// IPVS mode writes its rules again at every sync.
	for _, tc := range []struct {
		name   string
		repair bool // the full sync counts a repair
		tamper func()
	}{
		{"iptables -D of the nat OUTPUT jump", true, func() {
			for k := range r.jumps {
				if strings.HasPrefix(k, "nat OUTPUT ") {
					delete(r.jumps, k)
				}
			}
		}},
		{"iptables -F of a chain", true, func() {
			last := &r.restored[len(r.restored)-1]
			*last = strings.Join(slices.DeleteFunc(strings.Split(*last, "\n"), func(l string) bool {
				return strings.HasPrefix(l, "-A "+chainPostrouting+" ")
			}), "\n")
		}},
	} {
		sync(t, b, &proxier.SyncRequest{Full: true, State: state(port(f, "web", 10, 1)), Node: node(f)})
		if b.Flushed(context.Background()) {
			t.Fatalf("%s: Flushed right after a full sync", tc.name)
		}
		before, _ := r.Save(context.Background(), "")
		tc.tamper()
		if after, _ := r.Save(context.Background(), ""); after == before {
			t.Fatalf("%s: the tampering changed nothing", tc.name)
		}
		if !b.Flushed(context.Background()) {
			t.Errorf("%s went unnoticed", tc.name)
		}
		if res := sync(t, b, &proxier.SyncRequest{Full: true, State: state(port(f, "web", 10, 1)), Node: node(f)}); tc.repair && res.Repairs == 0 {
			t.Errorf("%s: the full sync counted no repair", tc.name)
		}
		if b.Flushed(context.Background()) {
			t.Errorf("%s: still flushed after the full sync", tc.name)
		}
	}
}

// TestFlushedDestsWindow: each periodic check reads the real servers of at
// most destChecks virtual servers, the next ones after the last check's, so a
// real server deleted by hand is seen within ceil(virtual servers /
// destChecks) checks.
func TestFlushedDestsWindow(t *testing.T) {
	defer func(n int) { destChecks = n }(destChecks)
	destChecks = 2
	f := family.IPv4
	k := newFake()
	b := newBackend(f, k)
	var ports []*model.PortState
	for i := range 5 {
		ports = append(ports, port(f, fmt.Sprintf("web%d", i), 10+i, 1+i))
	}
	sync(t, b, &proxier.SyncRequest{Full: true, State: state(ports...), Node: node(f)})
	vs := len(b.have)
	checks := (vs + destChecks - 1) / destChecks
	for i := range 2 * checks {
		k.reads = 0
		if b.Flushed(context.Background()) {
			t.Fatalf("check %d: Flushed on an untouched kernel", i)
		}
		if k.reads > destChecks {
			t.Fatalf("check %d read the real servers of %d virtual servers, want at most %d", i, k.reads, destChecks)
		}
	}
	// Each virtual server in turn loses its real servers; a check finds it
	// within ceil(vs / destChecks) checks, however the window lies.
	for key := range b.have {
		if len(k.dests[key]) == 0 {
			continue
		}
		saved := maps.Clone(k.dests[key])
		clear(k.dests[key])
		seen := 0
		for i := 1; i <= checks; i++ {
			if b.Flushed(context.Background()) {
				seen = i
				break
			}
		}
		if seen == 0 {
			t.Errorf("%s lost its real servers, unnoticed in %d checks", key, checks)
		}
		k.dests[key] = saved
	}
}

// TestFlushedDrift: what someone else's ipvsadm, ip or ipset deletes of
// dsproxy's state is noticed by the periodic check (kube-proxy's IPVS mode
// reconciles it at every sync), and the full sync that follows repairs it;
// someone else's virtual server coming or going is not dsproxy's concern.
func TestFlushedDrift(t *testing.T) {
	for _, f := range family.All {
		web := port(f, "web", 10, 1)
		vip := web.ClusterIP
		for _, tc := range []struct {
			name   string
			tamper func(k *fakeKernel)
		}{
			{"ipvsadm -D of the ClusterIP's virtual server", func(k *fakeKernel) {
				for key := range k.svcs {
					if key.Addr == vip {
						delete(k.svcs, key)
						delete(k.dests, key)
					}
				}
			}},
			{"ipvsadm -C", func(k *fakeKernel) { clear(k.svcs); clear(k.dests) }},
			{"ipvsadm -E of the ClusterIP's scheduler and persistence", func(k *fakeKernel) {
				for key, s := range k.svcs {
					if key.Addr == vip {
						s.Scheduler, s.Persistent, s.Timeout = "wrr", true, 300
						k.svcs[key] = s
					}
				}
			}},
			{"ipvsadm -d of the ClusterIP's real server", func(k *fakeKernel) {
				for key := range k.svcs {
					if key.Addr == vip {
						clear(k.dests[key])
					}
				}
			}},
			{"ipvsadm -e -w 5 of the ClusterIP's real server", func(k *fakeKernel) {
				for key := range k.svcs {
					if key.Addr == vip {
						for a, d := range k.dests[key] {
							d.Weight = 5
							k.dests[key][a] = d
						}
					}
				}
			}},
			{"ip addr del of the ClusterIP", func(k *fakeKernel) { delete(k.addrs, vip) }},
			{"ipset del of the ClusterIP's member", func(k *fakeKernel) {
				for e := range k.sets[setName(f, setClusterIP)] {
					if e.IP == vip {
						delete(k.sets[setName(f, setClusterIP)], e)
					}
				}
			}},
		} {
			k := newFake()
			b := newBackend(f, k)
			st := state(port(f, "web", 10, 1))
			sync(t, b, &proxier.SyncRequest{Full: true, State: st, Node: node(f)})
			want := k.dump()
			if b.Flushed(context.Background()) {
				t.Fatalf("%s: Flushed right after a full sync", f)
			}
			tc.tamper(k)
			if slices.Equal(k.dump(), want) {
				t.Fatalf("%s, %s: the tampering changed nothing", f, tc.name)
			}
			if !b.Flushed(context.Background()) {
				t.Errorf("%s, %s: went unnoticed", f, tc.name)
				continue
			}
			if res := sync(t, b, &proxier.SyncRequest{Full: true, State: st, Node: node(f)}); res.Repairs == 0 {
				t.Errorf("%s, %s: the full sync counted no repair", f, tc.name)
			}
			if got := k.dump(); !slices.Equal(got, want) {
				t.Errorf("%s, %s: after the full sync:\n%s\nwant\n%s", f, tc.name, strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if b.Flushed(context.Background()) {
				t.Errorf("%s, %s: still flushed after the repair", f, tc.name)
			}
		}
		// Another program's new virtual server is for the full sync to handle.
		k := newFake()
		b := newBackend(f, k)
		sync(t, b, &proxier.SyncRequest{Full: true, State: state(port(f, "web", 10, 1)), Node: node(f)})
		other := ipvs.Service{Key: ipvs.Key{Addr: port(f, "other", 99).ClusterIP, Proto: 6, Port: 80}}
		k.svcs[other.Key] = other
		if b.Flushed(context.Background()) {
			t.Errorf("%s: another program's new virtual server read as drift", f)
		}
	}
}

// TestReservedNodePortsPartial: a change of the other family's reserved
// NodePorts changes members only, without a full sync.
func TestReservedNodePortsPartial(t *testing.T) {
	f := family.IPv4
	k := newFake()
	b := newBackend(f, k)
	st := state(port(f, "web", 10, 1))
	sync(t, b, &proxier.SyncRequest{Full: true, State: st, Node: node(f)})
	n := node(f)
	n.ReservedNodePorts = []nodeport.Key{{Protocol: v1.ProtocolUDP, Port: 30500}}
	k.ops = 0
	res := sync(t, b, &proxier.SyncRequest{State: st, Node: n, NodeChanged: true})
	if res.Transactions != 0 || k.ops != 2 {
		t.Fatalf("reserving one NodePort: %d iptables transactions, %d kernel operations; want 0 and 2 (one member per NodePort address)", res.Transactions, k.ops)
	}
	if !k.sets[setName(f, setReserved)][ipvs.Entry{IP: addr(f, "192.0.2.1", ""), Proto: 17, Port: 30500}] {
		t.Fatalf("reserved NodePort missing: %v", k.dump())
	}
}

// TestRuleset checks the node settings' effect on the iptables rules.
func TestRuleset(t *testing.T) {
	n := node(family.IPv6)
	rs := ruleset(n, 14, true, false)
	for _, want := range []string{
		"-A DSIPVS-SERVICES -m set --match-set DSIPVS6-CLUSTER-IP dst,dst -j DSIPVS-MASQ-NONLOCAL",
		"-A DSIPVS-MASQ-NONLOCAL -s fd00:64::/48 -j RETURN",
		"-A DSIPVS-MARK-MASQ -j MARK --or-mark 0x4000",
		"-A DSIPVS-POSTROUTING -j MASQUERADE --random-fully",
		"-A DSIPVS-FORWARD -d fd00:96::/112 -m set ! --match-set DSIPVS6-IPS dst -j DROP",
		"-A DSIPVS-FORWARD -m conntrack --ctstate INVALID -j DROP",
		"-A DSIPVS-FIREWALL-OUTPUT -m conntrack --ctstate NEW -m set --match-set DSIPVS6-FIREWALL dst,dst -m set ! --match-set DSIPVS6-SOURCE-RANGES dst,dst,src -j DROP",
		"-A DSIPVS-INPUT -m conntrack --ctstate NEW -m set --match-set DSIPVS6-NO-LOCAL-EXTERNAL dst,dst -j DSIPVS-NO-LOCAL-EXTERNAL",
		"-A DSIPVS-INPUT -m conntrack --ctstate NEW -m set --match-set DSIPVS6-NO-ENDPOINTS dst,dst -p tcp -j REJECT --reject-with tcp-reset",
		"-A DSIPVS-OUTPUT -m conntrack --ctstate NEW -m set --match-set DSIPVS6-NO-ENDPOINTS dst,dst -j REJECT",
		"-A DSIPVS-NO-LOCAL-EXTERNAL -s fd00:64::/48 -j RETURN",
		"-A DSIPVS-NO-LOCAL-EXTERNAL -j DROP",
	} {
		if !strings.Contains(rs, want+"\n") {
			t.Errorf("ruleset lacks %q:\n%s", want, rs)
		}
	}
	if strings.Contains(rs, "10.64.0.0/16") {
		t.Error("IPv6 ruleset matches an IPv4 pod CIDR")
	}
	noDetector := node(family.IPv4)
	noDetector.Local = proxier.LocalDetector{}
	if rs := ruleset(noDetector, 14, true, false); !strings.Contains(rs, "-A DSIPVS-SERVICES -m set --match-set DSIPVS-CLUSTER-IP src,dst -j DSIPVS-MARK-MASQ\n") {
		t.Errorf("no local-traffic detector: the node's connections from a ClusterIP source are not masqueraded:\n%s", rs)
	}
	n.MasqueradeAll = true
	if rs := ruleset(n, 3, false, false); !strings.Contains(rs, "-A DSIPVS-SERVICES -m set --match-set DSIPVS6-CLUSTER-IP dst,dst -j DSIPVS-MARK-MASQ\n") ||
		!strings.Contains(rs, "--or-mark 0x8\n") {
		t.Errorf("masqueradeAll, bit 3:\n%s", rs)
	}
	if rs := ruleset(n, 14, true, true); strings.Contains(rs, "INVALID") {
		t.Errorf("with nf_conntrack_tcp_be_liberal, invalid packets are still dropped:\n%s", rs)
	}
}

// unicastForLinux is the fake kernel's own reading of what IPVS takes as a real
// server (inet_addr_type RTN_UNICAST or RTN_LOCAL; ipv6_addr_type unicast): not
// multicast, the limited broadcast or unspecified.
func unicastForLinux(a netip.Addr) bool {
	return !a.IsMulticast() && !a.IsUnspecified() && a.String() != "255.255.255.255"
}

// An ExternalIP or VIP that is multicast, or an endpoint that is not unicast, is
// valid in the API but refused by the kernel: it is left out, and everything else
// is served, instead of every sync of the family failing on it.
func TestNotUnicastLeftOut(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			k := newFake()
			b := newBackend(f, k)
			bad := port(f, "bad", 10, 1, 2)
			mcast := addr(f, "239.1.1.1", "ff05::1")
			bad.ExternalIPs = []netip.Addr{mcast, addr(f, "203.0.113.1", "2001:db8:7::1")}
			bad.LoadBalancerVIPs = []netip.Addr{addr(f, "239.1.1.2", "ff0e::2")}
			for _, a := range []netip.Addr{addr(f, "224.0.1.5", "ff05::5"), addr(f, "255.255.255.255", "::")} {
				bad.Cluster = append(bad.Cluster, model.Endpoint{Addr: a, Port: 8080, Ready: true, Serving: true})
			}
			good := port(f, "good", 11, 3)
			for i, full := range []bool{true, false, true} {
				req := &proxier.SyncRequest{Full: full, State: state(bad, good), Node: node(f)}
				if !full {
					req.Changed = []model.ServicePortName{bad.Name}
				}
				if _, err := b.Sync(context.Background(), req); err != nil {
					t.Fatalf("sync %d: %v", i, err)
				}
			}
			if k.addrs[mcast] {
				t.Errorf("multicast ExternalIP %s bound", mcast)
			}
			for key := range k.svcs {
				if !unicastForLinux(key.Addr) {
					t.Errorf("virtual server on %s", key)
				}
			}
			want := map[string][]string{
				"bad ClusterIP":  {addr(f, "10.64.0.1", "fd00:64::1").String(), addr(f, "10.64.0.2", "fd00:64::2").String()},
				"bad ExternalIP": {addr(f, "10.64.0.1", "fd00:64::1").String(), addr(f, "10.64.0.2", "fd00:64::2").String()},
				"good ClusterIP": {addr(f, "10.64.0.3", "fd00:64::3").String()},
			}
			keys := map[string]ipvs.Key{
				"bad ClusterIP":  {Addr: bad.ClusterIP, Proto: 6, Port: 80},
				"bad ExternalIP": {Addr: bad.ExternalIPs[1], Proto: 6, Port: 80},
				"good ClusterIP": {Addr: good.ClusterIP, Proto: 6, Port: 80},
			}
			for what, key := range keys {
				var got []string
				for ap := range k.dests[key] {
					got = append(got, ap.Addr().String())
				}
				slices.Sort(got)
				if !slices.Equal(got, want[what]) {
					t.Errorf("%s %s: real servers %v, want %v", what, key, got, want[what])
				}
			}
		})
	}
}

// The IPVS mode's sysctls are kube-proxy's: ip_forward on, and conn_reuse_mode
// 0 on the kernels (4.1 to 5.8) with the one-second delay on reused ports.
func TestSysctls(t *testing.T) {
	if !slices.Contains(Sysctls(family.IPv4, false), [2]string{"net/ipv4/ip_forward", "1"}) {
		t.Errorf("no ip_forward in %v", Sysctls(family.IPv4, false))
	}
	for rel, want := range map[string]bool{
		"4.0.9": false, "4.1.0": true, "4.18.0-553.el8_10.x86_64": true, "5.8.18": true,
		"5.9.0": false, "6.1.0-28-amd64": false, "5.10": false, "": false, "x.y": false,
	} {
		if got := connReuseModeFix(rel); got != want {
			t.Errorf("kernel %q: conn_reuse_mode fix %v, want %v", rel, got, want)
		}
	}
}

// An ExternalIP or VIP that is one of the node's own addresses (k3s' ServiceLB
// writes node IPs into the load balancer status) is served but neither bound on
// the dummy link nor in IPS, as kube-proxy does: in IPS the INPUT rules refuse
// new connections to every other port of it (ssh, the kubelet).
func TestNodeAddressNotBound(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			k := newFake()
			b := newBackend(f, k)
			n := node(f)
			own, other := n.NodePortAddresses.Addrs[0], addr(f, "203.0.113.9", "2001:db8:9::9")
			ps := port(f, "web", 10, 1)
			ps.ExternalIPs = []netip.Addr{own}
			ps.LoadBalancerVIPs = []netip.Addr{other}
			sync(t, b, &proxier.SyncRequest{Full: true, State: state(ps), Node: n})
			ips := k.sets[setName(f, setIPs)]
			if k.addrs[own] || ips[ipvs.Entry{IP: own}] {
				t.Errorf("node address %s: bound %v, in IPS %v", own, k.addrs[own], ips[ipvs.Entry{IP: own}])
			}
			if !k.addrs[other] || !ips[ipvs.Entry{IP: other}] {
				t.Errorf("VIP %s: bound %v, in IPS %v, want both", other, k.addrs[other], ips[ipvs.Entry{IP: other}])
			}
			if _, ok := k.svcs[ipvs.Key{Addr: own, Proto: 6, Port: ps.Port}]; !ok {
				t.Errorf("no virtual server on the node address %s", own)
			}
		})
	}
}

// The health check node port answers on the Service's VIP too (some load
// balancers probe the VIP), as kube-proxy's IPVS mode lets it through on every
// address; before, the VIP being in IPS, the INPUT rules refused it.
func TestHealthCheckOnVIP(t *testing.T) {
	for _, f := range family.All {
		ps := port(f, "web", 10, 1)
		vip := addr(f, "203.0.113.2", "2001:db8:2::2")
		ps.LoadBalancerVIPs, ps.HealthCheckNodePort, ps.NodePort = []netip.Addr{vip}, 32000, 30010
		n := node(f)
		o := render(ps, n, "rr")
		for _, a := range []netip.Addr{vip, n.NodePortAddresses.Addrs[0]} {
			if !slices.Contains(o.members, member{setHealthCheck, ipvs.Entry{IP: a, Proto: 6, Port: 32000}}) {
				t.Errorf("%s: %s:32000 not in HEALTH-CHECK: %v", f, a, o.members)
			}
		}
	}
}

// A TCP port that loses its last endpoint keeps its virtual server while its
// connections drain, as kube-proxy keeps it: the real server at weight 0 (new
// connections are refused by the NEW-only filter rules), then the periodic check
// deletes both once the connections are gone. Without connections it goes at
// once; so does a UDP one.
func TestLastEndpointDrains(t *testing.T) {
	f := family.IPv4
	k := newFake()
	b := newBackend(f, k)
	name := portName("web")
	sync(t, b, &proxier.SyncRequest{Full: true, State: state(port(f, "web", 10, 1)), Node: node(f)})
	ep := netip.AddrPortFrom(addr(f, "10.64.0.1", ""), 8080)
	vs := ipvs.Key{Addr: addr(f, "10.96.0.10", ""), Proto: 6, Port: 80}
	k.conns[ep] = 5
	sync(t, b, &proxier.SyncRequest{State: state(port(f, "web", 10)), Changed: []model.ServicePortName{name}, Node: node(f)})
	if _, ok := k.svcs[vs]; !ok {
		t.Fatal("virtual server deleted with 5 connections on its real server")
	}
	if d, ok := k.dests[vs][ep]; !ok || d.Weight != 0 {
		t.Fatalf("real server %+v (present %v), want weight 0", d, ok)
	}
	if !k.sets[setName(f, setNoEndpoints)][ipvs.Entry{IP: vs.Addr, Proto: 6, Port: 80}] {
		t.Error("port without endpoints not in NO-ENDPOINTS: new connections are not refused")
	}
	if res := sync(t, b, &proxier.SyncRequest{Full: true, State: state(port(f, "web", 10)), Node: node(f)}); res.Repairs != 0 {
		t.Fatalf("full sync while draining: %d repairs", res.Repairs)
	}
	if _, ok := k.svcs[vs]; !ok {
		t.Fatal("full sync deleted the draining virtual server")
	}
	// The endpoint comes back while draining: served again at weight 1.
	sync(t, b, &proxier.SyncRequest{State: state(port(f, "web", 10, 1)), Changed: []model.ServicePortName{name}, Node: node(f)})
	if d := k.dests[vs][ep]; d.Weight != 1 {
		t.Fatalf("endpoint back: weight %d, want 1", d.Weight)
	}
	sync(t, b, &proxier.SyncRequest{State: state(port(f, "web", 10)), Changed: []model.ServicePortName{name}, Node: node(f)})
	k.conns[ep] = 0
	// A check whose delete fails leaves it for the next.
	k.delSvcErr = errors.New("netlink: interrupted")
	b.Flushed(context.Background())
	k.delSvcErr = nil
	if _, ok := k.svcs[vs]; !ok {
		t.Fatal("the fake deleted a virtual server it refused to")
	}
	b.Flushed(context.Background())
	if _, ok := k.svcs[vs]; ok {
		t.Fatal("drained virtual server without connections not deleted by the check")
	}
	if len(k.lost) > 0 {
		t.Fatalf("real servers deleted on no count read at weight 0: %v", k.lost)
	}
	if res := sync(t, b, &proxier.SyncRequest{Full: true, State: state(port(f, "web", 10)), Node: node(f)}); res.Repairs != 0 {
		t.Fatalf("full sync after the drain: %d repairs", res.Repairs)
	}
	// Without connections: deleted by the sync.
	sync(t, b, &proxier.SyncRequest{State: state(port(f, "web", 10, 1)), Changed: []model.ServicePortName{name}, Node: node(f)})
	sync(t, b, &proxier.SyncRequest{State: state(port(f, "web", 10)), Changed: []model.ServicePortName{name}, Node: node(f)})
	if _, ok := k.svcs[vs]; ok {
		t.Fatal("virtual server without connections kept")
	}
	// A Service deleted with connections: its virtual servers go at once, as
	// in kube-proxy (its addresses go too, so nothing would reach them).
	sync(t, b, &proxier.SyncRequest{State: state(port(f, "web", 10, 1)), Changed: []model.ServicePortName{name}, Node: node(f)})
	k.conns[ep] = 5
	sync(t, b, &proxier.SyncRequest{State: state(), Changed: []model.ServicePortName{name}, Node: node(f)})
	if _, ok := k.svcs[vs]; ok {
		t.Fatal("the virtual server of a deleted Service kept")
	}
	if len(b.draining) != 0 || len(b.have) != 0 {
		t.Fatalf("state left after the Service went: draining %v, have %v", b.draining, b.have)
	}
}

// With --ipvs-scheduler=mh the virtual servers hash the source port too, and
// one an older dsproxy made without (read back from the kernel's flags) is
// updated by the full sync.
func TestSchedulerMHHashesPort(t *testing.T) {
	f := family.IPv4
	k := newFake()
	ps := port(f, "web", 10, 1)
	key := ipvs.Key{Addr: ps.ClusterIP, Proto: 6, Port: ps.Port}
	if err := k.AddService(ipvs.Service{Key: key, Scheduler: "mh"}); err != nil {
		t.Fatal(err)
	}
	b := New(f, k, &fakeRunner{}, Options{MasqueradeBit: 14, Scheduler: "mh", Sysctl: func(string, string) error { return nil }})
	sync(t, b, &proxier.SyncRequest{Full: true, State: state(ps), Node: node(f)})
	if s := k.svcs[key]; !s.HashPort || s.Scheduler != "mh" {
		t.Errorf("virtual server %+v: want mh hashing the source port", s)
	}
}

// A load balancer's status may name a link-local VIP (the API server takes
// any IP there). An IPv4 one is bound and served, and read back as bound; an
// IPv6 one is left out, since the link's own fe80:: addresses are not read
// back. Either way the periodic check finds no drift after the full sync, so
// it does not turn every check into another full sync.
func TestLinkLocalVIPNoDrift(t *testing.T) {
	for _, f := range family.All {
		k := newFake()
		b := newBackend(f, k)
		lb := port(f, "lb", 10, 1)
		vip := addr(f, "169.254.10.10", "fe80::10")
		lb.LoadBalancerVIPs = []netip.Addr{vip}
		st := state(lb)
		sync(t, b, &proxier.SyncRequest{Full: true, State: st, Node: node(f)})
		served := slices.ContainsFunc(slices.Collect(maps.Keys(k.svcs)), func(key ipvs.Key) bool { return key.Addr == vip })
		if want := f == family.IPv4; served != want || k.addrs[vip] != want {
			t.Errorf("%s: VIP %s served %v, bound %v; want %v", f, vip, served, k.addrs[vip], want)
		}
		for i := range 3 {
			if b.Flushed(context.Background()) {
				t.Fatalf("%s: check %d after the full sync found drift", f, i)
			}
		}
	}
}
