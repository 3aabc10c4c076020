package nft

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// Origin says where a traced packet comes from.
type Origin int

// Packet origins. The zero Origin is invalid, so that a test cannot forget it.
const (
	// OriginLocal: sent by a process on the node. It traverses the output hook (nat
	// and filter chains by priority) and postrouting, then input when its
	// destination (after DNAT) is local, as a packet looped back through lo does.
	OriginLocal Origin = iota + 1
	// OriginInbound: arriving on an interface (Packet.InIface). It traverses
	// prerouting, then input if its destination (after DNAT) is local, else forward
	// and postrouting.
	OriginInbound
)

// CtState is the conntrack state of a traced packet.
type CtState int

// Conntrack states. Only NEW packets traverse nat chains, as in the kernel.
const (
	CtNew CtState = iota
	CtEstablished
	CtInvalid
)

// Verdict is the fate of a traced packet.
type Verdict int

// Final verdicts.
const (
	Accept Verdict = iota + 1
	Drop
	Reject
)

func (v Verdict) String() string {
	switch v {
	case Accept:
		return "accept"
	case Drop:
		return "drop"
	case Reject:
		return "reject"
	}
	return fmt.Sprintf("verdict(%d)", int(v))
}

// Packet is a packet to trace.
type Packet struct {
	Family   *family.Family
	Src, Dst netip.AddrPort
	Proto    uint8 // unix.IPPROTO_TCP, IPPROTO_UDP, IPPROTO_SCTP, IPPROTO_ICMP...
	Origin   Origin
	InIface  string // for OriginInbound: what meta iifname sees
	OutIface string // optional: what meta oifname sees in forward/postrouting (output: "lo" for a local destination)
	CtState  CtState
	// CtStatus adds conntrack status bits (IPS_*) for established packets; the
	// tracer sets IPS_DST_NAT / IPS_SRC_NAT itself when it NATs.
	CtStatus uint32
	CtMark   uint32
	Mark     uint32
}

// Node is what the node's routing tables say, for fib and the routing decision.
type Node struct {
	// LocalAddrs are the node's addresses: fib ... type local is true for them and
	// for loopback, and packets to them are delivered locally.
	LocalAddrs []netip.Addr
}

// Result is what happened to a traced packet.
type Result struct {
	Verdict                Verdict
	RejectType, RejectCode uint8
	// DNAT is the destination after DNAT, zero when not DNATed.
	DNAT netip.AddrPort
	// SNAT is the source after snat; Masquerade says masquerade ran.
	SNAT       netip.AddrPort
	Masquerade bool
	// Local says the packet was delivered to the node (input) rather than forwarded
	// or sent out.
	Local bool
	// Mark is the packet mark at the end.
	Mark uint32
	// Trace lists the hooks, chains and rules evaluated, for failure messages:
	// "ip dsproxy nat-prerouting rule 2: [...] => accept".
	Trace []string
}

// maxTraceRuns bounds TraceAll's exploration of numgen outcomes.
const maxTraceRuns = 4096

// Trace evaluates the stored rules for p, the way the kernel would, and returns the
// outcome. Every numgen picks 0. Dynset updates (affinity) stay in the Fake, as in
// the kernel, so a second Trace sees them; elements never time out.
func (f *Fake) Trace(n Node, p Packet) (Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	tr, err := f.newTracer(n, p, nil)
	if err != nil {
		return Result{}, err
	}
	res, err := tr.run()
	if err != nil {
		return Result{}, err
	}
	tr.commitDynsets()
	return res, nil
}

// TraceAll returns every distinct outcome of p over all combinations of numgen
// values (deduplicated by verdict, reject type and code, DNAT, SNAT, masquerade and
// local delivery), in the order of the numgen values. Each outcome starts from the
// current state, and dynset updates are discarded.
func (f *Fake) TraceAll(n Node, p Packet) ([]Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	type outcome struct {
		v          Verdict
		rt, rc     uint8
		dnat, snat netip.AddrPort
		masq, loc  bool
	}
	var out []Result
	seen := map[outcome]bool{}
	var choices []uint32
	for run := 0; ; run++ {
		if run == maxTraceRuns {
			return nil, fmt.Errorf("nft trace: more than %d numgen combinations", maxTraceRuns)
		}
		tr, err := f.newTracer(n, p, choices)
		if err != nil {
			return nil, err
		}
		res, err := tr.run()
		if err != nil {
			return nil, err
		}
		k := outcome{res.Verdict, res.RejectType, res.RejectCode, res.DNAT, res.SNAT, res.Masquerade, res.Local}
		if !seen[k] {
			seen[k] = true
			out = append(out, res)
		}
		// Advance the numgen choices like an odometer, last draw first.
		choices = tr.taken
		i := len(choices) - 1
		for i >= 0 && choices[i]+1 >= tr.moduli[i] {
			i--
		}
		if i < 0 {
			return out, nil
		}
		choices = append(choices[:i:i], choices[i]+1)
	}
}

