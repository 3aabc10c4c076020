package iptables

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/dsproxy/dsproxy/internal/porttest"
	"github.com/dsproxy/dsproxy/pkg/family"
	ipt "github.com/dsproxy/dsproxy/pkg/iptables"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nfacct"
	"github.com/dsproxy/dsproxy/pkg/nodeport"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// fakeRunner records what the backend asks of the iptables tools.
type fakeRunner struct {
	restores []string
	save     string          // what Save returns for any table
	jumps    map[string]bool // rules EnsureRule has seen, by table/chain/rule
	fail     error           // returned by the next Restore
	failAt   int             // if positive, the failAt-th Restore from now fails
	flushed  bool            // ChainExists reports every chain gone
}

func (r *fakeRunner) ChainExists(string, string) (bool, error) { return !r.flushed, nil }

func (r *fakeRunner) Restore(_ context.Context, data []byte) error {
	if err := r.fail; err != nil {
		r.fail = nil
		return err
	}
	if r.failAt > 0 {
		if r.failAt--; r.failAt == 0 {
			return errors.New("restore failed")
		}
	}
	// iptables-restore --noflush refuses a chain declared twice in one input
	// ("CHAIN_USER_ADD failed (File exists)"): every sync of every test is held
	// to that.
	table, seen := "", map[string]bool{}
	for line := range strings.SplitSeq(string(data), "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table = line
		case strings.HasPrefix(line, ":"):
			k := table + " " + strings.Fields(line[1:])[0]
			if seen[k] {
				return fmt.Errorf("%s declared twice:\n%s", k, data)
			}
			seen[k] = true
		}
	}
	r.restores = append(r.restores, string(data))
	return nil
}

func (r *fakeRunner) Save(context.Context, string) (string, error) { return r.save, nil }

// RuleCounts counts in save, as the real runner's legacy flavour does; with
// flushed every chain is gone. (kernelModel counts what the restores wrote.)
func (r *fakeRunner) RuleCounts(_ context.Context, table string, chains []string) (map[string]int, error) {
	if r.flushed {
		return map[string]int{}, nil
	}
	return ipt.CountRules(r.save, table, chains), nil
}

func (r *fakeRunner) EnsureRule(table, chain string, rule ...string) (bool, error) {
	if r.jumps == nil {
		r.jumps = map[string]bool{}
	}
	k := table + "/" + chain + "/" + strings.Join(rule, " ")
	if r.jumps[k] {
		return false, nil
	}
	r.jumps[k] = true
	return true, nil
}

func (r *fakeRunner) HasRandomFully() bool { return true }

func (r *fakeRunner) last() string { return r.restores[len(r.restores)-1] }

// The unit tests' service ports, states and node (internal/porttest).
var (
	portName = porttest.Name
	addr     = porttest.Addr
	port     = porttest.Port
	state    = porttest.State
)

func node(f *family.Family) *proxier.NodeConfig { return porttest.Node(f) }

func newBackend(t *testing.T, f *family.Family) (*Backend, *fakeRunner) {
	t.Helper()
	r := &fakeRunner{}
	b, err := New(f, r, Options{MasqueradeBit: 14})
	if err != nil {
		t.Fatal(err)
	}
	return b, r
}

func sync(t *testing.T, b *Backend, req *proxier.SyncRequest) proxier.SyncResult {
	t.Helper()
	res, err := b.Sync(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

var declRE = regexp.MustCompile(`(?m)^:(\S+) - \[0:0\]$`)

// declared lists the chains a restore input declares (so flushes and rewrites).
func declared(in string) []string {
	var out []string
	for _, m := range declRE.FindAllStringSubmatch(in, -1) {
		out = append(out, m[1])
	}
	return out
}

func perPort(chains []string) []string {
	return slices.DeleteFunc(slices.Clone(chains), func(c string) bool {
		return slices.Contains(natGlobal, c) || slices.Contains(filterGlobal, c) || c == chainCanary
	})
}

// A one-endpoint change rewrites only that port's chain: the dispatch chains are
// untouched. A new port's dispatch rules are inserted and a deleted port's are
// deleted by their spec, with its chains; nothing else is rewritten.
func TestPartialSyncTouchesOnlyChangedPorts(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			b, r := newBackend(t, f)
			a, c, d := port(f, "a", 1, 1, 2), port(f, "c", 2, 3, 4, 5), port(f, "d", 3, 6)
			sync(t, b, &proxier.SyncRequest{Full: true, State: state(a, c, d), Node: node(f), NodeChanged: true})
			sa, sc, sd := shapeOf(a), shapeOf(c), shapeOf(d)
			got, want := perPort(declared(r.last())), slices.Concat(sa.chains(), sc.chains(), sd.chains())
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("first sync declared %v, want every port's chains %v", got, want)
			}
			if len(r.jumps) != len(jumps()) {
				t.Fatalf("first sync ensured %d jumps, want %d", len(r.jumps), len(jumps()))
			}

			c2 := port(f, "c", 2, 3, 4) // endpoint 5 goes
			sync(t, b, &proxier.SyncRequest{State: state(a, c2, d), Changed: []model.ServicePortName{c2.Name}, Node: node(f)})
			in := r.last()
			if got, want := declared(in), []string{svcChain(c.Name)}; !slices.Equal(got, want) {
				t.Errorf("endpoint change declared %v, want only %v:\n%s", got, want, in)
			}
			if n := strings.Count(in, "\n-A ") + strings.Count(in, "\n-I ") + strings.Count(in, "\n-D ") + strings.Count(in, "\n-X "); n != 3 {
				t.Errorf("endpoint change wrote %d rules, want c's masquerade rule and two DNAT rules:\n%s", n, in)
			}

			e := port(f, "e", 4, 7)
			sync(t, b, &proxier.SyncRequest{State: state(a, c2, d, e), Changed: []model.ServicePortName{e.Name}, Node: node(f)})
			in = r.last()
			if !regexp.MustCompile(`(?m)^-I DSPROXY-SERVICES 1 .*-j ` + svcChain(e.Name) + `$`).MatchString(in) {
				t.Errorf("adding port e does not insert its dispatch rule:\n%s", in)
			}
			if slices.Contains(declared(in), chainServices) {
				t.Errorf("adding a port rewrites a whole dispatch chain:\n%s", in)
			}

			sync(t, b, &proxier.SyncRequest{State: state(a, c2, e), Changed: []model.ServicePortName{d.Name}, Node: node(f)})
			in = r.last()
			for _, ch := range sd.chains() {
				if !strings.Contains(in, "-X "+ch+"\n") {
					t.Errorf("deleting port d does not delete %s:\n%s", ch, in)
				}
			}
			if !regexp.MustCompile(`(?m)^-D DSPROXY-SERVICES .*-j ` + svcChain(d.Name) + `$`).MatchString(in) {
				t.Errorf("deleting port d does not delete its dispatch rule:\n%s", in)
			}
			if strings.Contains(in, ":"+chainServices+" ") {
				t.Errorf("deleting a port rewrites a whole dispatch chain:\n%s", in)
			}
		})
	}
}

