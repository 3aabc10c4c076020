package iptables

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/family"
	ipt "github.com/dsproxy/dsproxy/pkg/iptables"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nfacct"
	"github.com/dsproxy/dsproxy/pkg/nodeport"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// Runner is what the backend needs of the iptables tools; *ipt.Runner is the real
// one.
type Runner interface {
	Restore(ctx context.Context, data []byte) error
	Save(ctx context.Context, table string) (string, error)
	EnsureRule(table, chain string, rule ...string) (bool, error)
	ChainExists(table, chain string) (bool, error)
	RuleCounts(ctx context.Context, table string, chains []string) (map[string]int, error)
	HasRandomFully() bool
}

var _ Runner = (*ipt.Runner)(nil)

// Options are the iptables-mode settings (kube-proxy's iptables section).
type Options struct {
	// MasqueradeBit is the bit of the packet mark that asks for SNAT, in [0, 31]
	// (kube-proxy's --iptables-masquerade-bit; its default is 14).
	MasqueradeBit int
	// LocalhostNodePorts serves IPv4 NodePorts on 127.0.0.0/8 as well, setting
	// net.ipv4.conf.all.route_localnet (kube-proxy's --iptables-localhost-nodeports).
	LocalhostNodePorts bool
	// MaxPortsPerTx bounds how many service ports' chains a sync that rewrites
	// everything writes in one iptables-restore (default 1000). iptables-nft's
	// restore time grows faster than its input: at 10k Services one transaction
	// took twice as long as ten of a thousand each. The dispatch chains, which
	// make the ports reachable, follow in a last transaction, so each port's chain
	// is complete before anything jumps to it, and a rewrite of a live ruleset
	// replaces each chain within one transaction.
	MaxPortsPerTx int
	// TCPBeLiberal says the node sets net.netfilter.nf_conntrack_tcp_be_liberal:
	// then, as in kube-proxy, DSPROXY-FORWARD does not drop packets conntrack
	// marks invalid.
	TCPBeLiberal bool
	// NFAcct, when set, holds kube-proxy's nfacct counters, which the rules count
	// into once they exist: dropped invalid packets, and (IPv4, with
	// LocalhostNodePorts) connections accepted on localhost NodePorts. The
	// metrics read them from there.
	NFAcct nfacct.Interface
}

const defaultMaxPortsPerTx = 1000

// Backend implements proxier.Backend with iptables for one family.
type Backend struct {
	f    *family.Family
	r    Runner
	opts Options
	// p is what the syncs since the last full one wrote for the service ports;
	// tails the dispatch chains' tails. Both are exact only while synced.
	p     *written
	tails map[string][]string
	node  *proxier.NodeConfig // of the last successful sync
	// synced is false until a sync succeeds and after a failed one: the next sync
	// then rewrites and reconciles everything.
	synced bool
	// counters holds the nfacct objects known to exist; warned that their
	// first check is done.
	counters map[string]bool
	warned   bool
}

// written is what the backend wrote for the service ports: their chains, the
// rules in them, and their rules in the dispatch chains. count holds, per
// dispatch chain ("table chain"), each rule with the number of ports that want
// it (ports of one Service share some); the chain holds the rules counted.
type written struct {
	chains   map[model.ServicePortName][]string
	rules    map[model.ServicePortName]int
	ruleSum  int
	dispatch map[model.ServicePortName]map[string][]string
	count    map[string]map[string]int
}

func newWritten() *written {
	return &written{chains: map[model.ServicePortName][]string{}, rules: map[model.ServicePortName]int{},
		dispatch: map[model.ServicePortName]map[string][]string{}, count: map[string]map[string]int{}}
}

