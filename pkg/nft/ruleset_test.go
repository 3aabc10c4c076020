package nft

import (
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// testRuleset builds the spike's "shape B" ruleset for one family: a set per
// endpoint count, one shared endpoint map, a NodePort map, ClientIP affinity, the
// masquerade mark and the no-endpoints reject. It exercises every expression the
// tracer supports.
type testRuleset struct {
	fam  *family.Family
	a    uint32 // 32-bit registers per address
	addr nftables.SetDatatype
}

const (
	testTable = "dsproxy"
	r8        = unix.NFT_REG32_00
	masqMark  = 0x4000
)

func newTestRuleset(fam *family.Family) *testRuleset {
	rs := &testRuleset{fam: fam, a: fam.AddrLen / 4, addr: nftables.TypeIPAddr}
	if fam.AddrLen == 16 {
		rs.addr = nftables.TypeIP6Addr
	}
	return rs
}

func (rs *testRuleset) svcType() nftables.SetDatatype {
	return nftables.MustConcatSetType(rs.addr, nftables.TypeInetProto, nftables.TypeInetService)
}

func (rs *testRuleset) epType() nftables.SetDatatype {
	return nftables.MustConcatSetType(rs.addr, nftables.TypeInetService)
}

func (rs *testRuleset) saddr(r uint32) expr.Any {
	return &expr.Payload{DestRegister: r, Base: expr.PayloadBaseNetworkHeader, Offset: rs.fam.SaddrOffset, Len: rs.fam.AddrLen}
}

func (rs *testRuleset) daddr(r uint32) expr.Any {
	return &expr.Payload{DestRegister: r, Base: expr.PayloadBaseNetworkHeader, Offset: rs.fam.DaddrOffset, Len: rs.fam.AddrLen}
}

func l4proto(r uint32) expr.Any { return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: r} }

func thDport(r uint32) expr.Any {
	return &expr.Payload{DestRegister: r, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
}

func (rs *testRuleset) svcKey() []expr.Any {
	return []expr.Any{rs.daddr(r8), l4proto(r8 + rs.a), thDport(r8 + rs.a + 1)}
}

func (rs *testRuleset) dnat(r uint32) expr.Any {
	return &expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(rs.fam.NFProto), RegAddrMin: r, RegProtoMin: r + rs.a, Specified: true}
}

func ctStateIs(bit uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: MarkBytes(bit), Xor: MarkBytes(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: MarkBytes(0)},
	}
}

func natChain(name string, hook *nftables.ChainHook, prio *nftables.ChainPriority, rules ...Rule) *Chain {
	return &Chain{Name: name, Hook: hook, Priority: prio, Type: nftables.ChainTypeNAT, Rules: rules}
}

func filterChain(name string, hook *nftables.ChainHook, rules ...Rule) *Chain {
	return &Chain{Name: name, Hook: hook, Priority: nftables.ChainPriorityFilter, Type: nftables.ChainTypeFilter, Rules: rules}
}

func rule(comment string, e ...expr.Any) Rule { return Rule{Exprs: e, Comment: comment} }

// base queues the table, sets and chains (with service rules for counts 2, and
// affinity for count 2 with a 3h timeout).
func (rs *testRuleset) base(tx *Tx) {
	tx.AddTable(testTable)
	svcT, epT := rs.svcType(), rs.epType()
	sets := []*Set{
		{Name: "svc-2", KeyType: svcT, Concat: true},
		{Name: "aff-2", KeyType: svcT, Concat: true},
		{Name: "no-endpoints", KeyType: svcT, Concat: true},
		{Name: "endpoints", KeyType: nftables.MustConcatSetType(rs.addr, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeInteger),
			DataType: epT, IsMap: true, Concat: true},
		{Name: "np-2", KeyType: nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService),
			DataType: svcT, IsMap: true, Concat: true},
		{Name: "affinity", KeyType: nftables.MustConcatSetType(rs.addr, rs.addr, nftables.TypeInetProto, nftables.TypeInetService),
			DataType: epT, IsMap: true, Concat: true, Timeout: true, Dynamic: true, Size: 65535},
	}
	for _, s := range sets {
		tx.AddSet(testTable, s)
	}
	tx.SetChain(testTable, &Chain{Name: "aff-2", Rules: rs.affinityRules(2, 3*time.Hour)})
	tx.SetChain(testTable, &Chain{Name: "services", Rules: rs.serviceRules()})
	jump := rule("", &expr.Verdict{Kind: expr.VerdictJump, Chain: "services"})
	tx.SetChain(testTable, natChain("nat-prerouting", nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest, jump))
	tx.SetChain(testTable, natChain("nat-output", nftables.ChainHookOutput, nftables.ChainPriorityNATDest, jump))
	tx.SetChain(testTable, natChain("nat-postrouting", nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource, rs.masqRule()))
	for _, h := range []struct {
		name string
		hook *nftables.ChainHook
	}{{"filter-input", nftables.ChainHookInput}, {"filter-forward", nftables.ChainHookForward}, {"filter-output", nftables.ChainHookOutput}} {
		tx.SetChain(testTable, filterChain(h.name, h.hook, rs.rejectRules()...))
	}
}