// A full sync deletes DSPROXY- chains nothing wants (left by an earlier process)
// and counts a missing jump from a built-in chain, and a dispatch chain flushed
// or added to by hand, as a repair.
func TestFullSyncReconciles(t *testing.T) {
	f := family.IPv4
	k := &kernelModel{}
	b, err := New(f, k, Options{MasqueradeBit: 14})
	if err != nil {
		t.Fatal(err)
	}
	a := port(f, "a", 1, 1)
	stale := Prefix + "SVC-STALESTALESTALE"
	k.tables = map[string]map[string][]string{"nat": {stale: {}, chainServices: {"-j " + stale}}}
	res := sync(t, b, &proxier.SyncRequest{Full: true, State: state(a), Node: node(f)})
	if !strings.Contains(k.last(), "-X "+stale+"\n") {
		t.Errorf("full sync keeps a stale chain:\n%s", k.last())
	}
	if strings.Contains(k.last(), "-X "+chainServices+"\n") {
		t.Errorf("full sync deletes a dispatch chain:\n%s", k.last())
	}
	if res.Repairs != 0 {
		t.Errorf("first sync: %d repairs, want 0", res.Repairs)
	}
	if res := sync(t, b, &proxier.SyncRequest{Full: true, State: state(a), Node: node(f)}); res.Repairs != 0 {
		t.Errorf("full sync on an untouched kernel: %d repairs", res.Repairs)
	}
	// What changed since the last sync is no repair: its chains and dispatch
	// rules are compared with what that sync wrote.
	c := port(f, "c", 2, 2, 3)
	c.NodePort = 30002
	if res := sync(t, b, &proxier.SyncRequest{Full: true, State: state(a, c), Node: node(f)}); res.Repairs != 0 {
		t.Errorf("full sync adding a NodePort Service on an untouched kernel: %d repairs", res.Repairs)
	}
	if res := sync(t, b, &proxier.SyncRequest{Full: true, State: state(a), Node: node(f)}); res.Repairs != 0 {
		t.Errorf("full sync deleting a NodePort Service on an untouched kernel: %d repairs", res.Repairs)
	}
	j := jumps()[0]
	delete(k.jumps, j.table+"/"+j.chain+"/"+strings.Join(j.rule, " "))
	if res := sync(t, b, &proxier.SyncRequest{Full: true, State: state(a), Node: node(f)}); res.Repairs != 1 {
		t.Errorf("full sync after a jump was deleted: %d repairs, want 1", res.Repairs)
	}
	k.tables["nat"][chainServices] = nil
	k.tables["filter"][chainForward] = append(k.tables["filter"][chainForward], "-j ACCEPT")
	if res := sync(t, b, &proxier.SyncRequest{Full: true, State: state(a), Node: node(f)}); res.Repairs != 2 {
		t.Errorf("full sync after nat %s was flushed and a rule appended to filter %s: %d repairs, want 2",
			chainServices, chainForward, res.Repairs)
	}
	if n := len(k.tables["nat"][chainServices]); n == 0 {
		t.Errorf("full sync left nat %s empty", chainServices)
	}
}

// After a failed restore the next sync, even a partial one, rewrites everything.
func TestFailureRewritesAll(t *testing.T) {
	f := family.IPv6
	b, r := newBackend(t, f)
	a, c := port(f, "a", 1, 1), port(f, "c", 2, 2)
	sync(t, b, &proxier.SyncRequest{Full: true, State: state(a, c), Node: node(f)})
	r.fail = errors.New("boom")
	if _, err := b.Sync(context.Background(), &proxier.SyncRequest{State: state(a, c), Changed: []model.ServicePortName{a.Name}, Node: node(f)}); err == nil {
		t.Fatal("sync with a failing restore succeeded")
	}
	sync(t, b, &proxier.SyncRequest{State: state(a, c), Changed: []model.ServicePortName{a.Name}, Node: node(f)})
	if !strings.Contains(r.last(), ":"+svcChain(c.Name)+" ") {
		t.Errorf("sync after a failure does not rewrite an unchanged port:\n%s", r.last())
	}
}

