package nftables

import (
	"slices"
	"strconv"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// Chain names. Base chains hold only jumps (and "ct state invalid drop"), so the
// swap transaction of a cold start is small.
const (
	chainFilterPreroutingPreDNAT = "filter-prerouting-pre-dnat"
	chainFilterOutputPreDNAT     = "filter-output-pre-dnat"
	chainFilterInput             = "filter-input"
	chainFilterForward           = "filter-forward"
	chainFilterOutput            = "filter-output"
	chainNATPrerouting           = "nat-prerouting"
	chainNATOutput               = "nat-output"
	chainNATPostrouting          = "nat-postrouting"

	chainServices          = "services"
	chainClusterIP         = "clusterip"
	chainClusterIPLB       = "clusterip-lb"
	chainExternalLB        = "external-lb"
	chainNodePortLB        = "nodeport-lb"
	chainShortPod          = "short-circuit-pod"
	chainShortNode         = "short-circuit-node"
	chainMasquerading      = "masquerading"
	chainSvcEndpointsCheck = "service-endpoints-check"
	chainNPEndpointsCheck  = "nodeport-endpoints-check"
	chainClusterIPsCheck   = "cluster-ips-check"
	chainFirewallCheck     = "firewall-check"
)

type baseChain struct {
	name     string
	typ      nftables.ChainType
	hook     *nftables.ChainHook
	priority *nftables.ChainPriority
	rules    func(x exprs) []nft.Rule
}

func ctNewJump(chain string) nft.Rule {
	return nft.Rule{Exprs: append(ctState(expr.CtStateBitNEW), jump(chain))}
}

func plainJump(chain string) nft.Rule { return nft.Rule{Exprs: []expr.Any{jump(chain)}} }

// baseChains are kube-proxy's (v1.36) base chains, hooks and priorities.
var baseChains = []baseChain{
	{chainFilterPreroutingPreDNAT, nftables.ChainTypeFilter, nftables.ChainHookPrerouting, nftables.ChainPriorityRef(*nftables.ChainPriorityNATDest - 10),
		func(exprs) []nft.Rule { return []nft.Rule{ctNewJump(chainFirewallCheck)} }},
	{chainFilterOutputPreDNAT, nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityRef(*nftables.ChainPriorityNATDest - 10),
		func(exprs) []nft.Rule { return []nft.Rule{ctNewJump(chainFirewallCheck)} }},
	{chainFilterInput, nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter,
		func(exprs) []nft.Rule {
			return []nft.Rule{ctNewJump(chainNPEndpointsCheck), ctNewJump(chainSvcEndpointsCheck)}
		}},
	{chainFilterForward, nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter,
		func(x exprs) []nft.Rule {
			rules := []nft.Rule{ctNewJump(chainSvcEndpointsCheck), ctNewJump(chainClusterIPsCheck)}
			if x.keepInvalid {
				return rules
			}
			// As kube-proxy's iptables mode (KUBE-FORWARD) without
			// nf_conntrack_tcp_be_liberal: a packet conntrack cannot place would
			// otherwise be forwarded un-NATed with a service address.
			invalid := nft.Rule{Exprs: append(ctState(expr.CtStateBitINVALID), verdict(expr.VerdictDrop)), Comment: "drop ct state invalid"}
			return append([]nft.Rule{invalid}, rules...)
		}},
	{chainFilterOutput, nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityFilter,
		func(exprs) []nft.Rule {
			return []nft.Rule{ctNewJump(chainSvcEndpointsCheck), ctNewJump(chainClusterIPsCheck)}
		}},
	{chainNATPrerouting, nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest,
		func(exprs) []nft.Rule { return []nft.Rule{plainJump(chainServices)} }},
	{chainNATOutput, nftables.ChainTypeNAT, nftables.ChainHookOutput, nftables.ChainPriorityNATDest,
		func(exprs) []nft.Rule { return []nft.Rule{plainJump(chainServices)} }},
	{chainNATPostrouting, nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource,
		func(exprs) []nft.Rule { return []nft.Rule{plainJump(chainMasquerading)} }},
}

func (x exprs) baseChainList() []*nft.Chain {
	out := make([]*nft.Chain, 0, len(baseChains))
	for _, bc := range baseChains {
		out = append(out, &nft.Chain{Name: bc.name, Type: bc.typ, Hook: bc.hook, Priority: bc.priority, Rules: bc.rules(x)})
	}
	return out
}

// chainInputs is everything the regular chains depend on.
type chainInputs struct {
	node   *proxier.NodeConfig
	groups []group  // in creation order
	ids    []uint32 // ids[i] is groups[i]'s
	fwBits []int    // sorted
}

func isBaseChain(name string) bool {
	return slices.ContainsFunc(baseChains, func(bc baseChain) bool { return bc.name == name })
}

// vmapDef is the definition of use chain use's verdict map.
func vmapDef(use string) *nft.Set {
	return &nft.Set{Name: groupVmap(use), IsMap: true, KeyType: nftables.TypeMark, DataType: nftables.TypeVerdict}
}

func vmapElement(id uint32, chain string) nft.Element {
	return nft.Element{Key: nft.MarkBytes(id), Verdict: &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}}
}