// setDispatch replaces port n's dispatch rules with d (nil: none). touched
// records, for each rule whose count changed, the count before this sync's first
// change to it.
func (w *written) setDispatch(n model.ServicePortName, d map[string][]string, touched map[string]map[string]int) {
	move := func(rules map[string][]string, by int) {
		for key, lines := range rules {
			cnt := w.count[key]
			if cnt == nil {
				cnt = map[string]int{}
				w.count[key] = cnt
			}
			t := touched[key]
			if t == nil {
				t = map[string]int{}
				touched[key] = t
			}
			for _, l := range lines {
				if _, ok := t[l]; !ok {
					t[l] = cnt[l]
				}
				if cnt[l] += by; cnt[l] == 0 {
					delete(cnt, l)
				}
			}
		}
	}
	move(w.dispatch[n], -1)
	move(d, +1)
	if d == nil {
		delete(w.dispatch, n)
	} else {
		w.dispatch[n] = d
	}
}

// setChains records port n's chains and their rule count (nil chains: none).
func (w *written) setChains(n model.ServicePortName, chains []string, rules int) {
	w.ruleSum += rules - w.rules[n]
	if chains == nil {
		delete(w.chains, n)
		delete(w.rules, n)
		return
	}
	w.chains[n], w.rules[n] = chains, rules
}

// dispatchOf renders port s's rules in the dispatch chains, per "table chain",
// each rule once.
func (c *config) dispatchOf(s *shape) map[string][]string {
	nat, filter := newRules(natGlobal), newRules(filterGlobal)
	c.globalRules(s, nat, filter)
	out := map[string][]string{}
	for table, r := range map[string]*rules{"nat": nat, "filter": filter} {
		for ch, cc := range r.content {
			if len(cc.head) > 0 {
				out[table+" "+ch] = slices.Compact(slices.Sorted(slices.Values(cc.head)))
			}
		}
	}
	return out
}

var (
	_ proxier.Backend       = (*Backend)(nil)
	_ proxier.FlushDetector = (*Backend)(nil)
)

// chainCanary is an empty chain each full sync creates in mangle, nat and filter
// and no other sync does: when it is gone, someone flushed the table
// (kube-proxy's KUBE-PROXY-CANARY).
const chainCanary = Prefix + "CANARY"

// Flushed implements proxier.FlushDetector: it reports whether, since the last
// successful sync, a canary chain is gone (someone flushed a table) or a
// dispatch chain holds another number of rules than the backend wrote
// (someone flushed or edited it by hand), or either cannot be read. kube-proxy
// rewrites its dispatch chains at every sync; a partial sync here writes only
// what changed, so this check is what puts them back within a check period.
// It counts the dispatch chains only: with nf_tables it lists those, chain
// by chain; legacy iptables reads any chain with its whole table, so there it
// reads one save of nat and one of filter.
func (b *Backend) Flushed(ctx context.Context) bool {
	if !b.synced {
		return false // the next sync rewrites everything anyway
	}
	if ok, err := b.r.ChainExists("mangle", chainCanary); err != nil || !ok {
		klog.V(2).InfoS("Canary chain gone", "ipFamily", b.f.Name, "table", "mangle", "err", err)
		return true
	}
	for _, table := range []string{"nat", "filter"} {
		chains := append(b.dispatchChains(table), chainCanary)
		have, err := b.r.RuleCounts(ctx, table, chains)
		if err != nil {
			klog.V(2).InfoS("Cannot read the dispatch chains", "ipFamily", b.f.Name, "table", table, "err", err)
			return true
		}
		if _, ok := have[chainCanary]; !ok {
			klog.V(2).InfoS("Canary chain gone", "ipFamily", b.f.Name, "table", table)
			return true
		}
		if d := b.dispatchDrift(table, have); len(d) > 0 {
			klog.V(2).InfoS("Dispatch chain changed by someone else", "ipFamily", b.f.Name, "table", table,
				"chain", d[0].chain, "rules", d[0].n, "want", d[0].want, "chainsChanged", len(d))
			return true
		}
	}
	return false
}

// dispatchChains lists table's dispatch chains, sorted.
func (b *Backend) dispatchChains(table string) []string {
	var out []string
	for key := range b.tails {
		if t, ch, _ := strings.Cut(key, " "); t == table {
			out = append(out, ch)
		}
	}
	slices.Sort(out)
	return out
}