// The rules of the behaviours that differ by configuration, read as text.
func TestRules(t *testing.T) {
	type check struct {
		name  string
		f     *family.Family
		ps    func(f *family.Family) *model.PortState
		node  func(n *proxier.NodeConfig)
		opts  Options
		want  []string // regexps that must match a line
		avoid []string // regexps no line may match
	}
	lb := func(f *family.Family) *model.PortState {
		ps := port(f, "lb", 7, 1, 2)
		ps.NodePort = 30007
		ps.LoadBalancerVIPs = []netip.Addr{addr(f, "203.0.113.7", "2001:db8:7::7")}
		ps.SourceRanges = []netip.Prefix{netip.PrefixFrom(addr(f, "198.51.100.0", "2001:db8:c::"), map[int]int{32: 24, 128: 64}[f.BitLen])}
		return ps
	}
	checks := []check{
		{name: "three endpoints spread evenly", f: family.IPv4, ps: func(f *family.Family) *model.PortState { return port(f, "s", 1, 1, 2, 3) },
			want: []string{`^-A DSPROXY-SVC-\S+ .*--probability 0\.3333333333 -j DNAT --to-destination 10\.64\.0\.1:8080$`,
				`--probability 0\.5000000000 -j DNAT --to-destination 10\.64\.0\.2:8080$`,
				`^-A DSPROXY-SVC-\S+ .*"ns/s:p/TCP -> 10\.64\.0\.3:8080" -p tcp -m tcp -j DNAT --to-destination 10\.64\.0\.3:8080$`,
				`^-A DSPROXY-SVC-\S+ .*-d 10\.96\.0\.1/32 -p tcp -m tcp --dport 80 -j DSPROXY-MASQ-NONLOCAL$`,
				`^-A DSPROXY-MASQ-NONLOCAL -s 10\.64\.0\.0/16 -j RETURN$`}},
		{name: "IPv6 DNAT and masquerade chain", f: family.IPv6, ps: func(f *family.Family) *model.PortState { return port(f, "s", 1, 1) },
			want:  []string{`-j DNAT --to-destination \[fd00:64::1\]:8080$`, `^-A DSPROXY-MASQ-NONLOCAL -s fd00:64::/48 -j RETURN$`},
			avoid: []string{`10\.64\.0\.0/16`}},
		{name: "masqueradeAll", f: family.IPv4, ps: func(f *family.Family) *model.PortState { return port(f, "s", 1, 1) },
			node: func(n *proxier.NodeConfig) { n.MasqueradeAll = true },
			want: []string{`^-A DSPROXY-SVC-\S+ .*--dport 80 -j DSPROXY-MARK-MASQ$`}},
		{name: "affinity", f: family.IPv4, ps: func(f *family.Family) *model.PortState {
			ps := port(f, "s", 1, 1, 2)
			ps.AffinitySeconds = 600
			return ps
		}, want: []string{`-m recent --name DSPROXY-SEP-\S+ --update --seconds 600 --reap -j DNAT --to-destination 10\.64\.0\.1:8080$`,
			`--probability 0\.5000000000 -m recent --name DSPROXY-SEP-\S+ --set -j DNAT --to-destination 10\.64\.0\.1:8080$`}},
		{name: "local endpoints get a chain: hairpin, affinity", f: family.IPv4, ps: func(f *family.Family) *model.PortState {
			ps := port(f, "s", 1, 1, 2)
			ps.Cluster[0].Local = true
			ps.AffinitySeconds = 60
			return ps
		}, want: []string{`^-A DSPROXY-SEP-\S+ .*-s 10\.64\.0\.1/32 -j DSPROXY-MARK-MASQ$`,
			`^-A DSPROXY-SEP-\S+ .*-p tcp -m tcp -m recent --name DSPROXY-SEP-\S+ --set -j DNAT --to-destination 10\.64\.0\.1:8080$`,
			`^-A DSPROXY-SVC-\S+ .*-m recent --name DSPROXY-SEP-\S+ --rcheck --seconds 60 --reap -j DSPROXY-SEP-\S+$`,
			`^-A DSPROXY-SVC-\S+ .*--probability 0\.5000000000 -j DSPROXY-SEP-\S+$`,
			`^-A DSPROXY-SVC-\S+ .*-m recent --name DSPROXY-SEP-\S+ --set -j DNAT --to-destination 10\.64\.0\.2:8080$`},
			avoid: []string{`-s 10\.64\.0\.2/32`, `^-A DSPROXY-SVC-.*DNAT --to-destination 10\.64\.0\.1:8080$`}},
		{name: "an endpoint without a node name gets a chain: hairpin", f: family.IPv4, ps: func(f *family.Family) *model.PortState {
			ps := port(f, "s", 1, 1, 2)
			ps.Cluster[0].NoNodeName = true
			return ps
		}, want: []string{`^-A DSPROXY-SEP-\S+ .*-s 10\.64\.0\.1/32 -j DSPROXY-MARK-MASQ$`},
			avoid: []string{`-s 10\.64\.0\.2/32`}},
		{name: "no endpoints rejects, TCP with a reset", f: family.IPv4, ps: func(f *family.Family) *model.PortState { return port(f, "s", 1) },
			want:  []string{`^-A DSPROXY-SERVICES .*-d 10\.96\.0\.1/32 -p tcp -m tcp --dport 80 -j REJECT --reject-with tcp-reset$`},
			avoid: []string{`-j DSPROXY-SVC-`}},
		{name: "service CIDR and other ports", f: family.IPv6, ps: func(f *family.Family) *model.PortState { return port(f, "s", 1, 1) },
			want: []string{`^-A DSPROXY-SERVICE-CIDRS .*-d fd00:96::1/128 ! -p tcp -j REJECT$`, `^-A DSPROXY-SERVICES .*-d fd00:96::/112 -j DSPROXY-SERVICE-CIDRS$`,
				`^-A DSPROXY-SERVICE-CIDRS .*unallocated service address" -j DROP$`},
			avoid: []string{`^-A DSPROXY-SERVICES .*-d fd00:96::1/128 -j REJECT`}},
		{name: "ClusterIP outside the service CIDRs", f: family.IPv4, ps: func(f *family.Family) *model.PortState { return port(f, "s", 1, 1) },
			node: func(n *proxier.NodeConfig) { n.ServiceCIDRs = nil },
			want: []string{`^-A DSPROXY-CLUSTER-IPS .*-d 10\.96\.0\.1/32 -p tcp -j REJECT --reject-with tcp-reset$`, `^-A DSPROXY-CLUSTER-IPS .*-d 10\.96\.0\.1/32 ! -p tcp -j REJECT$`,
				`^-A DSPROXY-SERVICES -j DSPROXY-CLUSTER-IPS$`}},
		{name: "load balancer source ranges", f: family.IPv4, ps: lb,
			want: []string{`^-A DSPROXY-SERVICES .*-d 203\.0\.113\.7/32 -p tcp -m tcp --dport 80 -j DSPROXY-FW-`,
				`^-A DSPROXY-FW-\S+ .*-s 198\.51\.100\.0/24 -j DSPROXY-EXT-`,
				`^-A DSPROXY-PROXY-FIREWALL .*-d 203\.0\.113\.7/32 -p tcp -m tcp --dport 80 -j DROP$`,
				`^-A DSPROXY-NODEPORTS .*--dport 30007 -j DSPROXY-EXT-`,
				`^-A DSPROXY-EXT-\S+ .*-j DSPROXY-MARK-MASQ$`,
				`^-A DSPROXY-SERVICES .*! -d 127\.0\.0\.0/8 -m addrtype --dst-type LOCAL -j DSPROXY-NODEPORTS$`}},
		{name: "ETP Local without local endpoints", f: family.IPv6, ps: func(f *family.Family) *model.PortState {
			ps := lb(f)
			ps.ExternalPolicyLocal = true
			return ps
		}, want: []string{`^-A DSPROXY-EXT-\S+ .*-s fd00:64::/48 -j DSPROXY-SVC-`,
			`^-A DSPROXY-EXT-\S+ .*-m addrtype --src-type LOCAL -j DSPROXY-MARK-MASQ$`,
			// On every local address, ::1 included, as kube-proxy's.
			`^-A DSPROXY-EXTERNAL-SERVICES .*" -m addrtype --dst-type LOCAL -p tcp -m tcp --dport 30007 -j DROP$`,
			// A pod of another node short-circuited to itself is masqueraded.
			`^-A DSPROXY-SEP-\S+ .*-s fd00:64::1/128 -j DSPROXY-MARK-MASQ$`,
			`^-A DSPROXY-SEP-\S+ .*-s fd00:64::2/128 -j DSPROXY-MARK-MASQ$`,
			`^-A DSPROXY-SVC-\S+ .*--probability 0\.5000000000 -j DSPROXY-SEP-\S+$`},
			avoid: []string{`-j DSPROXY-SVL-`, `^-A DSPROXY-SVC-.*-j DNAT`}},
		{name: "reserved NodePort of the other family", f: family.IPv4, ps: func(f *family.Family) *model.PortState { return port(f, "s", 1, 1) },
			node: func(n *proxier.NodeConfig) {
				n.ReservedNodePorts = []nodeport.Key{{Protocol: v1.ProtocolUDP, Port: 30500}}
				n.NodePortAddresses = nodeport.Addresses{Family: n.Family, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}
			},
			want: []string{`^-A DSPROXY-EXTERNAL-SERVICES .*-d 192\.0\.2\.1/32 -p udp -m udp --dport 30500 -j REJECT$`,
				`^-A DSPROXY-SERVICES .*-d 192\.0\.2\.1/32 -j DSPROXY-NODEPORTS$`}},
		{name: "invalid packets dropped", f: family.IPv6, ps: func(f *family.Family) *model.PortState { return port(f, "s", 1, 1) },
			want: []string{`^-A DSPROXY-FORWARD -m conntrack --ctstate INVALID -j DROP$`}},
		{name: "nf_conntrack_tcp_be_liberal: invalid packets pass", f: family.IPv4, ps: func(f *family.Family) *model.PortState { return port(f, "s", 1, 1) },
			opts:  Options{TCPBeLiberal: true},
			want:  []string{`^-A DSPROXY-FORWARD .*--ctstate RELATED,ESTABLISHED -j ACCEPT$`},
			avoid: []string{`INVALID`}},
		{name: "nfacct counter on the invalid drop", f: family.IPv6, ps: func(f *family.Family) *model.PortState { return port(f, "s", 1, 1) },
			opts:  Options{NFAcct: nfacct.NewFake()},
			want:  []string{`^-A DSPROXY-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP$`},
			avoid: []string{`localhost_nps_accepted_pkts`}},
		{name: "nfacct unavailable", f: family.IPv4, ps: func(f *family.Family) *model.PortState { return port(f, "s", 1, 1) },
			opts:  Options{NFAcct: &nfacct.Fake{Err: errors.New("no nfnetlink_acct")}},
			want:  []string{`^-A DSPROXY-FORWARD -m conntrack --ctstate INVALID -j DROP$`},
			avoid: []string{`nfacct`}},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			r := &fakeRunner{}
			c.opts.MasqueradeBit = 14
			b, err := New(c.f, r, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			n := node(c.f)
			if c.node != nil {
				c.node(n)
			}
			sync(t, b, &proxier.SyncRequest{Full: true, State: state(c.ps(c.f)), Node: n})
			lines := strings.Split(r.last(), "\n")
			for _, w := range c.want {
				re := regexp.MustCompile(w)
				if !slices.ContainsFunc(lines, re.MatchString) {
					t.Errorf("no line matches %s in:\n%s", w, r.last())
				}
			}
			for _, a := range c.avoid {
				re := regexp.MustCompile(a)
				if i := slices.IndexFunc(lines, re.MatchString); i >= 0 {
					t.Errorf("line %q matches %s", lines[i], a)
				}
			}
		})
	}
}