// tracer is one walk of one packet through the hooks.
type tracer struct {
	f      *Fake
	node   Node
	fam    *family.Family
	p      Packet
	src    netip.AddrPort
	dst    netip.AddrPort
	mark   uint32
	ctMark uint32
	status uint32
	iif    string
	oif    string
	res    Result

	// natDone records the NAT manipulations done (src, dst): once a nat chain sets
	// one up, later nat chains of that kind are skipped (nf_nat_inet_fn).
	natDone [2]bool

	choices []uint32 // numgen values to use, in draw order; 0 beyond
	taken   []uint32 // numgen values used
	moduli  []uint32

	dyn map[tableID]map[string]*fSet // copy-on-write dynset targets
}

// IPS_* conntrack status bits.
const (
	ipsSeenReply = 0x2
	ipsConfirmed = 0x8
	ipsSrcNAT    = 0x10
	ipsDstNAT    = 0x20
)

var errTrace = errors.New("nft trace")

func (f *Fake) newTracer(n Node, p Packet, choices []uint32) (*tracer, error) {
	if p.Family == nil || !p.Family.Contains(p.Src.Addr()) || !p.Family.Contains(p.Dst.Addr()) {
		return nil, fmt.Errorf("%w: packet %v -> %v does not match family %v", errTrace, p.Src, p.Dst, p.Family)
	}
	if p.Origin != OriginLocal && p.Origin != OriginInbound {
		return nil, fmt.Errorf("%w: packet origin unset", errTrace)
	}
	tr := &tracer{f: f, node: n, fam: p.Family, p: p, src: unmapAP(p.Src), dst: unmapAP(p.Dst),
		mark: p.Mark, ctMark: p.CtMark, status: p.CtStatus, choices: choices, dyn: map[tableID]map[string]*fSet{}}
	if p.CtState == CtEstablished {
		tr.status |= ipsConfirmed | ipsSeenReply
	}
	tr.res.Verdict = Accept
	return tr, nil
}

