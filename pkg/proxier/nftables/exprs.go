package nftables

import (
	"net/netip"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// Register plan: r8 = NFT_REG32_00; every concatenated field takes whole 32-bit
// registers; an address takes a = 1 (IPv4) or 4 (IPv6) of them. A rule may only read
// registers it wrote itself (the kernel rejects the rest with ENODATA), so every rule
// loads its own key.
const (
	r8 = unix.NFT_REG32_00
	// defaultMasqueradeBit is kube-proxy's nftables.masqueradeBit default:
	// the mark 0x4000.
	defaultMasqueradeBit = 14
	// nftDynsetOpDelete is NFT_DYNSET_OP_DELETE, which x/sys/unix lacks.
	nftDynsetOpDelete = 2
	// ipsDstNAT is IPS_DST_NAT, "ct status dnat".
	ipsDstNAT = 0x20
	// ifNameSize is IFNAMSIZ: meta iifname loads 16 bytes.
	ifNameSize = 16
)

// exprs builds one family's expressions.
type exprs struct {
	f *family.Family
	a uint32 // registers per address
	// keepInvalid leaves out filter-forward's "ct state invalid drop"
	// (Options.TCPBeLiberal).
	keepInvalid bool
	// masq is the packet mark bit that asks for masquerading
	// (Options.MasqueradeMark).
	masq uint32
}

func newExprs(f *family.Family) exprs {
	return exprs{f: f, a: f.AddrLen / 4, masq: 1 << defaultMasqueradeBit}
}

func (x exprs) daddr(reg uint32) expr.Any {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: x.f.DaddrOffset, Len: x.f.AddrLen}
}

func (x exprs) saddr(reg uint32) expr.Any {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: x.f.SaddrOffset, Len: x.f.AddrLen}
}

func l4proto(reg uint32) expr.Any { return &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg} }

func thDport(reg uint32) expr.Any {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
}

// vipKey loads daddr . l4proto . dport into reg (a+2 registers).
func (x exprs) vipKey(reg uint32) []expr.Any {
	return []expr.Any{x.daddr(reg), l4proto(reg + x.a), thDport(reg + x.a + 1)}
}

// npKey loads l4proto . dport into reg (2 registers).
func npKey(reg uint32) []expr.Any { return []expr.Any{l4proto(reg), thDport(reg + 1)} }

func lookup(set string, src uint32) expr.Any {
	return &expr.Lookup{SourceRegister: src, SetName: set}
}

func lookupMap(set string, src, dst uint32) expr.Any {
	return &expr.Lookup{SourceRegister: src, DestRegister: dst, IsDestRegSet: true, SetName: set}
}

// bitTest is "reg & mask != 0" for a host-endian u32 register.
func bitTest(reg, mask uint32) []expr.Any {
	return []expr.Any{
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4, Mask: nft.MarkBytes(mask), Xor: nft.MarkBytes(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg, Data: nft.MarkBytes(0)},
	}
}

func ctState(bit uint32) []expr.Any {
	return append([]expr.Any{&expr.Ct{Key: expr.CtKeySTATE, Register: 1}}, bitTest(1, bit)...)
}

// setMasqMark is "meta mark set meta mark | <masquerade bit>" (0x4000 by
// default), using scratch as its register.
func (x exprs) setMasqMark(scratch uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: scratch},
		&expr.Bitwise{SourceRegister: scratch, DestRegister: scratch, Len: 4,
			Mask: nft.MarkBytes(^x.masq), Xor: nft.MarkBytes(x.masq)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: scratch},
	}
}

func (x exprs) dnat(reg uint32) expr.Any {
	return &expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(x.f.NFProto),
		RegAddrMin: reg, RegProtoMin: reg + x.a, Specified: true}
}

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

func jump(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }

// prefixMatch is "<addr in reg> & mask(p) ==/!= p.Addr()".
func prefixMatch(reg uint32, p netip.Prefix, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		maskExpr(reg, p.Addr().BitLen(), p.Bits()),
		&expr.Cmp{Op: op, Register: reg, Data: nft.AddrBytes(p.Masked().Addr())},
	}
}

// maskExpr is "reg = reg & /bits" for an address of bitLen bits.
func maskExpr(reg uint32, bitLen, bits int) expr.Any {
	mask := prefixMask(bitLen, bits)
	return &expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: uint32(len(mask)), Mask: mask, Xor: make([]byte, len(mask))}
}

