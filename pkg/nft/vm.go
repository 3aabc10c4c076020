package nft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"maps"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// regs is the register file of one rule evaluation (see regSlot for the layout;
// the verdict register is kept apart in vm.verdict).
type regs [regFileBytes]byte

// vm evaluates one rule.
type vm struct {
	tr      *tracer
	t       *fTable
	hook    *nftables.ChainHook
	r       regs
	verdict expr.Verdict
	note    string // what a terminal expression did, for the trace
}

func (m *vm) bytesAt(reg, n uint32) ([]byte, error) {
	s, ok := regSlot(reg)
	if !ok || reg == unix.NFT_REG_VERDICT || s*4+int(n) > regFileBytes {
		return nil, fmt.Errorf("register %d length %d out of range", reg, n)
	}
	return m.r[s*4 : s*4+int(n)], nil
}

// store writes b at reg, zeroing the rest of its last 32-bit slot as the kernel's
// store helpers and nft_data_copy do.
func (m *vm) store(reg uint32, b []byte) error {
	padded := (len(b) + 3) &^ 3
	dst, err := m.bytesAt(reg, uint32(padded))
	if err != nil {
		return err
	}
	clear(dst)
	copy(dst, b)
	return nil
}

func (m *vm) storeU32(reg, v uint32) error { return m.store(reg, binaryutil.NativeEndian.PutUint32(v)) }

func (m *vm) brk() { m.verdict = expr.Verdict{Kind: expr.VerdictBreak} }

// evalRule runs one rule and returns the verdict register at its end.
func (tr *tracer) evalRule(t *fTable, c *Chain, idx int, h *nftables.ChainHook) (expr.Verdict, error) {
	m := &vm{tr: tr, t: t, hook: h, verdict: expr.Verdict{Kind: expr.VerdictContinue}}
	stop := len(c.Rules[idx].Exprs)
	for i, e := range c.Rules[idx].Exprs {
		if err := m.eval(e); err != nil {
			return m.verdict, fmt.Errorf("expression %d [%s]: %w", i, FormatExpr(e), err)
		}
		if m.verdict.Kind != expr.VerdictContinue {
			stop = i
			break
		}
	}
	outcome := "continue"
	switch {
	case m.verdict.Kind == expr.VerdictBreak:
		outcome = fmt.Sprintf("no match at expression %d", stop)
	case m.verdict.Kind == verdictReject:
		outcome = m.note
	case m.verdict.Kind != expr.VerdictContinue:
		outcome = verdictString(&m.verdict)
		if m.note != "" {
			outcome = m.note + ", " + outcome
		}
	}
	tr.logf("%s %s %s rule %d: %s => %s", tr.fam.NFTFamilyName, t.name, c.Name, idx, FormatRule(c.Rules[idx]), outcome)
	return m.verdict, nil
}

func (m *vm) eval(e expr.Any) error {
	switch e := e.(type) {
	case *expr.Payload:
		return m.payload(e)
	case *expr.Meta:
		return m.meta(e)
	case *expr.Ct:
		return m.ct(e)
	case *expr.Cmp:
		return m.cmp(e)
	case *expr.Range:
		return m.rangeExpr(e)
	case *expr.Bitwise:
		return m.bitwise(e)
	case *expr.Immediate:
		return m.store(e.Register, e.Data)
	case *expr.Verdict:
		m.verdict = *e
		return nil
	case *expr.Lookup:
		return m.lookup(e)
	case *expr.Numgen:
		return m.numgen(e)
	case *expr.Fib:
		return m.fib(e)
	case *expr.NAT:
		return m.nat(e)
	case *expr.Masq:
		m.tr.res.Masquerade = true
		m.tr.natDone[0] = true
		m.tr.status |= ipsSrcNAT
		m.note = "masquerade"
		m.verdict = expr.Verdict{Kind: expr.VerdictAccept}
		return nil
	case *expr.Reject:
		m.tr.res.RejectType, m.tr.res.RejectCode = uint8(e.Type), e.Code
		m.note = fmtReject(e)
		m.verdict = expr.Verdict{Kind: verdictReject}
		return nil
	case *expr.Dynset:
		return m.dynset(e)
	case *expr.Counter:
		return nil
	}
	return fmt.Errorf("expression %T not supported by the tracer", e)
}

