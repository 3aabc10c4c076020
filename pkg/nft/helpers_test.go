package nft

import (
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

func hookOut() *nftables.ChainHook { return nftables.ChainHookOutput }

func prio(p int32) *nftables.ChainPriority {
	return nftables.ChainPriorityRef(nftables.ChainPriority(p))
}

func acceptV() expr.Any { return &expr.Verdict{Kind: expr.VerdictAccept} }
func dropV() expr.Any   { return &expr.Verdict{Kind: expr.VerdictDrop} }
func returnV() expr.Any { return &expr.Verdict{Kind: expr.VerdictReturn} }

func jumpV(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }

func imm(reg uint32, data []byte) expr.Any { return &expr.Immediate{Register: reg, Data: data} }

func metaMark(reg uint32) expr.Any { return &expr.Meta{Key: expr.MetaKeyMARK, Register: reg} }

func markSet(reg uint32) expr.Any {
	return &expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg}
}

func cmpEq(reg uint32, data []byte) expr.Any {
	return &expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: data}
}