// groupVmaps returns the verdict maps' elements for in: per use chain, group id
// → group chain.
func groupVmaps(in chainInputs) map[string]map[uint32]string {
	out := make(map[string]map[uint32]string, len(useChains))
	for _, use := range useChains {
		out[use] = map[uint32]string{}
	}
	for i, g := range in.groups {
		for _, u := range kinds[g.kind].uses {
			out[u.chain][in.ids[i]] = groupChain(u.chain, g)
		}
	}
	return out
}

// regularChains returns the regular chains for in, in dependency order (a chain
// comes after the chains it jumps to; the group chains, reached through the
// verdict maps, first). It is a pure function.
//
// A new connection walks them in the NAT prerouting/output hook, service or not,
// so they are laid out for few expressions per packet: only packets to a ClusterIP
// enter clusterip (masquerade decision) and clusterip-lb (one dispatch rule: the
// frontend's group, then its chain, whatever the number of groups); the NodePort
// rules sit in nodeport-lb behind one NodePort-address test; the services chain
// jumps only to chains that have rules.
func (x exprs) regularChains(in chainInputs) []*nft.Chain {
	byChain := map[string][]nft.Rule{}
	matchAll := in.node.NodePortAddresses.MatchAll
	var out []*nft.Chain
	var present [numKinds]bool
	for _, g := range in.groups {
		present[g.kind] = true
		for _, u := range kinds[g.kind].uses {
			out = append(out, &nft.Chain{Name: groupChain(u.chain, g), Rules: x.groupRules(g, u.masq)})
		}
	}
	for k := range numKinds {
		if !present[k] {
			continue
		}
		for _, u := range kinds[k].uses {
			byChain[u.chain] = append(byChain[u.chain], x.dispatchRule(k, u.chain, u.chain != chainNodePortLB, matchAll))
		}
	}
	ext := byChain[chainExternalLB]
	if len(byChain[chainNodePortLB]) > 0 {
		ext = append(ext, nft.Rule{Exprs: append(x.nodePortOnly(matchAll), jump(chainNodePortLB)), Comment: "nodeports"})
	}
	return append(out, []*nft.Chain{
		{Name: chainClusterIPLB, Rules: byChain[chainClusterIPLB]},
		{Name: chainNodePortLB, Rules: byChain[chainNodePortLB]},
		{Name: chainExternalLB, Rules: ext},
		{Name: chainShortPod, Rules: byChain[chainShortPod]},
		{Name: chainShortNode, Rules: byChain[chainShortNode]},
		{Name: chainClusterIP, Rules: x.clusterIPRules(in.node)},
		{Name: chainServices, Rules: x.servicesRules(in.node, len(byChain[chainShortPod]) > 0, len(byChain[chainShortNode]) > 0, len(ext) > 0)},
		{Name: chainMasquerading, Rules: x.masqueradingRules()},
		{Name: chainSvcEndpointsCheck, Rules: x.serviceEndpointsCheck()},
		{Name: chainNPEndpointsCheck, Rules: x.nodePortEndpointsCheck(matchAll)},
		{Name: chainClusterIPsCheck, Rules: x.clusterIPsCheck(in.node)},
		{Name: chainFirewallCheck, Rules: x.firewallCheck(in.fwBits)},
	}...)
}