// The rule totals a partial sync reports equal what a full sync of the same state
// writes.
func TestRuleTotals(t *testing.T) {
	f := family.IPv4
	b, _ := newBackend(t, f)
	a, c := port(f, "a", 1, 1, 2), port(f, "c", 2, 3)
	sync(t, b, &proxier.SyncRequest{Full: true, State: state(a, c), Node: node(f)})
	c2 := port(f, "c", 2, 3, 4, 5)
	res := sync(t, b, &proxier.SyncRequest{State: state(a, c2), Changed: []model.ServicePortName{c2.Name}, Node: node(f)})
	if !res.PartialRestore {
		t.Error("partial sync not reported as partial")
	}
	fresh, _ := newBackend(t, f)
	full := sync(t, fresh, &proxier.SyncRequest{Full: true, State: state(a, c2), Node: node(f)})
	if res.RulesTotal["nat"] != full.RulesTotal["nat"] || res.RulesTotal["filter"] != full.RulesTotal["filter"] {
		t.Errorf("after a partial sync: totals %v, a full sync of the same state writes %v", res.RulesTotal, full.RulesWritten)
	}
	if res.RulesWritten["nat"] >= full.RulesWritten["nat"] {
		t.Errorf("partial sync wrote %d nat rules, a full one %d", res.RulesWritten["nat"], full.RulesWritten["nat"])
	}
	if full.RulesTotal["nat"] != full.RulesWritten["nat"] {
		t.Errorf("full sync: total %d nat rules, wrote %d", full.RulesTotal["nat"], full.RulesWritten["nat"])
	}
}