func (rs *testRuleset) serviceRules() []Rule {
	ng := uint32(r8 + rs.a + 2)
	rD := ng + 1
	clusterIP := append(rs.svcKey(),
		&expr.Lookup{SourceRegister: r8, SetName: "svc-2"},
		&expr.Numgen{Register: ng, Modulus: 2, Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: r8, DestRegister: rD, IsDestRegSet: true, SetName: "endpoints"},
		rs.dnat(rD))
	affinity := append(rs.svcKey(),
		&expr.Lookup{SourceRegister: r8, SetName: "aff-2"},
		&expr.Verdict{Kind: expr.VerdictGoto, Chain: "aff-2"})
	mr := rD + rs.a + 1
	nodePort := []expr.Any{
		&expr.Fib{Register: r8, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: r8, Data: MarkBytes(unix.RTN_LOCAL)},
		l4proto(r8), thDport(r8 + 1),
		&expr.Lookup{SourceRegister: r8, DestRegister: r8, IsDestRegSet: true, SetName: "np-2"},
		&expr.Numgen{Register: ng, Modulus: 2, Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: r8, DestRegister: rD, IsDestRegSet: true, SetName: "endpoints"},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: mr},
		&expr.Bitwise{SourceRegister: mr, DestRegister: mr, Len: 4, Mask: MarkBytes(^uint32(masqMark)), Xor: MarkBytes(masqMark)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: mr},
		rs.dnat(rD),
	}
	return []Rule{rule("cluster IPs, 2 endpoints", clusterIP...), rule("", affinity...), rule("node ports, 2 endpoints", nodePort...)}
}

// affinityRules is the spike's aff-N-T chain: a sticky hit refreshes the entry, a
// miss (or stale entry) picks an endpoint and records it.
func (rs *testRuleset) affinityRules(n uint32, timeout time.Duration) []Rule {
	s := uint32(r8)
	d := s + rs.a
	q := d + rs.a + 1
	rD := q + 1
	load := func() []expr.Any { return []expr.Any{rs.saddr(s), rs.daddr(d), l4proto(d + rs.a), thDport(q)} }
	hit := append(load(),
		&expr.Lookup{SourceRegister: s, DestRegister: rD, IsDestRegSet: true, SetName: "affinity"},
		&expr.Dynset{SrcRegKey: s, SrcRegData: rD, SetName: "affinity", Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: timeout},
		rs.dnat(rD))
	ng, rE := q+1, q+2
	miss := append(load(),
		&expr.Numgen{Register: ng, Modulus: n, Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: d, DestRegister: rE, IsDestRegSet: true, SetName: "endpoints"},
		&expr.Dynset{SrcRegKey: s, SrcRegData: rE, SetName: "affinity", Operation: nftDynsetOpDelete},
		&expr.Dynset{SrcRegKey: s, SrcRegData: rE, SetName: "affinity", Operation: unix.NFT_DYNSET_OP_ADD, Timeout: timeout},
		rs.dnat(rE))
	return []Rule{rule("sticky", hit...), rule("pick", miss...)}
}

func (rs *testRuleset) masqRule() Rule {
	return rule("masquerade marked",
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: MarkBytes(masqMark), Xor: MarkBytes(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: MarkBytes(0)},
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: MarkBytes(^uint32(masqMark)), Xor: MarkBytes(0)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
		&expr.Masq{FullyRandom: true})
}

func (rs *testRuleset) rejectRules() []Rule {
	tcp := append(ctStateIs(expr.CtStateBitNEW), l4proto(1), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}})
	tcp = append(tcp, rs.svcKey()...)
	tcp = append(tcp, &expr.Lookup{SourceRegister: r8, SetName: "no-endpoints"}, &expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
	other := append(ctStateIs(expr.CtStateBitNEW), rs.svcKey()...)
	other = append(other, &expr.Lookup{SourceRegister: r8, SetName: "no-endpoints"},
		&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: rs.fam.ICMPRejectCode})
	return []Rule{rule("", tcp...), rule("", other...)}
}

func (rs *testRuleset) svcKeyBytes(ip netip.Addr, proto uint8, port uint16) []byte {
	return Concat(AddrBytes(ip), ProtoBytes(proto), PortBytes(port))
}

func (rs *testRuleset) epBytes(ap netip.AddrPort) []byte {
	return Concat(AddrBytes(ap.Addr()), PortBytes(ap.Port()))
}

// service queues a service with endpoints in the count-2 set (or aff-2, or
// no-endpoints when eps is empty).
func (rs *testRuleset) service(tx *Tx, ip netip.Addr, port uint16, affinity bool, eps ...netip.AddrPort) {
	key := rs.svcKeyBytes(ip, unix.IPPROTO_TCP, port)
	switch {
	case len(eps) == 0:
		tx.AddElements(testTable, "no-endpoints", []Element{{Key: key}})
		return
	case affinity:
		tx.AddElements(testTable, "aff-2", []Element{{Key: key}})
	default:
		tx.AddElements(testTable, "svc-2", []Element{{Key: key}})
	}
	var elems []Element
	for i, ep := range eps {
		elems = append(elems, Element{Key: Concat(key, IndexBytes(uint32(i))), Data: rs.epBytes(ep)})
	}
	tx.AddElements(testTable, "endpoints", elems)
}

func (rs *testRuleset) nodePort(tx *Tx, port uint16, svcIP netip.Addr, svcPort uint16) {
	tx.AddElements(testTable, "np-2", []Element{{
		Key:  Concat(ProtoBytes(unix.IPPROTO_TCP), PortBytes(port)),
		Data: rs.svcKeyBytes(svcIP, unix.IPPROTO_TCP, svcPort),
	}})
}