// clusterIPRules are what a packet to a ClusterIP goes through: the masquerade
// decision, then the per-count rules.
func (x exprs) clusterIPRules(node *proxier.NodeConfig) []nft.Rule {
	var out []nft.Rule
	if node.MasqueradeAll {
		out = append(out, nft.Rule{Exprs: x.setMasqMark(r8), Comment: "masquerade all clusterIP traffic"})
	} else if m, ok := nonLocalMatch(x, node.Local); ok {
		out = append(out, nft.Rule{Exprs: append(m, x.setMasqMark(r8)...), Comment: "masquerade clusterIP traffic from outside the cluster"})
	}
	return append(out, nft.Rule{Exprs: []expr.Any{jump(chainClusterIPLB)}})
}

// servicesRules is the NAT dispatch: ClusterIPs, the ETP Local short-circuit for
// local pods and the node, then external destinations. Chains without rules are
// not jumped to.
func (x exprs) servicesRules(node *proxier.NodeConfig, shortPod, shortNode, external bool) []nft.Rule {
	out := []nft.Rule{{Exprs: []expr.Any{x.daddr(r8), lookup(fixedSetNames[setClusterIPs], r8), jump(chainClusterIP)}, Comment: "clusterIP traffic"}}
	if shortPod {
		for _, m := range localMatch(x, node.Local) {
			out = append(out, nft.Rule{Exprs: append(m, jump(chainShortPod)), Comment: "short-circuit pod traffic to ETP Local"})
		}
	}
	if shortNode {
		out = append(out, nft.Rule{Exprs: append(fibSaddrLocal(), jump(chainShortNode)), Comment: "short-circuit node traffic to ETP Local"})
	}
	if external {
		out = append(out, nft.Rule{Exprs: []expr.Any{jump(chainExternalLB)}})
	}
	return out
}

// nodePortOnly matches packets to a NodePort address that are not to an
// ExternalIP or load-balancer IP (of a port with endpoints) at that port: as in
// kube-proxy, where @service-ips is looked up before the NodePorts, an ExternalIP
// equal to a node IP serves its own Service at another Service's NodePort, from
// everywhere, and an ETP Local one without local endpoints drops there.
//
//	<NodePort address test> ip daddr . meta l4proto . th dport != @external-frontends
func (x exprs) nodePortOnly(matchAll bool) []expr.Any {
	e := append(nodePortMatch(x, matchAll), x.vipKey(r8)...)
	return append(e, &expr.Lookup{SourceRegister: r8, SetName: fixedSetNames[setExternalFrontends], Invert: true})
}