// drift is a dispatch chain whose rule count in the kernel (-1: the chain is
// missing) is not the one the backend wrote.
type drift struct {
	chain   string
	n, want int
}

// dispatchDrift compares have, the rule counts of table's chains as the kernel
// holds them (a missing chain left out), with what the syncs since the last
// full one wrote into its dispatch chains, each head rule once and the tail,
// and returns the chains that differ.
func (b *Backend) dispatchDrift(table string, have map[string]int) []drift {
	var out []drift
	for _, ch := range b.dispatchChains(table) {
		key := table + " " + ch
		want := len(b.p.count[key]) + len(b.tails[key])
		n, found := have[ch]
		if !found {
			n = -1
		}
		if n != want {
			out = append(out, drift{ch, n, want})
		}
	}
	return out
}

// New returns the backend of family f.
func New(f *family.Family, r Runner, opts Options) (*Backend, error) {
	if opts.MasqueradeBit < 0 || opts.MasqueradeBit > 31 {
		return nil, fmt.Errorf("iptables: masquerade bit %d is not in [0, 31]", opts.MasqueradeBit)
	}
	if opts.MaxPortsPerTx <= 0 {
		opts.MaxPortsPerTx = defaultMaxPortsPerTx
	}
	return &Backend{f: f, r: r, opts: opts, p: newWritten()}, nil
}

// Sync implements proxier.Backend. A partial sync is one iptables-restore of what
// changed: the chains of the ports in req.Changed, and in the dispatch chains the
// rules that came or went. A full sync, the first, one after a failure and one
// after a node change rewrite every chain, in transactions of MaxPortsPerTx ports
// and a last one with the dispatch chains; a full (or first) one also deletes
// DSPROXY- chains that nothing wants and puts back missing jumps from the
// built-in chains.
func (b *Backend) Sync(ctx context.Context, req *proxier.SyncRequest) (proxier.SyncResult, error) {
	if req.Node == nil || req.Node.Family != b.f {
		return proxier.SyncResult{}, fmt.Errorf("iptables %s: sync without this family's node config", b.f)
	}
	reconcile := req.Full || !b.synced
	// Differences a full sync finds after a successful one are repairs.
	countRepairs := req.Full && b.synced
	// A change of the NodePorts the other family reserves only changes a tail
	// (changedPorts rewrites that chain); any other node change rewrites all.
	rewriteAll := reconcile || (req.NodeChanged && !b.sameNodeButReserved(req.Node))
	b.synced = false // until this sync succeeds
	if reconcile {
		b.ensureCounters()
	}
	mask := uint32(1) << b.opts.MasqueradeBit
	c := &config{
		node:        req.Node,
		masqBit:     fmt.Sprintf("%#x", mask),
		masqMark:    fmt.Sprintf("%#x/%#x", mask, mask),
		random:      b.r.HasRandomFully(),
		keepInvalid: b.opts.TCPBeLiberal,
		acctInvalid: b.counters[nfacct.CTStateInvalidDropped],
		acctLocalNP: b.counters[nfacct.LocalhostNodePortsAccepted],
		localhostNP: LocalhostNodePorts(b.f, b.opts.LocalhostNodePorts, req.Node.NodePortAddresses),
	}
	nat, filter := newRules(natGlobal), newRules(filterGlobal)
	c.nodeTails(nat, filter)
	tails := map[string][]string{}
	for table, r := range map[string]*rules{"nat": nat, "filter": filter} {
		for ch, cc := range r.content {
			tails[table+" "+ch] = cc.tail
		}
	}
	res := proxier.SyncResult{PartialRestore: !rewriteAll}
	if rewriteAll {
		if err := b.rewritePorts(ctx, c, req.State, nat, filter, reconcile, countRepairs, &res); err != nil {
			return res, err
		}
	} else {
		b.changedPorts(c, req, nat, filter, tails)
	}
	b.tails = tails
	var in strings.Builder
	if reconcile {
		mangle := newRules(nil)
		for _, r := range []*rules{mangle, nat, filter} {
			r.declare(chainCanary)
		}
		mangle.writeTo(&in, "mangle")
	}
	filter.writeTo(&in, "filter")
	nat.writeTo(&in, "nat")
	if err := b.r.Restore(ctx, []byte(in.String())); err != nil {
		res.RestoreFailed = true
		return res, err
	}
	res.Operations += nat.n + filter.n
	res.Transactions++
	res.RulesWritten = map[string]int{"nat": res.Operations - filter.n, "filter": filter.n}
	res.RulesTotal = b.rulesTotal()
	if c.localhostNP {
		// Without it localhost NodePorts do not answer; everything else does, so
		// it is logged, not a failed sync (which would retry as a full one).
		if err := EnableRouteLocalnet(b.f); err != nil {
			klog.ErrorS(err, "Localhost NodePorts will not work", "ipFamily", b.f.Name)
		}
	}
	if reconcile {
		if err := b.ensureJumps(countRepairs, &res); err != nil {
			return res, err
		}
	}
	b.node = req.Node
	b.synced = true
	return res, nil
}