// header returns the packet's network or transport header as the kernel sees it
// (addresses and ports after any NAT done so far).
func (m *vm) header(base expr.PayloadBase) ([]byte, error) {
	tr := m.tr
	switch base {
	case expr.PayloadBaseNetworkHeader:
		var h []byte
		if tr.fam.AddrLen == 4 {
			h = make([]byte, 20)
			h[0], h[9] = 0x45, tr.p.Proto
		} else {
			h = make([]byte, 40)
			h[0], h[6] = 0x60, tr.p.Proto
		}
		copy(h[tr.fam.SaddrOffset:], tr.src.Addr().AsSlice())
		copy(h[tr.fam.DaddrOffset:], tr.dst.Addr().AsSlice())
		return h, nil
	case expr.PayloadBaseTransportHeader:
		h := make([]byte, 20)
		switch tr.p.Proto {
		case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP, unix.IPPROTO_UDPLITE, unix.IPPROTO_DCCP:
			binary.BigEndian.PutUint16(h[0:], tr.src.Port())
			binary.BigEndian.PutUint16(h[2:], tr.dst.Port())
		}
		return h, nil
	}
	return nil, fmt.Errorf("payload base %d not supported", base)
}

func (m *vm) payload(e *expr.Payload) error {
	if e.OperationType != expr.PayloadLoad {
		return fmt.Errorf("payload writes not supported")
	}
	h, err := m.header(e.Base)
	if err != nil {
		return err
	}
	if int(e.Offset+e.Len) > len(h) {
		m.brk() // skb_copy_bits fails: NFT_BREAK
		return nil
	}
	return m.store(e.DestRegister, h[e.Offset:e.Offset+e.Len])
}

func ifname(name string) []byte {
	b := make([]byte, 16)
	copy(b, name)
	return b
}

func (m *vm) meta(e *expr.Meta) error {
	if e.SourceRegister {
		if e.Key != expr.MetaKeyMARK {
			return fmt.Errorf("meta set %s not supported", metaKeyName(e.Key))
		}
		b, err := m.bytesAt(e.Register, 4)
		if err != nil {
			return err
		}
		m.tr.mark = binaryutil.NativeEndian.Uint32(b)
		return nil
	}
	switch e.Key {
	case expr.MetaKeyL4PROTO:
		return m.store(e.Register, []byte{m.tr.p.Proto})
	case expr.MetaKeyNFPROTO:
		return m.store(e.Register, []byte{m.tr.fam.NFProto})
	case expr.MetaKeyMARK:
		return m.storeU32(e.Register, m.tr.mark)
	case expr.MetaKeyPROTOCOL:
		eth := uint16(unix.ETH_P_IP)
		if m.tr.fam.AddrLen == 16 {
			eth = unix.ETH_P_IPV6
		}
		return m.store(e.Register, binaryutil.BigEndian.PutUint16(eth))
	case expr.MetaKeyIIFNAME, expr.MetaKeyOIFNAME:
		name := m.tr.iif
		if e.Key == expr.MetaKeyOIFNAME {
			name = m.tr.oif
		}
		if name == "" {
			m.brk() // no device at this hook (or none given): the kernel breaks
			return nil
		}
		return m.store(e.Register, ifname(name))
	}
	return fmt.Errorf("meta %s not supported", metaKeyName(e.Key))
}

func (m *vm) ct(e *expr.Ct) error {
	tr := m.tr
	if e.SourceRegister {
		if e.Key != expr.CtKeyMARK {
			return fmt.Errorf("ct set %s not supported", ctKeyName(e.Key))
		}
		b, err := m.bytesAt(e.Register, 4)
		if err != nil {
			return err
		}
		tr.ctMark = binaryutil.NativeEndian.Uint32(b)
		return nil
	}
	if e.Key == expr.CtKeySTATE {
		bit := map[CtState]uint32{CtNew: expr.CtStateBitNEW, CtEstablished: expr.CtStateBitESTABLISHED, CtInvalid: expr.CtStateBitINVALID}[tr.p.CtState]
		return m.storeU32(e.Register, bit)
	}
	if tr.p.CtState == CtInvalid {
		m.brk() // no conntrack entry: every other key breaks
		return nil
	}
	switch e.Key {
	case expr.CtKeySTATUS:
		return m.storeU32(e.Register, tr.status)
	case expr.CtKeyMARK:
		return m.storeU32(e.Register, tr.ctMark)
	case expr.CtKeyDIRECTION:
		return m.store(e.Register, []byte{0}) // IP_CT_DIR_ORIGINAL
	}
	return fmt.Errorf("ct %s not supported", ctKeyName(e.Key))
}