// Flushed reports drift only after a successful sync, and then while a canary
// chain is missing (full syncs create them, partial ones do not) or a dispatch
// chain holds more or fewer rules than the syncs wrote.
func TestFlushed(t *testing.T) {
	f := family.IPv4
	k := &kernelModel{}
	b, err := New(f, k, Options{MasqueradeBit: 14})
	if err != nil {
		t.Fatal(err)
	}
	if b.Flushed(context.Background()) {
		t.Error("Flushed before any sync")
	}
	a, c := port(f, "a", 1, 1), port(f, "c", 2, 2, 3)
	c.NodePort = 30002
	st := state(a, c)
	sync(t, b, &proxier.SyncRequest{Full: true, State: st, Node: node(f)})
	if got := strings.Count(k.last(), ":"+chainCanary+" - [0:0]\n"); got != 3 {
		t.Errorf("full sync declares %d canaries, want one in each of mangle, nat and filter:\n%s", got, k.last())
	}
	if b.Flushed(context.Background()) {
		t.Fatal("Flushed true after a full sync")
	}
	// What someone else does, each undone by a full sync.
	for _, tc := range []struct {
		what string
		do   func(tables map[string]map[string][]string)
	}{
		{"mangle canary deleted", func(tb map[string]map[string][]string) { delete(tb["mangle"], chainCanary) }},
		{"nat canary deleted", func(tb map[string]map[string][]string) { delete(tb["nat"], chainCanary) }},
		{"nat dispatch chain flushed", func(tb map[string]map[string][]string) { tb["nat"][chainServices] = nil }},
		{"nat dispatch rule deleted", func(tb map[string]map[string][]string) {
			tb["nat"][chainNodePorts] = tb["nat"][chainNodePorts][1:]
		}},
		{"filter dispatch chain deleted", func(tb map[string]map[string][]string) { delete(tb["filter"], chainForward) }},
		{"rule appended to a filter dispatch chain", func(tb map[string]map[string][]string) {
			tb["filter"][chainFirewall] = append(tb["filter"][chainFirewall], "-j ACCEPT")
		}},
	} {
		tc.do(k.tables)
		if !b.Flushed(context.Background()) {
			t.Errorf("%s: Flushed false", tc.what)
		}
		sync(t, b, &proxier.SyncRequest{Full: true, State: st, Node: node(f)})
		if b.Flushed(context.Background()) {
			t.Errorf("%s: Flushed true after the full sync", tc.what)
		}
	}
	// Partial syncs keep the counts exact and do not write the canaries.
	d := port(f, "d", 4, 4)
	d.NodePort = 30004
	st = state(a, d)
	sync(t, b, &proxier.SyncRequest{State: st, Changed: []model.ServicePortName{c.Name, d.Name}, Node: node(f)})
	if strings.Contains(k.last(), chainCanary) {
		t.Errorf("partial sync recreates the canary:\n%s", k.last())
	}
	if b.Flushed(context.Background()) {
		t.Error("Flushed true after a partial sync")
	}
	// A change of the other family's reserved NodePorts rewrites one tail
	// whole; another node change rewrites everything.
	n := node(f)
	n.ReservedNodePorts = []nodeport.Key{{Protocol: v1.ProtocolTCP, Port: 30999}}
	if res := sync(t, b, &proxier.SyncRequest{State: st, Node: n, NodeChanged: true}); !res.PartialRestore {
		t.Fatal("reserving a NodePort: not a partial sync")
	}
	if b.Flushed(context.Background()) {
		t.Error("Flushed true after reserving a NodePort")
	}
	n = node(f)
	n.MasqueradeAll = true
	sync(t, b, &proxier.SyncRequest{State: st, Node: n, NodeChanged: true})
	if b.Flushed(context.Background()) {
		t.Error("Flushed true after a node change")
	}
}