// ensureCounters creates the nfacct objects the rules count into, if missing,
// and records which exist; a rule names only those (iptables-restore fails on
// a rule naming a missing object). Failures are logged, once per counter until
// it works: the metric is missing, nothing else.
func (b *Backend) ensureCounters() {
	if b.opts.NFAcct == nil {
		return
	}
	if b.counters == nil {
		b.counters = map[string]bool{}
	}
	for _, name := range []string{nfacct.CTStateInvalidDropped, nfacct.LocalhostNodePortsAccepted} {
		err := b.opts.NFAcct.Ensure(name)
		if err != nil && (b.counters[name] || !b.warned) {
			klog.ErrorS(err, "nfacct counter unavailable; its metric will not be updated", "counter", name, "ipFamily", b.f.Name)
		}
		b.counters[name] = err == nil
	}
	b.warned = true
}

// rulesTotal counts the rules the backend owns, per table: those of the port chains
// and the dispatch chains' heads and tails.
func (b *Backend) rulesTotal() map[string]int {
	out := map[string]int{"nat": b.p.ruleSum, "filter": 0}
	for key, cnt := range b.p.count {
		out[strings.Fields(key)[0]] += len(cnt)
	}
	for key, t := range b.tails {
		out[strings.Fields(key)[0]] += len(t)
	}
	return out
}

// ensureJumps puts back any missing jump from a built-in chain (a repair when
// countRepairs), inserting in reverse so they end up in jumps' order.
func (b *Backend) ensureJumps(countRepairs bool, res *proxier.SyncResult) error {
	js := jumps()
	for i := len(js) - 1; i >= 0; i-- {
		added, err := b.r.EnsureRule(js[i].table, js[i].chain, js[i].rule...)
		if err != nil {
			return err
		}
		if added {
			res.Operations++
			if countRepairs {
				res.Repairs++
			}
		}
	}
	return nil
}

// sameNodeButReserved reports whether n equals the last successful sync's node
// settings in everything but the reserved NodePorts.
func (b *Backend) sameNodeButReserved(n *proxier.NodeConfig) bool {
	if b.node == nil {
		return false
	}
	m := *n
	m.ReservedNodePorts = b.node.ReservedNodePorts
	return m.Equal(b.node)
}