// dispatchRule sends a packet of kind k in chain use to its group's chain:
//
//	[NodePort address test] meta mark set <key> map @<kind>-groups
//	  meta mark set meta mark  meta mark vmap @<use>-groups
//
// The group id looked up by the key selects the verdict map element. nft before
// 1.1 asserts when it lists a rule whose lookup key holds another lookup's result,
// so the id passes through the packet mark within the rule (as the affinity hit
// rule's index does): save the mark, set it to the id, load it back as the verdict
// map's key, restore the saved mark. A key not in the map ends the rule before
// the mark is touched. The NodePort kinds test the NodePort addresses first when
// npCheck (in nodeport-lb a rule before the jump did).
func (x exprs) dispatchRule(k kind, use string, npCheck, npMatchAll bool) nft.Rule {
	ki := kinds[k]
	var e []expr.Any
	if ki.nodePort && npCheck {
		e = x.nodePortOnly(npMatchAll)
	}
	load, kl := x.frontendKey(k)
	saved, id, key := r8+kl, r8+kl+1, r8+kl+2
	e = append(e, &expr.Meta{Key: expr.MetaKeyMARK, Register: saved})
	e = append(e, load(r8)...)
	e = append(e,
		lookupMap(fixedSetNames[kindMap(k)], r8, id),
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: id},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: key},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: saved},
		&expr.Lookup{SourceRegister: key, DestRegister: unix.NFT_REG_VERDICT, IsDestRegSet: true, SetName: groupVmap(use)})
	return nft.Rule{Exprs: e, Comment: ki.prefix + " dispatch"}
}

// groupRules returns the rules of one dispatch group's chain in one use chain:
//
//	[mark |= 0x4000]  dnat to key . numgen random mod N [offset S] map @endpoints
//
// and with ClientIP affinity two rules: reuse a still-usable @affinity entry, else
// pick an endpoint and record it. The NodePort kinds use the l4proto . dport key,
// @nodeport-endpoints and @nodeport-affinity. The dispatch rule checked the key.
//
// Every lookup key is made of registers loaded from the packet (or numgen, or meta
// mark): nft before 1.1 asserts when it lists a rule whose lookup key or dynset data
// holds another lookup's result, so no rule chains one map into another.
func (x exprs) groupRules(g group, masq bool) []nft.Rule {
	ki := kinds[g.kind]
	comment := g.name()
	if masq {
		comment += " masquerade"
	}
	key, kl := x.frontendKey(g.kind)
	eps := fixedSetNames[setEndpoints]
	if ki.nodePort {
		eps = fixedSetNames[setNodePortEndpoints]
	}
	if g.timeout == 0 {
		ng := r8 + kl
		rd := ng + 1
		e := key(r8)
		if masq {
			e = append(e, x.setMasqMark(rd)...)
		}
		e = append(e, &expr.Numgen{Register: ng, Modulus: g.n, Type: unix.NFT_NG_RANDOM, Offset: ki.offset()},
			lookupMap(eps, r8, rd), x.dnat(rd))
		return []nft.Rule{{Exprs: e, Comment: comment}}
	}
	aff := fixedSetNames[setAffinity]
	if ki.nodePort {
		aff = fixedSetNames[setNodePortAffinity]
	}
	return x.affinityRules(g, affinityRegs{key: key, kl: kl, eps: eps, aff: aff, masq: masq}, comment)
}

// frontendKey returns what loads kind k's frontend key into a register (vip key
// daddr . l4proto . dport, or the NodePort kinds' l4proto . dport) and how many
// registers it takes.
func (x exprs) frontendKey(k kind) (load func(reg uint32) []expr.Any, regs uint32) {
	if kinds[k].nodePort {
		return npKey, 2
	}
	return x.vipKey, x.a + 2
}

// affinityRegs describes one group's affinity rules.
type affinityRegs struct {
	key      func(reg uint32) []expr.Any // loads the key
	kl       uint32                      // key registers
	eps, aff string                      // endpoint and affinity maps
	masq     bool
}