// A sync that rewrites everything commits the ports' chains in chunks of
// MaxPortsPerTx and the dispatch chains last, so nothing jumps to a chain before
// it is complete.
func TestRewriteChunks(t *testing.T) {
	f := family.IPv4
	r := &fakeRunner{}
	b, err := New(f, r, Options{MaxPortsPerTx: 2})
	if err != nil {
		t.Fatal(err)
	}
	var ports []*model.PortState
	for i := range 7 {
		ports = append(ports, port(f, fmt.Sprintf("s%d", i), i+1, i+1))
	}
	res := sync(t, b, &proxier.SyncRequest{Full: true, State: state(ports...), Node: node(f)})
	// 7 ports in chunks of 2: 0-1, 2-3, 4-5 alone; 6 (under half a chunk) with the
	// dispatch chains.
	if res.Transactions != 4 || len(r.restores) != 4 {
		t.Fatalf("%d transactions, %d restores; want 4", res.Transactions, len(r.restores))
	}
	for i, in := range r.restores[:3] {
		if got := len(perPort(declared(in))); got != 2 || strings.Contains(in, "-A "+chainServices) || strings.Contains(in, "*filter") {
			t.Errorf("chunk %d declares %d port chains (want 2) or writes dispatch chains:\n%s", i, got, in)
		}
	}
	// On a fresh node the first chunk creates the (empty) nat dispatch chains the
	// port chains jump to; no other chunk declares one.
	for _, ch := range natGlobal {
		if !slices.Contains(declared(r.restores[0]), ch) || slices.Contains(declared(r.restores[1]), ch) {
			t.Errorf("%s: declared in the first chunk %v, in the second %v; want first only", ch,
				slices.Contains(declared(r.restores[0]), ch), slices.Contains(declared(r.restores[1]), ch))
		}
	}
	last := r.last()
	if got := perPort(declared(last)); len(got) != 1 || !strings.Contains(last, "-A "+chainServices+" ") {
		t.Errorf("last transaction: port chains %v (want one), dispatch chains written: %v", got, strings.Contains(last, "-A "+chainServices+" "))
	}
	if res.RulesTotal["nat"] != res.RulesWritten["nat"] {
		t.Errorf("rules written %v, total %v: a full rewrite writes everything", res.RulesWritten, res.RulesTotal)
	}

	// A live ruleset: the first chunk must not declare (so flush) dispatch chains
	// that exist.
	r.restores = nil
	r.save = "*nat\n"
	for _, ch := range natGlobal {
		r.save += ":" + ch + " - [0:0]\n"
	}
	r.save += "COMMIT\n"
	sync(t, b, &proxier.SyncRequest{Full: true, State: state(ports...), Node: node(f)})
	for _, ch := range natGlobal {
		if slices.Contains(declared(r.restores[0]), ch) {
			t.Errorf("rewriting a live ruleset, the first chunk flushes %s", ch)
		}
	}

	// A failed chunk fails the sync, and the next sync rewrites everything again.
	r.restores = nil
	r.failAt = 2
	if _, err := b.Sync(context.Background(), &proxier.SyncRequest{Full: true, State: state(ports...), Node: node(f)}); err == nil {
		t.Fatal("a sync whose second chunk failed succeeded")
	}
	r.restores = nil
	sync(t, b, &proxier.SyncRequest{State: state(ports...), Changed: []model.ServicePortName{ports[0].Name}, Node: node(f)})
	if len(r.restores) != 4 {
		t.Errorf("sync after a failed chunk: %d transactions, want a full rewrite in 4", len(r.restores))
	}
}