// rewritePorts writes every port's chains, in transactions of MaxPortsPerTx
// committed here and the rest into nat for the last one, and every dispatch chain
// whole into nat and filter. It deletes the chains the kernel has (reconcile: as
// iptables-save lists them) that nothing wants, and counts the wanted ones it
// lacked as repairs.
func (b *Backend) rewritePorts(ctx context.Context, c *config, st *model.State, nat, filter *rules,
	reconcile, countRepairs bool, res *proxier.SyncResult) error {
	names := slices.SortedFunc(maps.Keys(st.Ports), model.ServicePortName.Compare)
	shapes := make([]*shape, 0, len(names))
	for _, n := range names {
		if ps := st.Ports[n]; b.f.Contains(ps.ClusterIP) {
			s := shapeOf(ps)
			shapes = append(shapes, &s)
		}
	}
	existing, counts, err := b.existingChains(ctx, reconcile)
	if err != nil {
		return err
	}
	p := newWritten()
	touched := map[string]map[string]int{}
	want := map[string]bool{}
	// Port chains jump to DSPROXY-MARK-MASQ and DSPROXY-MASQ-NONLOCAL: a chunk
	// committed before the last creates the dispatch chains missing (their rules
	// follow in the last transaction, which declares them all). Existing ones are
	// not declared, which would flush them until then.
	var missing []string
	for _, ch := range natGlobal {
		if !slices.Contains(existing["nat"], ch) {
			missing = append(missing, ch)
		}
	}
	// Every chunk but the last (which holds the rest with the dispatch chains) is
	// a transaction of its own, committed here.
	chunk := newRules(nil)
	heads := map[string][]string{} // dispatch rules in port order
	for i, s := range shapes {
		if i > 0 && i%b.opts.MaxPortsPerTx == 0 && len(shapes)-i >= b.opts.MaxPortsPerTx/2 {
			var in strings.Builder
			for _, ch := range missing {
				chunk.declare(ch)
			}
			missing = nil
			chunk.writeTo(&in, "nat")
			if err := b.r.Restore(ctx, []byte(in.String())); err != nil {
				res.RestoreFailed = true
				return err
			}
			res.Transactions++
			res.Operations += chunk.n
			chunk = newRules(nil)
		}
		n := chunk.n
		c.portChains(s, chunk)
		p.setChains(s.ps.Name, s.chains(), chunk.n-n)
		for _, ch := range s.chains() {
			want[ch] = true
		}
		d := c.dispatchOf(s)
		p.setDispatch(s.ps.Name, d, touched)
		for key, lines := range d {
			heads[key] = append(heads[key], lines...)
		}
	}
	nat.decl.WriteString(chunk.decl.String())
	nat.body.WriteString(chunk.body.String())
	nat.n += chunk.n
	for table, r := range map[string]*rules{"nat": nat, "filter": filter} {
		for _, ch := range slices.Sorted(maps.Keys(r.content)) {
			r.writeWhole(ch, heads[table+" "+ch], r.content[ch].tail)
		}
	}
	for _, ch := range existing["nat"] {
		if !want[ch] && !slices.Contains(natGlobal, ch) && ch != chainCanary {
			nat.delete(ch)
		}
	}
	for _, ch := range existing["filter"] {
		if !slices.Contains(filterGlobal, ch) && ch != chainCanary {
			filter.delete(ch)
		}
	}
	if countRepairs {
		have := map[string]bool{}
		for _, ch := range existing["nat"] {
			have[ch] = true
		}
		// A chain the last sync wrote, still wanted, that the kernel lacks
		// (a new port's chains are no repair).
		for _, chs := range b.p.chains {
			for _, ch := range chs {
				if want[ch] && !have[ch] {
					res.Repairs++
				}
			}
		}
		// A dispatch chain flushed or edited by hand (b.p and b.tails are
		// still what the last successful sync left).
		for _, table := range []string{"nat", "filter"} {
			res.Repairs += len(b.dispatchDrift(table, counts[table]))
		}
	}
	b.p = p
	return nil
}

// existingChains lists, per table, the DSPROXY- chains there before a rewrite
// writes anything (chains to delete, and to count as repaired): as iptables-save
// shows them when reconciling, else the dispatch chains and what the last
// successful sync wrote. Reconciling, it also counts the rules of the dispatch
// chains the last sync wrote, per table (for dispatchDrift).
func (b *Backend) existingChains(ctx context.Context, reconcile bool) (map[string][]string, map[string]map[string]int, error) {
	existing := map[string][]string{}
	if !reconcile {
		existing["nat"] = slices.Clone(natGlobal)
		for _, chs := range b.p.chains {
			existing["nat"] = append(existing["nat"], chs...)
		}
		return existing, nil, nil
	}
	counts := map[string]map[string]int{}
	for _, table := range []string{"nat", "filter"} {
		save, err := b.r.Save(ctx, table)
		if err != nil {
			return nil, nil, err
		}
		maps.Copy(existing, ipt.Chains(save, Prefix))
		counts[table] = ipt.CountRules(save, table, b.dispatchChains(table))
	}
	return existing, counts, nil
}

