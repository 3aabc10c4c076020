package nft

import (
	"fmt"
	"maps"
	"slices"
	"syscall"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The register file as the kernel lays it out: 80 bytes seen as 20 32-bit slots.
// NFT_REG_VERDICT is slots 0-3; NFT_REG_1..4 (16 bytes each) are slots 4-19, which
// NFT_REG32_00..15 also name one slot at a time.
const (
	regSlots     = 20
	regFileBytes = regSlots * 4
)

// regSlot converts a register number to its first 32-bit slot (nft_parse_register).
func regSlot(r uint32) (int, bool) {
	switch {
	case r <= unix.NFT_REG_4:
		return int(r) * 4, true
	case r >= unix.NFT_REG32_00 && r <= unix.NFT_REG32_15:
		return int(r-unix.NFT_REG32_00) + 4, true
	}
	return 0, false
}

// regTracker checks a rule's register use like the kernel (6.x) does when a rule
// is added: ranges must fit the register file and a rule may only read registers it
// has written earlier (the kernel's reg_inited bitmap; ENODATA otherwise). Registers
// are therefore never handed from one rule or chain to another.
type regTracker struct{ inited [regSlots]bool }

func (rt *regTracker) span(r, n uint32) (int, int, error) {
	s, ok := regSlot(r)
	if !ok || r == unix.NFT_REG_VERDICT || n == 0 || s*4+int(n) > regFileBytes {
		return 0, 0, fmt.Errorf("register %d length %d: %w", r, n, syscall.ERANGE)
	}
	return s, s + int(n+3)/4, nil
}

func (rt *regTracker) load(r, n uint32) error {
	from, to, err := rt.span(r, n)
	if err != nil {
		return err
	}
	for i := from; i < to; i++ {
		if !rt.inited[i] {
			return fmt.Errorf("register %d read before written in this rule: %w", r, syscall.ENODATA)
		}
	}
	return nil
}

func (rt *regTracker) store(r, n uint32) error {
	from, to, err := rt.span(r, n)
	if err != nil {
		return err
	}
	for i := from; i < to; i++ {
		rt.inited[i] = true
	}
	return nil
}

// metaLen is the number of bytes a meta key loads.
func metaLen(k expr.MetaKey) uint32 {
	switch k {
	case expr.MetaKeyL4PROTO, expr.MetaKeyNFPROTO:
		return 1
	case expr.MetaKeyIIFNAME, expr.MetaKeyOIFNAME:
		return 16 // IFNAMSIZ
	case expr.MetaKeyPROTOCOL:
		return 2
	}
	return 4
}

func ctLen(k expr.CtKey) uint32 {
	if k == expr.CtKeyDIRECTION {
		return 1
	}
	return 4
}

// validateRule checks one rule against the table as the kernel's expression init
// functions do: named sets and chains must exist, register use must be sound, and
// lookups and dynsets must fit their set's type.
func (w *work) validateRule(t *fTable, r Rule) error {
	var rt regTracker
	for i, e := range r.Exprs {
		if err := w.validateExpr(t, &rt, e); err != nil {
			return fmt.Errorf("expression %d [%s]: %w", i, FormatExpr(e), err)
		}
	}
	return nil
}

func (w *work) validateExpr(t *fTable, rt *regTracker, e expr.Any) error {
	switch e := e.(type) {
	case *expr.Payload:
		if e.OperationType != expr.PayloadLoad {
			return rt.load(e.SourceRegister, e.Len)
		}
		return rt.store(e.DestRegister, e.Len)
	case *expr.Meta:
		if e.SourceRegister {
			return rt.load(e.Register, metaLen(e.Key))
		}
		return rt.store(e.Register, metaLen(e.Key))
	case *expr.Ct:
		if e.SourceRegister {
			return rt.load(e.Register, ctLen(e.Key))
		}
		return rt.store(e.Register, ctLen(e.Key))
	case *expr.Cmp:
		return rt.load(e.Register, uint32(len(e.Data)))
	case *expr.Range:
		if len(e.FromData) != len(e.ToData) {
			return syscall.EINVAL
		}
		return rt.load(e.Register, uint32(len(e.FromData)))
	case *expr.Bitwise:
		if len(e.Mask) != int(e.Len) || len(e.Xor) != int(e.Len) {
			return fmt.Errorf("mask/xor length differs from %d: %w", e.Len, syscall.EINVAL)
		}
		if err := rt.load(e.SourceRegister, e.Len); err != nil {
			return err
		}
		return rt.store(e.DestRegister, e.Len)
	case *expr.Immediate:
		if e.Register == unix.NFT_REG_VERDICT {
			return fmt.Errorf("immediate data into the verdict register: %w", syscall.EINVAL)
		}
		return rt.store(e.Register, uint32(len(e.Data)))
	case *expr.Numgen:
		if e.Modulus == 0 {
			return syscall.ERANGE
		}
		return rt.store(e.Register, 4)
	case *expr.Fib:
		n := uint32(4)
		if e.ResultOIFNAME {
			n = 16
		}
		return rt.store(e.Register, n)
	case *expr.Lookup:
		return w.validateLookup(t, rt, e)
	case *expr.Dynset:
		return w.validateDynset(t, rt, e)
	case *expr.NAT:
		return w.validateNAT(rt, e)
	case *expr.Masq:
		if e.RegProtoMin != 0 {
			return rt.load(e.RegProtoMin, 2)
		}
		return nil
	case *expr.Verdict:
		return checkVerdictTarget(t, e)
	}
	return nil
}

func (w *work) validateLookup(t *fTable, rt *regTracker, e *expr.Lookup) error {
	s, ok := t.sets[e.SetName]
	if !ok {
		return fmt.Errorf("set %s: %w", e.SetName, syscall.ENOENT)
	}
	if err := rt.load(e.SourceRegister, s.def.KeyType.Bytes); err != nil {
		return err
	}
	if !e.IsDestRegSet {
		return nil
	}
	if !s.def.IsMap || e.Invert {
		return fmt.Errorf("lookup with data from %s: %w", e.SetName, syscall.EINVAL)
	}
	if isVerdictType(s.def.DataType) != (e.DestRegister == unix.NFT_REG_VERDICT) {
		return fmt.Errorf("verdict/data register mismatch for map %s: %w", e.SetName, syscall.EINVAL)
	}
	if e.DestRegister == unix.NFT_REG_VERDICT {
		return nil
	}
	return rt.store(e.DestRegister, s.def.DataType.Bytes)
}

func (w *work) validateDynset(t *fTable, rt *regTracker, e *expr.Dynset) error {
	s, ok := t.sets[e.SetName]
	if !ok {
		return fmt.Errorf("set %s: %w", e.SetName, syscall.ENOENT)
	}
	if !s.def.Dynamic {
		return fmt.Errorf("set %s is not dynamic: %w", e.SetName, syscall.EOPNOTSUPP)
	}
	if e.Timeout != 0 && !s.def.Timeout {
		return fmt.Errorf("timeout on set %s without timeout flag: %w", e.SetName, syscall.EOPNOTSUPP)
	}
	if err := rt.load(e.SrcRegKey, s.def.KeyType.Bytes); err != nil {
		return err
	}
	if s.def.IsMap {
		// The kernel needs the data register even for delete.
		if e.SrcRegData == 0 {
			return fmt.Errorf("dynset on map %s without data register: %w", e.SetName, syscall.EINVAL)
		}
		return rt.load(e.SrcRegData, s.def.DataType.Bytes)
	}
	return nil
}

func (w *work) validateNAT(rt *regTracker, e *expr.NAT) error {
	if e.Family != uint32(w.fam.NFProto) {
		return fmt.Errorf("nat family %d in an %s table: %w", e.Family, w.fam.NFTFamilyName, syscall.EINVAL)
	}
	if e.RegAddrMin != 0 {
		if err := rt.load(e.RegAddrMin, w.fam.AddrLen); err != nil {
			return err
		}
	}
	if e.RegProtoMin != 0 {
		return rt.load(e.RegProtoMin, 2)
	}
	return nil
}

// maxJumpDepth is NFT_JUMP_STACK_SIZE.
const maxJumpDepth = 16

// validateGraph does what the kernel does at commit for each base chain: it walks
// every chain reachable through jump/goto (in rules and verdict maps) and rejects
// loops (ELOOP), chains deeper than the jump stack (EMLINK) and NAT expressions in
// chains whose type or hook cannot run them (EOPNOTSUPP).
func (w *work) validateGraph() error {
	for _, tn := range slices.Sorted(maps.Keys(w.tables)) {
		t := w.tables[tn]
		for _, cn := range slices.Sorted(maps.Keys(t.chains)) {
			c := t.chains[cn]
			if c.Hook == nil {
				continue
			}
			if err := w.walk(t, c, c, map[string]bool{}, 0); err != nil {
				return fmt.Errorf("chain %s/%s: %w", tn, cn, err)
			}
		}
	}
	return nil
}

func (w *work) walk(t *fTable, base, c *Chain, onPath map[string]bool, depth int) error {
	if onPath[c.Name] {
		return fmt.Errorf("loop through %s: %w", c.Name, syscall.ELOOP)
	}
	if depth > maxJumpDepth {
		return fmt.Errorf("jump depth over %d at %s: %w", maxJumpDepth, c.Name, syscall.EMLINK)
	}
	onPath[c.Name] = true
	defer delete(onPath, c.Name)
	for _, r := range c.Rules {
		for _, e := range r.Exprs {
			if err := natAllowed(base, e); err != nil {
				return fmt.Errorf("chain %s: %w", c.Name, err)
			}
			for _, target := range jumpTargets(t, e) {
				next, ok := t.chains[target]
				if !ok {
					return fmt.Errorf("jump to %s: %w", target, syscall.ENOENT)
				}
				if err := w.walk(t, base, next, onPath, depth+1); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// jumpTargets returns the chains an expression may jump or go to.
func jumpTargets(t *fTable, e expr.Any) []string {
	switch e := e.(type) {
	case *expr.Verdict:
		if e.Kind == expr.VerdictJump || e.Kind == expr.VerdictGoto {
			return []string{e.Chain}
		}
	case *expr.Lookup:
		s, ok := t.sets[e.SetName]
		if !ok || !e.IsDestRegSet || e.DestRegister != unix.NFT_REG_VERDICT {
			return nil
		}
		var out []string
		for _, el := range s.elems {
			if el.Verdict != nil && (el.Verdict.Kind == expr.VerdictJump || el.Verdict.Kind == expr.VerdictGoto) {
				out = append(out, el.Verdict.Chain)
			}
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	return nil
}

// natAllowed applies nft_nat_validate and nft_masq_validate: NAT needs a nat chain;
// dnat runs in prerouting and output, snat in postrouting and input, masquerade in
// postrouting.
func natAllowed(base *Chain, e expr.Any) error {
	var hooks []*nftables.ChainHook
	switch e := e.(type) {
	case *expr.NAT:
		hooks = []*nftables.ChainHook{nftables.ChainHookPostrouting, nftables.ChainHookInput}
		if e.Type == expr.NATTypeDestNAT {
			hooks = []*nftables.ChainHook{nftables.ChainHookPrerouting, nftables.ChainHookOutput}
		}
	case *expr.Masq:
		hooks = []*nftables.ChainHook{nftables.ChainHookPostrouting}
	default:
		return nil
	}
	if base.Type != nftables.ChainTypeNAT {
		return fmt.Errorf("%s in a %s chain: %w", FormatExpr(e), base.Type, syscall.EOPNOTSUPP)
	}
	for _, h := range hooks {
		if *h == *base.Hook {
			return nil
		}
	}
	return fmt.Errorf("%s in hook %s: %w", FormatExpr(e), hookName(base.Hook), syscall.EOPNOTSUPP)
}

// cloneExprs copies the expressions the Fake knows, so that a caller reusing or
// modifying its expression values cannot change the stored state.
func cloneExprs(in []expr.Any) []expr.Any {
	out := make([]expr.Any, len(in))
	for i, e := range in {
		out[i] = cloneExpr(e)
	}
	return out
}

func cloneExpr(e expr.Any) expr.Any {
	switch e := e.(type) {
	case *expr.Payload:
		c := *e
		return &c
	case *expr.Meta:
		c := *e
		return &c
	case *expr.Ct:
		c := *e
		return &c
	case *expr.Cmp:
		c := *e
		c.Data = slices.Clone(e.Data)
		return &c
	case *expr.Range:
		c := *e
		c.FromData, c.ToData = slices.Clone(e.FromData), slices.Clone(e.ToData)
		return &c
	case *expr.Bitwise:
		c := *e
		c.Mask, c.Xor = slices.Clone(e.Mask), slices.Clone(e.Xor)
		return &c
	case *expr.Immediate:
		c := *e
		c.Data = slices.Clone(e.Data)
		return &c
	case *expr.Numgen:
		c := *e
		return &c
	case *expr.Fib:
		c := *e
		return &c
	case *expr.Lookup:
		c := *e
		return &c
	case *expr.Dynset:
		c := *e
		c.Exprs = cloneExprs(e.Exprs)
		return &c
	case *expr.NAT:
		c := *e
		return &c
	case *expr.Masq:
		c := *e
		return &c
	case *expr.Reject:
		c := *e
		return &c
	case *expr.Verdict:
		c := *e
		return &c
	case *expr.Counter:
		return &expr.Counter{}
	}
	return e
}