func (m *vm) cmp(e *expr.Cmp) error {
	b, err := m.bytesAt(e.Register, uint32(len(e.Data)))
	if err != nil {
		return err
	}
	d := bytes.Compare(b, e.Data) // the kernel memcmp()s: network-order semantics
	var ok bool
	switch e.Op {
	case expr.CmpOpEq:
		ok = d == 0
	case expr.CmpOpNeq:
		ok = d != 0
	case expr.CmpOpLt:
		ok = d < 0
	case expr.CmpOpLte:
		ok = d <= 0
	case expr.CmpOpGt:
		ok = d > 0
	case expr.CmpOpGte:
		ok = d >= 0
	default:
		return fmt.Errorf("cmp op %d not supported", e.Op)
	}
	if !ok {
		m.brk()
	}
	return nil
}

func (m *vm) rangeExpr(e *expr.Range) error {
	b, err := m.bytesAt(e.Register, uint32(len(e.FromData)))
	if err != nil {
		return err
	}
	in := bytes.Compare(b, e.FromData) >= 0 && bytes.Compare(b, e.ToData) <= 0
	switch e.Op {
	case expr.CmpOpEq:
	case expr.CmpOpNeq:
		in = !in
	default:
		return fmt.Errorf("range op %d not supported", e.Op)
	}
	if !in {
		m.brk()
	}
	return nil
}

func (m *vm) bitwise(e *expr.Bitwise) error {
	n := (e.Len + 3) &^ 3
	src, err := m.bytesAt(e.SourceRegister, n)
	if err != nil {
		return err
	}
	out := make([]byte, n) // mask and xor are zero beyond Len, so is the result
	for i := 0; i < int(e.Len) && i < len(e.Mask) && i < len(e.Xor); i++ {
		out[i] = src[i]&e.Mask[i] ^ e.Xor[i]
	}
	return m.store(e.DestRegister, out)
}

// set returns the set as the trace sees it: the dynset copy if this trace wrote it.
func (m *vm) set(name string) (*fSet, bool) {
	id := tableID{m.tr.fam.NFProto, m.t.name}
	if s, ok := m.tr.dyn[id][name]; ok {
		return s, true
	}
	s, ok := m.t.sets[name]
	return s, ok
}

func (m *vm) lookup(e *expr.Lookup) error {
	s, ok := m.set(e.SetName)
	if !ok {
		return fmt.Errorf("set %s missing", e.SetName)
	}
	key, err := m.bytesAt(e.SourceRegister, s.def.KeyType.Bytes)
	if err != nil {
		return err
	}
	el, found := s.elems[string(key)]
	if found == e.Invert {
		m.brk()
		return nil
	}
	if !e.IsDestRegSet {
		return nil
	}
	if e.DestRegister == unix.NFT_REG_VERDICT {
		if el.Verdict == nil {
			return fmt.Errorf("vmap %s element without verdict", e.SetName)
		}
		m.verdict = *el.Verdict
		return nil
	}
	return m.store(e.DestRegister, el.Data)
}

func (m *vm) numgen(e *expr.Numgen) error {
	tr := m.tr
	var v uint32
	if n := len(tr.taken); n < len(tr.choices) {
		v = tr.choices[n]
	}
	tr.taken = append(tr.taken, v)
	tr.moduli = append(tr.moduli, e.Modulus)
	return m.storeU32(e.Register, v+e.Offset)
}

// RTN_* route types that fib ... type returns.
const (
	rtnUnicast   = 1
	rtnLocal     = 2
	rtnBroadcast = 3
	rtnMulticast = 5
)