func prefixMask(bitLen, bits int) []byte {
	m := make([]byte, bitLen/8)
	for i := 0; i < bits; i++ {
		m[i/8] |= 0x80 >> (i % 8)
	}
	return m
}

// rejectPair returns the two reject rules for packets matching match (which must
// leave l4proto in protoReg): TCP is refused with a reset, because an ICMPv6 error
// for a SYN sent while connect() holds the socket lock is dropped and the client
// only fails after the 1 s SYN retransmit; everything else gets the family's ICMP
// port unreachable.
func (x exprs) rejectPair(match []expr.Any, protoReg uint32, comment string) []nft.Rule {
	tcp := append(clone(match),
		&expr.Cmp{Op: expr.CmpOpEq, Register: protoReg, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
	other := append(clone(match), &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: x.f.ICMPRejectCode})
	return []nft.Rule{{Exprs: tcp, Comment: comment + " (tcp reset)"}, {Exprs: other, Comment: comment}}
}

func clone(e []expr.Any) []expr.Any { return append([]expr.Any(nil), e...) }

// ifName encodes an interface name for "meta iifname": an exact match compares the
// NUL-padded 16 bytes, a prefix match only the prefix's bytes.
func ifName(name string, prefix bool) []byte {
	if prefix {
		return []byte(name)
	}
	b := make([]byte, ifNameSize)
	copy(b, name)
	return b
}

// localMatch returns the expression lists that each match traffic from local pods
// (any of them matches), or nil when the detector is off.
func localMatch(x exprs, d proxier.LocalDetector) [][]expr.Any {
	switch d.Mode {
	case proxier.LocalModeClusterCIDR, proxier.LocalModeNodeCIDR:
		var out [][]expr.Any
		for _, p := range d.CIDRs {
			if x.f.ContainsPrefix(p) {
				out = append(out, append([]expr.Any{x.saddr(r8)}, prefixMatch(r8, p, expr.CmpOpEq)...))
			}
		}
		return out
	case proxier.LocalModeBridgeInterface, proxier.LocalModeInterfaceNamePrefix:
		if d.Interface == "" {
			return nil
		}
		prefix := d.Mode == proxier.LocalModeInterfaceNamePrefix
		return [][]expr.Any{{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: r8},
			&expr.Cmp{Op: expr.CmpOpEq, Register: r8, Data: ifName(d.Interface, prefix)},
		}}
	}
	return nil
}

// nonLocalMatch returns the expressions matching traffic not from local pods, and
// false when the detector is off.
func nonLocalMatch(x exprs, d proxier.LocalDetector) ([]expr.Any, bool) {
	switch d.Mode {
	case proxier.LocalModeClusterCIDR, proxier.LocalModeNodeCIDR:
		var out []expr.Any
		for _, p := range d.CIDRs {
			if x.f.ContainsPrefix(p) {
				out = append(out, x.saddr(r8))
				out = append(out, prefixMatch(r8, p, expr.CmpOpNeq)...)
			}
		}
		return out, len(out) > 0
	case proxier.LocalModeBridgeInterface, proxier.LocalModeInterfaceNamePrefix:
		if d.Interface == "" {
			return nil, false
		}
		prefix := d.Mode == proxier.LocalModeInterfaceNamePrefix
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: r8},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: r8, Data: ifName(d.Interface, prefix)},
		}, true
	}
	return nil, false
}

// nodePortMatch matches packets to the NodePort addresses: "fib daddr type local"
// and not loopback when they are every local address, else "daddr @nodeport-ips".
func nodePortMatch(x exprs, matchAll bool) []expr.Any {
	if !matchAll {
		return []expr.Any{x.daddr(r8), lookup(fixedSetNames[setNodePortIPs], r8)}
	}
	out := []expr.Any{
		&expr.Fib{Register: r8, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: r8, Data: nft.MarkBytes(unix.RTN_LOCAL)},
		x.daddr(r8),
	}
	return append(out, prefixMatch(r8, x.f.Loopback, expr.CmpOpNeq)...)
}

// fibSaddrLocal is "fib saddr type local": the packet comes from the node itself.
func fibSaddrLocal() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: r8, FlagSADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: r8, Data: nft.MarkBytes(unix.RTN_LOCAL)},
	}
}