// affinityRules: s = saddr, d = key, ix = the endpoint index right after the key.
// @affinity maps saddr . key to the index of the client's endpoint (the numgen
// value, including the list's offset). An entry is usable while its slot holds
// an endpoint; a sync that moves an endpoint to another slot moves its clients'
// entries too, and drops those of a removed endpoint whose slot another took
// (affinity.go), so a client keeps its endpoint while it stays, and picks afresh
// once it goes.
//
// The hit rule needs the index from @affinity inside the @endpoints key, and nft
// (before 1.1) can't list a lookup keyed by another lookup's result. So the index
// passes through the packet mark within the rule: save the mark, set it to the
// looked-up index, load it back as the key's last field, restore the saved mark
// (with the masquerade bit when the group masquerades). nft lists this as
//
//	meta mark set ip saddr . <key> map @affinity meta mark set meta mark [| 0x4000]
//	update @affinity { ip saddr . <key> timeout T : meta mark }
//	dnat to <key> . meta mark map @endpoints
//
// where the "meta mark" in the last two reads the index; the mark the packet
// carries after the rule is its own (plus the masquerade bit).
func (x exprs) affinityRules(g group, r affinityRegs, comment string) []nft.Rule {
	s := uint32(r8)
	d := s + x.a
	ix := d + r.kl
	timeout := time.Duration(g.timeout) * time.Second
	load := append([]expr.Any{x.saddr(s)}, r.key(d)...)

	saved, found := ix+1, ix+2
	hit := append(clone(load),
		&expr.Meta{Key: expr.MetaKeyMARK, Register: saved},
		lookupMap(r.aff, s, found),
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: found},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: ix})
	if r.masq {
		hit = append(hit, &expr.Bitwise{SourceRegister: saved, DestRegister: saved, Len: 4,
			Mask: nft.MarkBytes(^x.masq), Xor: nft.MarkBytes(x.masq)})
	}
	rd := ix + 1
	hit = append(hit,
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: saved},
		&expr.Dynset{SrcRegKey: s, SrcRegData: ix, SetName: r.aff, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: timeout},
		lookupMap(r.eps, d, rd),
		x.dnat(rd))

	pick := clone(load)
	if r.masq {
		pick = append(pick, x.setMasqMark(rd)...)
	}
	pick = append(pick,
		&expr.Numgen{Register: ix, Modulus: g.n, Type: unix.NFT_NG_RANDOM, Offset: kinds[g.kind].offset()},
		lookupMap(r.eps, d, rd),
		// A stale entry (its index now out of range) is replaced; a dynset on a map
		// needs a data register even to delete.
		&expr.Dynset{SrcRegKey: s, SrcRegData: ix, SetName: r.aff, Operation: nftDynsetOpDelete},
		&expr.Dynset{SrcRegKey: s, SrcRegData: ix, SetName: r.aff, Operation: unix.NFT_DYNSET_OP_ADD, Timeout: timeout},
		x.dnat(rd))

	// A full @affinity (its size bounds kernel memory) breaks the pick rule at
	// its add, before the DNAT: the client then gets an endpoint without
	// stickiness, as from kube-proxy's full affinity sets, not no DNAT at all.
	full := r.key(d)
	if r.masq {
		full = append(full, x.setMasqMark(rd)...)
	}
	full = append(full,
		&expr.Numgen{Register: ix, Modulus: g.n, Type: unix.NFT_NG_RANDOM, Offset: kinds[g.kind].offset()},
		lookupMap(r.eps, d, rd),
		x.dnat(rd))
	return []nft.Rule{{Exprs: hit, Comment: comment + " affinity hit"}, {Exprs: pick, Comment: comment + " affinity pick"},
		{Exprs: full, Comment: comment + " affinity full"}}
}

func (x exprs) masqueradingRules() []nft.Rule {
	return []nft.Rule{
		{Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: nft.MarkBytes(x.masq), Xor: nft.MarkBytes(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: nft.MarkBytes(0)},
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: nft.MarkBytes(^x.masq), Xor: nft.MarkBytes(0)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
			&expr.Masq{FullyRandom: true},
		}, Comment: "masquerade marked"},
		{Exprs: append(append([]expr.Any{&expr.Ct{Key: expr.CtKeySTATUS, Register: 1}}, bitTest(1, ipsDstNAT)...),
			x.saddr(r8), x.daddr(r8+x.a), lookup(fixedSetNames[setHairpin], r8), &expr.Masq{FullyRandom: true}),
			Comment: "masquerade hairpin"},
	}
}

