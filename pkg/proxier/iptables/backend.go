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
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// Runner is what the backend needs of the iptables tools; *ipt.Runner is the real
// one.
type Runner interface {
	Restore(ctx context.Context, data []byte) error
	Save(ctx context.Context, table string) (string, error)
	EnsureRule(table, chain string, rule ...string) (bool, error)
	ChainExists(table, chain string) (bool, error)
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
}

const defaultMaxPortsPerTx = 1000

// Backend implements proxier.Backend with iptables for one family.
type Backend struct {
	f    *family.Family
	r    Runner
	opts Options
	// written holds, per service port, the chains the last syncs created for it,
	// and portRules how many nat rules they hold.
	written   map[model.ServicePortName][]string
	portRules map[model.ServicePortName]int
	// content is, per table, what the dispatch chains held after the last
	// successful sync (after a failure the next sync rewrites them anyway).
	content map[string]map[string]*chainContent
	// synced is false until a sync succeeds and after a failed one: the next sync
	// then rewrites and reconciles everything.
	synced bool
}

var (
	_ proxier.Backend       = (*Backend)(nil)
	_ proxier.FlushDetector = (*Backend)(nil)
)

// chainCanary is an empty chain each full sync creates in canaryTables and no
// other sync does: when it is gone, someone flushed the table (kube-proxy's
// KUBE-PROXY-CANARY).
const chainCanary = Prefix + "CANARY"

var canaryTables = []string{"mangle", "nat", "filter"}

// Flushed implements proxier.FlushDetector: it reports whether a canary chain is
// gone (or cannot be read) since the last successful full sync.
func (b *Backend) Flushed(context.Context) bool {
	if !b.synced {
		return false // the next sync rewrites everything anyway
	}
	for _, t := range canaryTables {
		if ok, err := b.r.ChainExists(t, chainCanary); err != nil || !ok {
			klog.V(2).InfoS("Canary chain gone", "ipFamily", b.f.Name, "table", t, "err", err)
			return true
		}
	}
	return false
}

// New returns the backend of family f.
func New(f *family.Family, r Runner, opts Options) (*Backend, error) {
	if opts.MasqueradeBit < 0 || opts.MasqueradeBit > 31 {
		return nil, fmt.Errorf("iptables: masquerade bit %d is not in [0, 31]", opts.MasqueradeBit)
	}
	if opts.MaxPortsPerTx <= 0 {
		opts.MaxPortsPerTx = defaultMaxPortsPerTx
	}
	return &Backend{f: f, r: r, opts: opts, written: map[model.ServicePortName][]string{}, portRules: map[model.ServicePortName]int{}}, nil
}

// routeLocalnet is the sysctl localhost NodePorts need.
const routeLocalnet = "/proc/sys/net/ipv4/conf/all/route_localnet"

// Sync implements proxier.Backend. A partial sync is one iptables-restore of what
// changed: the chains of the ports in req.Changed, and the differences in the
// dispatch chains. A full sync, the first, one after a failure and one after a
// node change rewrite every chain, in transactions of MaxPortsPerTx ports and a
// last one with the dispatch chains; a full (or first) one also deletes DSPROXY-
// chains that nothing wants and puts back missing jumps from the built-in chains.
func (b *Backend) Sync(ctx context.Context, req *proxier.SyncRequest) (proxier.SyncResult, error) {
	if req.Node == nil || req.Node.Family != b.f {
		return proxier.SyncResult{}, fmt.Errorf("iptables %s: sync without this family's node config", b.f)
	}
	reconcile := req.Full || !b.synced
	// Differences a full sync finds after a successful one are repairs.
	countRepairs := req.Full && b.synced
	rewriteAll := reconcile || req.NodeChanged
	b.synced = false // until this sync succeeds
	mask := uint32(1) << b.opts.MasqueradeBit
	c := &config{
		node:     req.Node,
		masqBit:  fmt.Sprintf("%#x", mask),
		masqMark: fmt.Sprintf("%#x/%#x", mask, mask),
		random:   b.r.HasRandomFully(),
		localhostNP: b.opts.LocalhostNodePorts && b.f == family.IPv4 &&
			(req.Node.NodePortAddresses.MatchAll || len(req.Node.NodePortAddresses.Loopback) > 0),
	}
	names := slices.SortedFunc(maps.Keys(req.State.Ports), model.ServicePortName.Compare)
	shapes := make([]*shape, 0, len(names))
	byName := make(map[model.ServicePortName]*shape, len(names))
	for _, n := range names {
		ps := req.State.Ports[n]
		if !b.f.Contains(ps.ClusterIP) {
			continue
		}
		s := shapeOf(ps)
		shapes = append(shapes, &s)
		byName[n] = &s
	}
	nat, filter := newRules(natGlobal), newRules(filterGlobal)
	for _, s := range shapes {
		c.globalRules(s, nat, filter)
	}
	c.nodeRules(shapes, nat, filter)

	res := proxier.SyncResult{PartialRestore: !rewriteAll}
	var written map[model.ServicePortName][]string
	var portRules map[model.ServicePortName]int
	if rewriteAll {
		var err error
		if written, portRules, err = b.rewritePorts(ctx, c, shapes, nat, filter, reconcile, countRepairs, &res); err != nil {
			return res, err
		}
	} else {
		written, portRules = b.changedPorts(c, req.Changed, byName, nat)
	}
	// The dispatch chains: rewritten whole when everything is, else only what
	// changed since the last successful sync.
	nat.emit(b.content["nat"], rewriteAll)
	filter.emit(b.content["filter"], rewriteAll)
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
	b.written, b.portRules = written, portRules
	b.content = map[string]map[string]*chainContent{"nat": nat.content, "filter": filter.content}
	res.RulesWritten = map[string]int{"nat": res.Operations - filter.n, "filter": filter.n}
	res.RulesTotal = map[string]int{"nat": 0, "filter": 0}
	for table, chains := range b.content {
		for _, c := range chains {
			res.RulesTotal[table] += c.len()
		}
	}
	for _, n := range portRules {
		res.RulesTotal["nat"] += n
	}
	if c.localhostNP {
		if err := ensureSysctl(routeLocalnet, "1"); err != nil {
			return res, err
		}
	}
	if reconcile {
		js := jumps()
		for i := len(js) - 1; i >= 0; i-- {
			added, err := b.r.EnsureRule(js[i].table, js[i].chain, js[i].rule...)
			if err != nil {
				return res, err
			}
			if added {
				res.Operations++
				if countRepairs {
					res.Repairs++
				}
			}
		}
	}
	b.synced = true
	return res, nil
}