func (m *vm) fib(e *expr.Fib) error {
	if !e.ResultADDRTYPE || e.FlagPRESENT || e.FlagSADDR == e.FlagDADDR {
		return fmt.Errorf("only fib saddr/daddr type is supported")
	}
	a := m.tr.dst.Addr()
	if e.FlagSADDR {
		a = m.tr.src.Addr()
	}
	// FlagIIF and FlagMARK would narrow the route lookup; the Node model has one
	// routing table without interfaces, so they do not change the answer.
	t := uint32(rtnUnicast)
	switch {
	case m.tr.isLocal(a):
		t = rtnLocal
	case a.IsMulticast():
		t = rtnMulticast
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		t = rtnBroadcast
	}
	return m.storeU32(e.Register, t)
}

func (m *vm) nat(e *expr.NAT) error {
	tr := m.tr
	manip := 0
	if e.Type == expr.NATTypeDestNAT {
		manip = 1
	}
	if natManip(m.hook) != manip {
		return fmt.Errorf("%s in hook %s", FormatExpr(e), hookName(m.hook))
	}
	cur := tr.src
	if manip == 1 {
		cur = tr.dst
	}
	addr, port := cur.Addr(), cur.Port()
	if e.RegAddrMin != 0 {
		b, err := m.bytesAt(e.RegAddrMin, tr.fam.AddrLen)
		if err != nil {
			return err
		}
		addr, _ = netip.AddrFromSlice(b)
	}
	if e.RegProtoMin != 0 {
		b, err := m.bytesAt(e.RegProtoMin, 2)
		if err != nil {
			return err
		}
		port = binary.BigEndian.Uint16(b) // NAT reads the port register as be16
	}
	to := netip.AddrPortFrom(addr, port)
	if manip == 1 {
		tr.dst, tr.res.DNAT = to, to
		tr.status |= ipsDstNAT
		m.note = "dnat to " + to.String()
	} else {
		tr.src, tr.res.SNAT = to, to
		tr.status |= ipsSrcNAT
		m.note = "snat to " + to.String()
	}
	tr.natDone[manip] = true
	m.verdict = expr.Verdict{Kind: expr.VerdictAccept} // NAT is terminal: NF_ACCEPT
	return nil
}

func (m *vm) dynset(e *expr.Dynset) error {
	s, ok := m.set(e.SetName)
	if !ok {
		return fmt.Errorf("set %s missing", e.SetName)
	}
	key, err := m.bytesAt(e.SrcRegKey, s.def.KeyType.Bytes)
	if err != nil {
		return err
	}
	var data []byte
	if s.def.IsMap {
		if data, err = m.bytesAt(e.SrcRegData, s.def.DataType.Bytes); err != nil {
			return err
		}
	}
	_, exists := s.elems[string(key)]
	switch e.Operation {
	case nftDynsetOpDelete:
		// The kernel deletes if present and continues either way.
		if exists {
			delete(m.writable(e.SetName, s).elems, string(key))
		}
		return nil
	case unix.NFT_DYNSET_OP_ADD, unix.NFT_DYNSET_OP_UPDATE:
	default:
		return fmt.Errorf("dynset op %d not supported", e.Operation)
	}
	// add and update both succeed on an existing element (update only refreshes its
	// timeout, which the tracer does not model) and fail (break) on a full set.
	ok = exists || s.def.Size == 0 || uint32(len(s.elems)) < s.def.Size
	if ok && !exists {
		m.writable(e.SetName, s).elems[string(key)] = Element{Key: bytes.Clone(key), Data: bytes.Clone(data), Timeout: e.Timeout, Expires: e.Timeout}
	}
	if ok == e.Invert {
		m.brk()
	}
	return nil
}

// writable returns the trace's own copy of a set for dynset writes.
func (m *vm) writable(name string, s *fSet) *fSet {
	id := tableID{m.tr.fam.NFProto, m.t.name}
	if own, ok := m.tr.dyn[id][name]; ok {
		return own
	}
	c := &fSet{def: s.def, elems: maps.Clone(s.elems)}
	if m.tr.dyn[id] == nil {
		m.tr.dyn[id] = map[string]*fSet{}
	}
	m.tr.dyn[id][name] = c
	return c
}