func (x exprs) serviceEndpointsCheck() []nft.Rule {
	noEP := append(x.vipKey(r8), lookup(fixedSetNames[setNoEndpointServices], r8))
	out := x.rejectPair(noEP, r8+x.a, "service without endpoints")
	drop := append(x.vipKey(r8), lookup(fixedSetNames[setNoLocalEndpointServices], r8), verdict(expr.VerdictDrop))
	return append(out, nft.Rule{Exprs: drop, Comment: "service without local endpoints"})
}

func (x exprs) nodePortEndpointsCheck(matchAll bool) []nft.Rule {
	m := func(set fixedSet) []expr.Any {
		return append(append(nodePortMatch(x, matchAll), npKey(r8)...), lookup(fixedSetNames[set], r8))
	}
	out := x.rejectPair(m(setNoEndpointNodePorts), r8, "nodeport without endpoints")
	out = append(out, x.rejectPair(m(setReservedNodePorts), r8, "nodeport of the other family")...)
	drop := append(m(setNoLocalEndpointNodePorts), verdict(expr.VerdictDrop))
	return append(out, nft.Rule{Exprs: drop, Comment: "nodeport without local endpoints"})
}

func (x exprs) clusterIPsCheck(node *proxier.NodeConfig) []nft.Rule {
	m := []expr.Any{x.daddr(r8), lookup(fixedSetNames[setClusterIPs], r8), l4proto(r8 + x.a)}
	out := x.rejectPair(m, r8+x.a, "invalid port of a ClusterIP")
	for _, p := range node.ServiceCIDRs {
		if !x.f.ContainsPrefix(p) {
			continue
		}
		e := append(append([]expr.Any{x.daddr(r8)}, prefixMatch(r8, p, expr.CmpOpEq)...), verdict(expr.VerdictDrop))
		out = append(out, nft.Rule{Exprs: e, Comment: "unallocated ClusterIP in " + p.String()})
	}
	return out
}

// firewallCheck applies loadBalancerSourceRanges without interval sets: one rule per
// prefix length L in use looks up daddr . l4proto . dport . (saddr & /L) in
// @fw-allow-L, then the remaining traffic to a guarded VIP is dropped.
func (x exprs) firewallCheck(bits []int) []nft.Rule {
	var out []nft.Rule
	src := r8 + x.a + 2
	for _, b := range bits {
		e := append(x.vipKey(r8), x.saddr(src), maskExpr(src, x.f.BitLen, b), lookup(fwKey(b).name(), r8), verdict(expr.VerdictReturn))
		out = append(out, nft.Rule{Exprs: e, Comment: "allowed sources /" + strconv.Itoa(b)})
	}
	drop := append(x.vipKey(r8), lookup(fixedSetNames[setFirewallIPs], r8), verdict(expr.VerdictDrop))
	return append(out, nft.Rule{Exprs: drop, Comment: "drop sources outside loadBalancerSourceRanges"})
}

// chainsEqual reports whether two chains print the same (nft.FormatRule depends only
// on what the kernel keeps).
func chainsEqual(a, b *nft.Chain) bool {
	if a == nil || b == nil {
		return a == b
	}
	if a.Name != b.Name || (a.Hook == nil) != (b.Hook == nil) || len(a.Rules) != len(b.Rules) {
		return false
	}
	return rulesEqual(a.Rules, b.Rules)
}

// rulesEqual compares rules by their canonical text, which ignores what the
// kernel's read-back changes (see nft.Netlink.ListChains).
func rulesEqual(a, b []nft.Rule) bool {
	return slices.EqualFunc(a, b, func(r, s nft.Rule) bool { return nft.FormatRule(r) == nft.FormatRule(s) })
}