// A first sync with fewer ports than one chunk is one transaction, which creates
// the dispatch chains once.
func TestFirstSyncOneChunk(t *testing.T) {
	f := family.IPv4
	b, r := newBackend(t, f)
	res := sync(t, b, &proxier.SyncRequest{Full: true, State: state(port(f, "a", 1, 1), port(f, "c", 2, 2)), Node: node(f)})
	if res.Transactions != 1 || len(r.restores) != 1 {
		t.Fatalf("%d transactions, %d restores; want 1", res.Transactions, len(r.restores))
	}
	for _, ch := range natGlobal {
		if !slices.Contains(declared(r.last()), ch) {
			t.Errorf("first sync does not create %s", ch)
		}
	}
}

// A node change rewrites every chain in chunks without flushing the live dispatch
// chains in the first one.
func TestNodeChangeChunksKeepDispatch(t *testing.T) {
	f := family.IPv6
	r := &fakeRunner{}
	b, err := New(f, r, Options{MaxPortsPerTx: 2})
	if err != nil {
		t.Fatal(err)
	}
	var ports []*model.PortState
	for i := range 5 {
		ports = append(ports, port(f, fmt.Sprintf("s%d", i), i+1, i+1))
	}
	sync(t, b, &proxier.SyncRequest{Full: true, State: state(ports...), Node: node(f)})
	r.restores = nil
	n := node(f)
	n.MasqueradeAll = true
	sync(t, b, &proxier.SyncRequest{State: state(ports...), Node: n, NodeChanged: true})
	if len(r.restores) < 2 {
		t.Fatalf("node change: %d transactions, want the chunked rewrite", len(r.restores))
	}
	for _, ch := range natGlobal {
		if slices.Contains(declared(r.restores[0]), ch) {
			t.Errorf("node change: the first chunk flushes the live %s", ch)
		}
	}
}

// kernelModel applies iptables-restore --noflush inputs the way the kernel ends
// up: per table, chains and their rules in order. It fails on what
// iptables-restore refuses (a rule for a chain that does not exist, deleting a
// rule that is not there, deleting a chain that still has rules).
type kernelModel struct {
	fakeRunner
	tables map[string]map[string][]string // table → chain → rules
}

func (k *kernelModel) Restore(ctx context.Context, data []byte) error {
	if err := k.fakeRunner.Restore(ctx, data); err != nil {
		return err
	}
	if k.tables == nil {
		k.tables = map[string]map[string][]string{}
	}
	var table string
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		switch {
		case line == "" || line == "COMMIT":
		case strings.HasPrefix(line, "*"):
			table = line[1:]
			if k.tables[table] == nil {
				k.tables[table] = map[string][]string{}
			}
		case strings.HasPrefix(line, ":"):
			k.tables[table][f[0][1:]] = []string{}
		case f[0] == "-A" || f[0] == "-I" || f[0] == "-D":
			chain := f[1]
			rules, ok := k.tables[table][chain]
			if !ok {
				return fmt.Errorf("%s: chain %s does not exist", line, chain)
			}
			switch f[0] {
			case "-A":
				k.tables[table][chain] = append(rules, strings.Join(f[2:], " "))
			case "-I":
				k.tables[table][chain] = append([]string{strings.Join(f[3:], " ")}, rules...)
			case "-D":
				i := slices.Index(rules, strings.Join(f[2:], " "))
				if i < 0 {
					return fmt.Errorf("%s: no such rule", line)
				}
				k.tables[table][chain] = slices.Delete(rules, i, i+1)
			}
		case f[0] == "-X":
			if len(k.tables[table][f[1]]) != 0 {
				return fmt.Errorf("%s: chain not empty", line)
			}
			delete(k.tables[table], f[1])
		default:
			return fmt.Errorf("unexpected restore line %q", line)
		}
	}
	return nil
}

// Save renders table as iptables-save does (chains sorted): the kernel's
// content, unless the test set fakeRunner.save.
func (k *kernelModel) Save(ctx context.Context, table string) (string, error) {
	if k.save != "" {
		return k.fakeRunner.Save(ctx, table)
	}
	var out strings.Builder
	out.WriteString("*" + table + "\n")
	chains := slices.Sorted(maps.Keys(k.tables[table]))
	for _, ch := range chains {
		out.WriteString(":" + ch + " - [0:0]\n")
	}
	for _, ch := range chains {
		for _, r := range k.tables[table][ch] {
			out.WriteString("-A " + ch + " " + r + "\n")
		}
	}
	out.WriteString("COMMIT\n")
	return out.String(), nil
}

func (k *kernelModel) ChainExists(table, chain string) (bool, error) {
	_, ok := k.tables[table][chain]
	return ok, nil
}

func (k *kernelModel) RuleCounts(_ context.Context, table string, chains []string) (map[string]int, error) {
	out := map[string]int{}
	for _, ch := range chains {
		if rules, ok := k.tables[table][ch]; ok {
			out[ch] = len(rules)
		}
	}
	return out, nil
}

// canonical is the model's content with each chain's rules sorted, except the
// order that matters: per-port chains and the tails are compared as written by
// a full sync, so sorting both sides keeps "same rules" and the tail check below
// keeps "same order".
func (k *kernelModel) canonical() map[string][]string {
	out := map[string][]string{}
	for t, chains := range k.tables {
		for ch, rules := range chains {
			out[t+" "+ch] = slices.Sorted(slices.Values(rules))
		}
	}
	return out
}