func unmapAP(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func (tr *tracer) logf(format string, args ...any) {
	tr.res.Trace = append(tr.res.Trace, fmt.Sprintf(format, args...))
}

// run walks the hooks for the packet's origin.
func (tr *tracer) run() (Result, error) {
	var hooks []*nftables.ChainHook
	local := false
	route := func() {
		local = tr.isLocal(tr.dst.Addr())
		tr.res.Local = local
	}
	if tr.p.Origin == OriginLocal {
		hooks = []*nftables.ChainHook{nftables.ChainHookOutput}
	} else {
		tr.iif = tr.p.InIface
		hooks = []*nftables.ChainHook{nftables.ChainHookPrerouting}
	}
	for i := 0; i < len(hooks); i++ {
		h := hooks[i]
		done, err := tr.runHook(h)
		if err != nil || done {
			tr.res.Mark = tr.mark
			return tr.res, err
		}
		// The routing decision follows the first hook, after DNAT.
		if i == 0 {
			route()
			switch {
			case tr.p.Origin == OriginLocal && local:
				tr.oif = "lo"
				hooks = append(hooks, nftables.ChainHookPostrouting, nftables.ChainHookInput)
			case tr.p.Origin == OriginLocal:
				tr.oif = tr.p.OutIface
				hooks = append(hooks, nftables.ChainHookPostrouting)
			case local:
				hooks = append(hooks, nftables.ChainHookInput)
			default:
				tr.oif = tr.p.OutIface
				hooks = append(hooks, nftables.ChainHookForward, nftables.ChainHookPostrouting)
			}
		}
		if *h == *nftables.ChainHookPostrouting && tr.p.Origin == OriginLocal && local {
			tr.iif, tr.oif = "lo", ""
		}
	}
	tr.res.Mark = tr.mark
	return tr.res, nil
}

func (tr *tracer) isLocal(a netip.Addr) bool {
	if tr.fam.Loopback.Contains(a) {
		return true
	}
	for _, l := range tr.node.LocalAddrs {
		if l.Unmap() == a {
			return true
		}
	}
	return false
}

type baseChain struct {
	table string
	c     *Chain
}

// hookChains returns the family's base chains on hook in the order the kernel runs
// them: by priority; ties (whose kernel order is registration order) by table and
// chain name.
func (tr *tracer) hookChains(h *nftables.ChainHook) []baseChain {
	var out []baseChain
	for id, t := range tr.f.tables {
		if id.proto != tr.fam.NFProto {
			continue
		}
		for _, c := range t.chains {
			if c.Hook != nil && *c.Hook == *h {
				out = append(out, baseChain{id.name, c})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if *a.c.Priority != *b.c.Priority {
			return *a.c.Priority < *b.c.Priority
		}
		if a.table != b.table {
			return a.table < b.table
		}
		return a.c.Name < b.c.Name
	})
	return out
}

// natManip returns which NAT a nat chain on hook h sets up: 0 source, 1 destination.
func natManip(h *nftables.ChainHook) int {
	if *h == *nftables.ChainHookPrerouting || *h == *nftables.ChainHookOutput {
		return 1
	}
	return 0
}

// runHook runs the base chains of one hook; done says the packet was dropped or
// rejected. An accept ends only the current base chain.
func (tr *tracer) runHook(h *nftables.ChainHook) (done bool, err error) {
	for _, bc := range tr.hookChains(h) {
		if bc.c.Type == nftables.ChainTypeNAT {
			if tr.p.CtState != CtNew {
				continue // only the first packet of a connection sees nat chains
			}
			if tr.natDone[natManip(h)] {
				continue
			}
		}
		tr.logf("%s %s %s: hook %s priority %d", tr.fam.NFTFamilyName, bc.table, bc.c.Name, hookName(h), *bc.c.Priority)
		v, err := tr.runBaseChain(bc.table, bc.c, h)
		if err != nil {
			return true, err
		}
		if v == Drop || v == Reject {
			tr.res.Verdict = v
			return true, nil
		}
	}
	return false, nil
}

type frame struct {
	c    *Chain
	next int
}

// runBaseChain runs one base chain with its jumps, gotos and returns.
func (tr *tracer) runBaseChain(table string, base *Chain, h *nftables.ChainHook) (Verdict, error) {
	t := tr.f.tables[tableID{tr.fam.NFProto, table}]
	var stack []frame
	cur, i := base, 0
	for {
		if i >= len(cur.Rules) {
			if len(stack) == 0 {
				return Accept, nil // end of the base chain: policy accept
			}
			cur, i = stack[len(stack)-1].c, stack[len(stack)-1].next
			stack = stack[:len(stack)-1]
			continue
		}
		v, err := tr.evalRule(t, cur, i, h)
		if err != nil {
			return 0, fmt.Errorf("%w: %s %s %s rule %d: %w", errTrace, tr.fam.NFTFamilyName, table, cur.Name, i, err)
		}
		switch v.Kind {
		case expr.VerdictContinue, expr.VerdictBreak:
			i++
		case expr.VerdictAccept:
			return Accept, nil
		case expr.VerdictDrop:
			return Drop, nil
		case verdictReject:
			return Reject, nil
		case expr.VerdictJump, expr.VerdictGoto:
			next, ok := t.chains[v.Chain]
			if !ok {
				return 0, fmt.Errorf("%w: jump to missing chain %s", errTrace, v.Chain)
			}
			if v.Kind == expr.VerdictJump {
				if len(stack) == maxJumpDepth {
					return 0, fmt.Errorf("%w: jump stack overflow at %s", errTrace, v.Chain)
				}
				stack = append(stack, frame{cur, i + 1})
			}
			cur, i = next, 0
		case expr.VerdictReturn:
			if len(stack) == 0 {
				return Accept, nil
			}
			cur, i = stack[len(stack)-1].c, stack[len(stack)-1].next
			stack = stack[:len(stack)-1]
		default:
			return 0, fmt.Errorf("%w: unsupported verdict %s", errTrace, verdictString(&v))
		}
	}
}

// verdictReject is an internal verdict kind for reject (the kernel sends the reply
// and returns NF_DROP).
const verdictReject expr.VerdictKind = 1 << 20

func (tr *tracer) commitDynsets() {
	for id, sets := range tr.dyn {
		t, ok := tr.f.tables[id]
		if !ok {
			continue
		}
		for name, s := range sets {
			t.sets[name] = s
		}
	}
}