// changedPorts writes the chains of the ports in req.Changed (a deleted port's
// deleted) into nat, and their dispatch rules that came or went: deleted by their
// spec, inserted at the top. Its cost follows the number of changed ports, not of
// Services. A dispatch chain whose tail differs from the last sync's (which only a
// node change does, and that rewrites everything) is rewritten whole.
func (b *Backend) changedPorts(c *config, req *proxier.SyncRequest, nat, filter *rules, tails map[string][]string) {
	touched := map[string]map[string]int{}
	for _, n := range req.Changed {
		var s *shape
		if ps := req.State.Ports[n]; ps != nil && b.f.Contains(ps.ClusterIP) {
			sh := shapeOf(ps)
			s = &sh
		}
		old := b.p.chains[n]
		var now []string
		if s != nil {
			before := nat.n
			c.portChains(s, nat)
			now = s.chains()
			b.p.setChains(n, now, nat.n-before)
			b.p.setDispatch(n, c.dispatchOf(s), touched)
		} else {
			b.p.setChains(n, nil, 0)
			b.p.setDispatch(n, nil, touched)
		}
		for _, ch := range old {
			if !slices.Contains(now, ch) {
				nat.delete(ch)
			}
		}
	}
	byTable := map[string]*rules{"nat": nat, "filter": filter}
	for _, key := range slices.Sorted(maps.Keys(tails)) {
		table, ch, _ := strings.Cut(key, " ")
		r := byTable[table]
		if !slices.Equal(tails[key], b.tails[key]) {
			r.writeWhole(ch, slices.Sorted(maps.Keys(b.p.count[key])), tails[key])
			continue
		}
		t := touched[key]
		lines := slices.Sorted(maps.Keys(t))
		for _, l := range lines {
			if t[l] > 0 && b.p.count[key][l] == 0 {
				r.line("-D", ch, l)
			}
		}
		for _, l := range slices.Backward(lines) {
			if t[l] == 0 && b.p.count[key][l] > 0 {
				r.line("-I", ch, "1 "+l)
			}
		}
	}
}

// LocalhostNodePorts reports whether f's NodePorts answer on loopback addresses
// (kube-proxy's --iptables-localhost-nodeports, enabled): only IPv4's can, and only
// where the NodePort addresses include loopback ones.
func LocalhostNodePorts(f *family.Family, enabled bool, a nodeport.Addresses) bool {
	return enabled && f.RouteLocalnetSysctl != "" && (a.MatchAll || len(a.Loopback) > 0)
}

// EnableRouteLocalnet sets the sysctl that lets f's packets to loopback
// addresses be routed off the node, which localhost NodePorts need.
func EnableRouteLocalnet(f *family.Family) error {
	if f.RouteLocalnetSysctl == "" {
		return fmt.Errorf("%s has no route_localnet sysctl", f)
	}
	return ensureSysctl(f.RouteLocalnetSysctl, "1")
}

// ensureSysctl writes v to the sysctl file path unless it holds v already.
func ensureSysctl(path, v string) error {
	cur, err := os.ReadFile(path)
	if err == nil && strings.TrimSpace(string(cur)) == v {
		return nil
	}
	if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
		return fmt.Errorf("setting %s to %s: %w", path, v, err)
	}
	klog.InfoS("Set sysctl", "path", path, "value", v)
	return nil
}

// Cleanup implements proxier.Backend: every DSPROXY- chain of the family goes, with
// every rule that jumps to one.
func (b *Backend) Cleanup(ctx context.Context) error {
	b.synced, b.p, b.tails = false, newWritten(), nil
	save, err := b.r.Save(ctx, "")
	if err != nil {
		return err
	}
	undo := ipt.Undo(save, Prefix)
	if undo == "" {
		return nil
	}
	return b.r.Restore(ctx, []byte(undo))
}
