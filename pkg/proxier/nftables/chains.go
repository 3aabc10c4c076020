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
	chainClusterIPLB       = "clusterip-lb"
	chainExternalLB        = "external-lb"
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
		func(exprs) []nft.Rule {
			// As kube-proxy's iptables mode (KUBE-FORWARD): a packet conntrack cannot
			// place would otherwise be forwarded un-NATed with a service address.
			invalid := nft.Rule{Exprs: append(ctState(expr.CtStateBitINVALID), verdict(expr.VerdictDrop)), Comment: "drop ct state invalid"}
			return []nft.Rule{invalid, ctNewJump(chainSvcEndpointsCheck), ctNewJump(chainClusterIPsCheck)}
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
	groups []group // sorted
	fwBits []int   // sorted
}

// regularChains returns the regular chains for in, in dependency order (a chain
// comes after the chains it jumps to). It is a pure function.
func (x exprs) regularChains(in chainInputs) []*nft.Chain {
	byChain := map[string][]nft.Rule{}
	for _, g := range in.groups {
		for _, u := range kinds[g.kind].uses {
			byChain[u.chain] = append(byChain[u.chain], x.groupRules(g, u.masq, in.node.NodePortAddresses.MatchAll)...)
		}
	}
	return []*nft.Chain{
		{Name: chainClusterIPLB, Rules: byChain[chainClusterIPLB]},
		{Name: chainExternalLB, Rules: byChain[chainExternalLB]},
		{Name: chainShortPod, Rules: byChain[chainShortPod]},
		{Name: chainShortNode, Rules: byChain[chainShortNode]},
		{Name: chainServices, Rules: x.servicesRules(in.node)},
		{Name: chainMasquerading, Rules: x.masqueradingRules()},
		{Name: chainSvcEndpointsCheck, Rules: x.serviceEndpointsCheck()},
		{Name: chainNPEndpointsCheck, Rules: x.nodePortEndpointsCheck(in.node.NodePortAddresses.MatchAll)},
		{Name: chainClusterIPsCheck, Rules: x.clusterIPsCheck(in.node)},
		{Name: chainFirewallCheck, Rules: x.firewallCheck(in.fwBits)},
	}
}

// servicesRules is the NAT dispatch: ClusterIP masquerade decision, ClusterIPs, the
// ETP Local short-circuit for local pods and the node, then external destinations.
func (x exprs) servicesRules(node *proxier.NodeConfig) []nft.Rule {
	var out []nft.Rule
	cips := []expr.Any{x.daddr(r8), lookup(fixedSetNames[setClusterIPs], r8)}
	if node.MasqueradeAll {
		out = append(out, nft.Rule{Exprs: append(cips, setMasqMark(r8)...), Comment: "masquerade all clusterIP traffic"})
	} else if m, ok := nonLocalMatch(x, node.Local); ok {
		out = append(out, nft.Rule{Exprs: append(append(m, cips...), setMasqMark(r8)...), Comment: "masquerade clusterIP traffic from outside the cluster"})
	}
	out = append(out, nft.Rule{Exprs: []expr.Any{jump(chainClusterIPLB)}})
	for _, m := range localMatch(x, node.Local) {
		out = append(out, nft.Rule{Exprs: append(m, jump(chainShortPod)), Comment: "short-circuit pod traffic to ETP Local"})
	}
	out = append(out,
		nft.Rule{Exprs: append(fibSaddrLocal(), jump(chainShortNode)), Comment: "short-circuit node traffic to ETP Local"},
		nft.Rule{Exprs: []expr.Any{jump(chainExternalLB)}})
	return out
}

// groupRules returns the rules of one dispatch group in one chain:
//
//	key @set [map to target]  [mark |= 0x4000]  dnat to target . numgen random mod N map @endpoints
//
// and with ClientIP affinity two rules: reuse a still-valid @affinity entry, else
// pick an endpoint and record it.
func (x exprs) groupRules(g group, masq, npMatchAll bool) []nft.Rule {
	ki := kinds[g.kind]
	var pre []expr.Any
	if ki.nodePort {
		pre = nodePortMatch(x, npMatchAll)
	}
	set := g.name()
	comment := set
	if masq {
		comment += " masquerade"
	}
	key := func(reg uint32) []expr.Any {
		var e []expr.Any
		if ki.nodePort {
			e = npKey(reg)
		} else {
			e = x.vipKey(reg)
		}
		if ki.remap {
			return append(e, lookupMap(set, reg, reg))
		}
		return append(e, lookup(set, reg))
	}
	mark := func(scratch uint32) []expr.Any {
		if masq {
			return setMasqMark(scratch)
		}
		return nil
	}
	eps := fixedSetNames[setEndpoints]
	if g.timeout == 0 {
		ng := r8 + x.a + 2
		rd := ng + 1
		e := append(clone(pre), key(r8)...)
		e = append(e, mark(rd)...)
		e = append(e, &expr.Numgen{Register: ng, Modulus: g.n, Type: unix.NFT_NG_RANDOM},
			lookupMap(eps, r8, rd), x.dnat(rd))
		return []nft.Rule{{Exprs: e, Comment: comment}}
	}
	return x.affinityRules(g, pre, key, mark, comment)
}

// affinityRules: s = saddr, d = target key, rd = endpoint. The @affinity key is
// saddr . target, so affinity holds per service port whichever address was used.
func (x exprs) affinityRules(g group, pre []expr.Any, key func(uint32) []expr.Any, mark func(uint32) []expr.Any, comment string) []nft.Rule {
	s := uint32(r8)
	d := s + x.a
	rd := d + x.a + 2
	aff, valid, eps := fixedSetNames[setAffinity], fixedSetNames[setEndpointValid], fixedSetNames[setEndpoints]
	timeout := time.Duration(g.timeout) * time.Second
	load := append(append(clone(pre), x.saddr(s)), key(d)...)

	hit := append(clone(load), lookupMap(aff, s, rd), lookup(valid, d))
	hit = append(hit, mark(rd+x.a+1)...)
	hit = append(hit,
		&expr.Dynset{SrcRegKey: s, SrcRegData: rd, SetName: aff, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: timeout},
		x.dnat(rd))

	ng := d + x.a + 2
	re := ng + 1
	pick := append(clone(load), mark(re)...)
	pick = append(pick,
		&expr.Numgen{Register: ng, Modulus: g.n, Type: unix.NFT_NG_RANDOM},
		lookupMap(eps, d, re),
		// A dynset on a map needs a data register even to delete.
		&expr.Dynset{SrcRegKey: s, SrcRegData: re, SetName: aff, Operation: nftDynsetOpDelete},
		&expr.Dynset{SrcRegKey: s, SrcRegData: re, SetName: aff, Operation: unix.NFT_DYNSET_OP_ADD, Timeout: timeout},
		x.dnat(re))
	return []nft.Rule{{Exprs: hit, Comment: comment + " affinity hit"}, {Exprs: pick, Comment: comment + " affinity pick"}}
}

func (x exprs) masqueradingRules() []nft.Rule {
	return []nft.Rule{
		{Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: nft.MarkBytes(masqMark), Xor: nft.MarkBytes(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: nft.MarkBytes(0)},
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: nft.MarkBytes(^uint32(masqMark)), Xor: nft.MarkBytes(0)},
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
	return slices.EqualFunc(a.Rules, b.Rules, func(r, s nft.Rule) bool { return nft.FormatRule(r) == nft.FormatRule(s) })
}