// rewritePorts writes every port's chains: in transactions of MaxPortsPerTx
// committed here, the rest into nat for the last one. It deletes the chains the
// kernel has (reconcile: as iptables-save lists them) that nothing wants, and
// counts the wanted ones it lacked as repairs. It returns, per port, the chains
// written and their rule counts.
func (b *Backend) rewritePorts(ctx context.Context, c *config, shapes []*shape, nat, filter *rules,
	reconcile, countRepairs bool, res *proxier.SyncResult) (map[model.ServicePortName][]string, map[model.ServicePortName]int, error) {
	written := map[model.ServicePortName][]string{}
	portRules := map[model.ServicePortName]int{}
	// What is there before anything is written: chains to delete, and to
	// count as repaired.
	existing := map[string][]string{}
	if reconcile {
		for _, table := range []string{"nat", "filter"} {
			save, err := b.r.Save(ctx, table)
			if err != nil {
				return nil, nil, err
			}
			maps.Copy(existing, ipt.Chains(save, Prefix))
		}
	} else {
		// After a successful sync: the dispatch chains and what it wrote.
		existing["nat"] = slices.Clone(natGlobal)
		for _, chs := range b.written {
			existing["nat"] = append(existing["nat"], chs...)
		}
	}
	want := map[string]bool{}
	// Every chunk but the last (which holds the rest with the dispatch
	// chains) is a transaction of its own, committed here.
	chunk := newRules(nil)
	// Port chains jump to DSPROXY-MARK-MASQ and DSPROXY-MASQ-NONLOCAL: a
	// chunk committed before the last creates the dispatch chains missing
	// (their rules follow in the last transaction, which declares them all).
	// Existing ones are not declared, which would flush them until then.
	var missing []string
	for _, ch := range natGlobal {
		if !slices.Contains(existing["nat"], ch) {
			missing = append(missing, ch)
		}
	}
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
				return nil, nil, err
			}
			res.Transactions++
			res.Operations += chunk.n
			chunk = newRules(nil)
		}
		n := chunk.n
		c.portChains(s, chunk)
		portRules[s.ps.Name] = chunk.n - n
		written[s.ps.Name] = s.chains()
		for _, ch := range written[s.ps.Name] {
			want[ch] = true
		}
	}
	nat.decl.WriteString(chunk.decl.String())
	nat.body.WriteString(chunk.body.String())
	nat.n += chunk.n
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
		for ch := range want {
			if !have[ch] {
				res.Repairs++
			}
		}
	}
	return written, portRules, nil
}

// changedPorts writes the chains of the ports in changed (those of a deleted port
// deleted) into nat, and returns the updated chains and rule counts per port.
func (b *Backend) changedPorts(c *config, changed []model.ServicePortName, byName map[model.ServicePortName]*shape,
	nat *rules) (map[model.ServicePortName][]string, map[model.ServicePortName]int) {
	written, portRules := maps.Clone(b.written), maps.Clone(b.portRules)
	for _, n := range changed {
		var now []string
		if s := byName[n]; s != nil {
			before := nat.n
			c.portChains(s, nat)
			portRules[n] = nat.n - before
			now = s.chains()
			written[n] = now
		} else {
			delete(written, n)
			delete(portRules, n)
		}
		for _, ch := range b.written[n] {
			if !slices.Contains(now, ch) {
				nat.delete(ch)
			}
		}
	}
	return written, portRules
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
	b.synced, b.written, b.portRules, b.content = false, map[model.ServicePortName][]string{}, map[model.ServicePortName]int{}, nil
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