// TestRandomPartialSyncs: after any sequence of partial syncs (endpoints, ports,
// Services and node ports coming and going), the kernel holds what a full sync
// of the same state writes into an empty kernel, and every tail rule (the
// NodePort jump, the unallocated-address drop, ...) is still last.
func TestRandomPartialSyncs(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(7, uint64(f.BitLen)))
			k := &kernelModel{}
			b, err := New(f, k, Options{MasqueradeBit: 14, MaxPortsPerTx: 3})
			if err != nil {
				t.Fatal(err)
			}
			ports := map[model.ServicePortName]*model.PortState{}
			randomPort := func(i int) *model.PortState {
				var eps []int
				for e := range 1 + rnd.IntN(12) {
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
				if rnd.IntN(3) == 0 {
					ps.NodePort = uint16(30000 + i)
					ps.ExternalPolicyLocal = rnd.IntN(2) == 0
					if !ps.ExternalPolicyLocal {
						ps.Local = nil
					}
				} else {
					ps.Local = nil
				}
				if rnd.IntN(4) == 0 {
					ps.AffinitySeconds = 30
				}
				if rnd.IntN(5) == 0 {
					ps.ExternalIPs = []netip.Addr{addr(f, fmt.Sprintf("203.0.113.%d", i), fmt.Sprintf("2001:db8:7::%d", i))}
				}
				return ps
			}
			st := func() *model.State {
				s := model.NewState()
				maps.Copy(s.Ports, ports)
				return s
			}
			for i := range 8 {
				ps := randomPort(i)
				ports[ps.Name] = ps
			}
			sync(t, b, &proxier.SyncRequest{Full: true, State: st(), Node: node(f)})
			for step := range 300 {
				i := rnd.IntN(12)
				name := portName(fmt.Sprintf("s%d", i))
				if _, ok := ports[name]; ok && rnd.IntN(4) == 0 {
					delete(ports, name)
				} else {
					ports[name] = randomPort(i)
				}
				sync(t, b, &proxier.SyncRequest{State: st(), Changed: []model.ServicePortName{name}, Node: node(f)})
				if b.Flushed(context.Background()) {
					t.Fatalf("step %d (%s): the periodic check finds drift after partial syncs alone", step, name)
				}
				fresh := &kernelModel{}
				fb, _ := New(f, fresh, Options{MasqueradeBit: 14, MaxPortsPerTx: 3})
				sync(t, fb, &proxier.SyncRequest{Full: true, State: st(), Node: node(f)})
				got, want := k.canonical(), fresh.canonical()
				for ch := range maps.Keys(want) {
					if !slices.Equal(got[ch], want[ch]) {
						t.Fatalf("step %d (%s): chain %s holds\n%s\nwant\n%s", step, name, ch,
							strings.Join(got[ch], "\n"), strings.Join(want[ch], "\n"))
					}
				}
				for ch := range maps.Keys(got) {
					if _, ok := want[ch]; !ok {
						t.Fatalf("step %d (%s): chain %s left behind", step, name, ch)
					}
				}
				// Tail rules stay last.
				for _, tc := range []struct{ table, chain, last string }{
					{"nat", chainServices, "-j " + chainNodePorts},
					{"filter", chainServiceCIDRs, "-j DROP"},
				} {
					rules := k.tables[tc.table][tc.chain]
					if len(rules) == 0 || !strings.HasSuffix(rules[len(rules)-1], tc.last) {
						t.Fatalf("step %d: %s %s does not end with %q:\n%s", step, tc.table, tc.chain, tc.last, strings.Join(rules, "\n"))
					}
				}
			}
		})
	}
}

// A NodePort the other family starts or stops reserving rewrites one chain, not
// every port's.
func TestReservedNodePortChangeIsSmall(t *testing.T) {
	f := family.IPv6
	r := &kernelModel{}
	b, err := New(f, r, Options{MasqueradeBit: 14, MaxPortsPerTx: 2})
	if err != nil {
		t.Fatal(err)
	}
	ports := []*model.PortState{port(f, "a", 1, 1), port(f, "c", 2, 2), port(f, "d", 3, 3)}
	sync(t, b, &proxier.SyncRequest{Full: true, State: state(ports...), Node: node(f)})
	r.restores = nil
	n := node(f)
	n.ReservedNodePorts = []nodeport.Key{{Protocol: v1.ProtocolTCP, Port: 30999}}
	res := sync(t, b, &proxier.SyncRequest{State: state(ports...), Node: n, NodeChanged: true})
	if res.Transactions != 1 || !res.PartialRestore {
		t.Fatalf("reserving a NodePort: %d transactions, partial %v; want one partial", res.Transactions, res.PartialRestore)
	}
	if got := declared(r.last()); !slices.Equal(got, []string{chainExternalServices}) {
		t.Errorf("reserving a NodePort declared %v, want only %s:\n%s", got, chainExternalServices, r.last())
	}
	rules := r.tables["filter"][chainExternalServices]
	if len(rules) == 0 || !strings.Contains(rules[len(rules)-1], "--dport 30999 -j REJECT --reject-with tcp-reset") {
		t.Errorf("%s after reserving TCP 30999:\n%s", chainExternalServices, strings.Join(rules, "\n"))
	}
	// Any other node change still rewrites everything.
	n2 := node(f)
	n2.MasqueradeAll = true
	if res := sync(t, b, &proxier.SyncRequest{State: state(ports...), Node: n2, NodeChanged: true}); res.PartialRestore {
		t.Error("masqueradeAll turned on: a partial sync, want everything rewritten")
	}
}
