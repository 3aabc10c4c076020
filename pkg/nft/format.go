package nft

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// nftDynsetOpDelete is NFT_DYNSET_OP_DELETE, which x/sys/unix lacks.
const nftDynsetOpDelete = 2

// FormatRule renders a rule as its expressions, one bracketed step each, in the
// register-level style of `nft --debug=netlink`. The text depends only on what the
// kernel keeps, so a rule read back from the kernel prints as the rule sent (set
// IDs, counter values and the NAT proto-specified flag, which the kernel sets by
// itself, are left out).
func FormatRule(r Rule) string {
	parts := make([]string, 0, len(r.Exprs)+1)
	for _, e := range r.Exprs {
		parts = append(parts, "["+FormatExpr(e)+"]")
	}
	if r.Comment != "" {
		parts = append(parts, fmt.Sprintf("comment %q", r.Comment))
	}
	return strings.Join(parts, " ")
}

// FormatExpr renders one expression (see FormatRule).
func FormatExpr(e expr.Any) string {
	switch e := e.(type) {
	case *expr.Payload:
		return fmtPayload(e)
	case *expr.Meta:
		if e.SourceRegister {
			return fmt.Sprintf("meta %s set %s", metaKeyName(e.Key), reg(e.Register))
		}
		return fmt.Sprintf("meta %s => %s", metaKeyName(e.Key), reg(e.Register))
	case *expr.Cmp:
		return fmt.Sprintf("cmp %s %s %s", reg(e.Register), cmpOpName(e.Op), hexb(e.Data))
	case *expr.Range:
		return fmt.Sprintf("range %s %s %s-%s", reg(e.Register), cmpOpName(e.Op), hexb(e.FromData), hexb(e.ToData))
	case *expr.Bitwise:
		return fmt.Sprintf("bitwise %s = (%s & %s) ^ %s", reg(e.DestRegister), reg(e.SourceRegister), hexb(e.Mask), hexb(e.Xor))
	case *expr.Lookup:
		return fmtLookup(e)
	case *expr.Numgen:
		kind := "random"
		if e.Type == unix.NFT_NG_INCREMENTAL {
			kind = "inc"
		}
		return fmt.Sprintf("numgen %s mod %d offset %d => %s", kind, e.Modulus, e.Offset, reg(e.Register))
	case *expr.NAT:
		return fmtNAT(e)
	case *expr.Masq:
		s := "masquerade" + natFlags(e.Random, e.FullyRandom, e.Persistent)
		if e.RegProtoMin != 0 {
			s += fmt.Sprintf(" to :%s-%s", reg(e.RegProtoMin), reg(e.RegProtoMax))
		}
		return s
	case *expr.Reject:
		return fmtReject(e)
	case *expr.Immediate:
		return fmt.Sprintf("immediate %s = %s", reg(e.Register), hexb(e.Data))
	case *expr.Verdict:
		return verdictString(e)
	case *expr.Ct:
		if e.SourceRegister {
			return fmt.Sprintf("ct %s set %s", ctKeyName(e.Key), reg(e.Register))
		}
		return fmt.Sprintf("ct %s => %s", ctKeyName(e.Key), reg(e.Register))
	case *expr.Fib:
		return fmtFib(e)
	case *expr.Dynset:
		return fmtDynset(e)
	case *expr.Counter:
		return "counter"
	}
	return fmt.Sprintf("unsupported %T", e)
}

// reg names a register as the kernel dumps it (nft_dump_register): a register
// starting on a 16-byte boundary as NFT_REG_1..4 ("r1".."r4"), others as
// NFT_REG32_xx ("r9".."r23"). NFT_REG32_00 (8) and NFT_REG_1 (1) are the same
// register and both print "r1", as `nft --debug=netlink` shows them.
func reg(r uint32) string {
	if r == unix.NFT_REG_VERDICT {
		return "verdict"
	}
	if s, ok := regSlot(r); ok && s%4 == 0 {
		return fmt.Sprintf("r%d", s/4)
	}
	return fmt.Sprintf("r%d", r)
}

func hexb(b []byte) string { return "0x" + hex.EncodeToString(b) }

func fmtPayload(e *expr.Payload) string {
	if e.OperationType != expr.PayloadLoad {
		return fmt.Sprintf("payload write base %d +%d len %d from %s", e.Base, e.Offset, e.Len, reg(e.SourceRegister))
	}
	var what string
	switch {
	case e.Base == expr.PayloadBaseNetworkHeader && e.Len == 4 && e.Offset == 12:
		what = "ip saddr"
	case e.Base == expr.PayloadBaseNetworkHeader && e.Len == 4 && e.Offset == 16:
		what = "ip daddr"
	case e.Base == expr.PayloadBaseNetworkHeader && e.Len == 16 && e.Offset == 8:
		what = "ip6 saddr"
	case e.Base == expr.PayloadBaseNetworkHeader && e.Len == 16 && e.Offset == 24:
		what = "ip6 daddr"
	case e.Base == expr.PayloadBaseTransportHeader && e.Len == 2 && e.Offset == 0:
		what = "th sport"
	case e.Base == expr.PayloadBaseTransportHeader && e.Len == 2 && e.Offset == 2:
		what = "th dport"
	default:
		base := map[expr.PayloadBase]string{expr.PayloadBaseLLHeader: "link",
			expr.PayloadBaseNetworkHeader: "network", expr.PayloadBaseTransportHeader: "transport"}[e.Base]
		what = fmt.Sprintf("%s[%d:%d]", base, e.Offset, e.Len)
	}
	return fmt.Sprintf("payload %s => %s", what, reg(e.DestRegister))
}

func fmtLookup(e *expr.Lookup) string {
	s := "lookup " + reg(e.SourceRegister)
	if e.Invert {
		s += " !="
	}
	switch {
	case e.IsDestRegSet && e.DestRegister == unix.NFT_REG_VERDICT:
		return s + " vmap @" + e.SetName
	case e.IsDestRegSet:
		return s + " @" + e.SetName + " => " + reg(e.DestRegister)
	}
	return s + " @" + e.SetName
}

func fmtNAT(e *expr.NAT) string {
	kind := "snat"
	if e.Type == expr.NATTypeDestNAT {
		kind = "dnat"
	}
	s := fmt.Sprintf("%s family %d", kind, e.Family)
	if e.RegAddrMin != 0 {
		s += " addr " + reg(e.RegAddrMin)
		if e.RegAddrMax != 0 && e.RegAddrMax != e.RegAddrMin {
			s += "-" + reg(e.RegAddrMax)
		}
	}
	if e.RegProtoMin != 0 {
		s += " proto " + reg(e.RegProtoMin)
		if e.RegProtoMax != 0 && e.RegProtoMax != e.RegProtoMin {
			s += "-" + reg(e.RegProtoMax)
		}
	}
	if e.Prefix {
		s += " prefix"
	}
	return s + natFlags(e.Random, e.FullyRandom, e.Persistent)
}

func natFlags(random, fully, persistent bool) string {
	s := ""
	if random {
		s += " random"
	}
	if fully {
		s += " fully-random"
	}
	if persistent {
		s += " persistent"
	}
	return s
}

func fmtReject(e *expr.Reject) string {
	switch e.Type {
	case unix.NFT_REJECT_TCP_RST:
		return "reject with tcp reset"
	case unix.NFT_REJECT_ICMPX_UNREACH:
		return fmt.Sprintf("reject with icmpx code %d", e.Code)
	}
	return fmt.Sprintf("reject with icmp code %d", e.Code)
}

func fmtFib(e *expr.Fib) string {
	var flags []string
	for _, f := range []struct {
		on   bool
		name string
	}{{e.FlagSADDR, "saddr"}, {e.FlagDADDR, "daddr"}, {e.FlagMARK, "mark"}, {e.FlagIIF, "iif"}, {e.FlagOIF, "oif"}, {e.FlagPRESENT, "present"}} {
		if f.on {
			flags = append(flags, f.name)
		}
	}
	result := "?"
	switch {
	case e.ResultADDRTYPE:
		result = "type"
	case e.ResultOIF:
		result = "oif"
	case e.ResultOIFNAME:
		result = "oifname"
	}
	return fmt.Sprintf("fib %s %s => %s", strings.Join(flags, " . "), result, reg(e.Register))
}

func fmtDynset(e *expr.Dynset) string {
	op := map[uint32]string{unix.NFT_DYNSET_OP_ADD: "add", unix.NFT_DYNSET_OP_UPDATE: "update", nftDynsetOpDelete: "delete"}[e.Operation]
	if op == "" {
		op = fmt.Sprintf("op%d", e.Operation)
	}
	s := fmt.Sprintf("dynset %s @%s %s", op, e.SetName, reg(e.SrcRegKey))
	if e.SrcRegData != 0 {
		s += " : " + reg(e.SrcRegData)
	}
	if e.Timeout != 0 {
		s += " timeout " + e.Timeout.String()
	}
	if e.Invert {
		s += " inv"
	}
	return s
}

func verdictString(v *expr.Verdict) string {
	switch v.Kind {
	case expr.VerdictAccept:
		return "accept"
	case expr.VerdictDrop:
		return "drop"
	case expr.VerdictJump:
		return "jump " + v.Chain
	case expr.VerdictGoto:
		return "goto " + v.Chain
	case expr.VerdictReturn:
		return "return"
	case expr.VerdictContinue:
		return "continue"
	case expr.VerdictBreak:
		return "break"
	}
	return fmt.Sprintf("verdict %d", v.Kind)
}

func cmpOpName(op expr.CmpOp) string {
	switch op {
	case expr.CmpOpEq:
		return "=="
	case expr.CmpOpNeq:
		return "!="
	case expr.CmpOpLt:
		return "<"
	case expr.CmpOpLte:
		return "<="
	case expr.CmpOpGt:
		return ">"
	case expr.CmpOpGte:
		return ">="
	}
	return fmt.Sprintf("op%d", op)
}

func metaKeyName(k expr.MetaKey) string {
	switch k {
	case expr.MetaKeyL4PROTO:
		return "l4proto"
	case expr.MetaKeyMARK:
		return "mark"
	case expr.MetaKeyIIFNAME:
		return "iifname"
	case expr.MetaKeyOIFNAME:
		return "oifname"
	case expr.MetaKeyNFPROTO:
		return "nfproto"
	case expr.MetaKeyPROTOCOL:
		return "protocol"
	}
	return fmt.Sprintf("key%d", k)
}

func ctKeyName(k expr.CtKey) string {
	switch k {
	case expr.CtKeySTATE:
		return "state"
	case expr.CtKeySTATUS:
		return "status"
	case expr.CtKeyMARK:
		return "mark"
	case expr.CtKeyDIRECTION:
		return "direction"
	}
	return fmt.Sprintf("key%d", k)
}

func hookName(h *nftables.ChainHook) string {
	if h == nil {
		return ""
	}
	switch *h {
	case *nftables.ChainHookPrerouting:
		return "prerouting"
	case *nftables.ChainHookInput:
		return "input"
	case *nftables.ChainHookForward:
		return "forward"
	case *nftables.ChainHookOutput:
		return "output"
	case *nftables.ChainHookPostrouting:
		return "postrouting"
	}
	return fmt.Sprintf("hook%d", *h)
}

func chainHeader(c *Chain) string {
	if c.Hook == nil {
		return c.Name
	}
	prio := int32(0)
	if c.Priority != nil {
		prio = int32(*c.Priority)
	}
	return fmt.Sprintf("%s { type %s hook %s priority %d; }", c.Name, c.Type, hookName(c.Hook), prio)
}

// setHeader renders a set definition; where is "" or "<family> <table> ".
func setHeader(where string, s *Set) string {
	kind := "set"
	typ := s.KeyType.Name
	if s.IsMap {
		kind = "map"
		typ += " : " + s.DataType.Name
	}
	var flags []string
	if s.Concat {
		flags = append(flags, "concat")
	}
	if s.Dynamic {
		flags = append(flags, "dynamic")
	}
	if s.Timeout {
		flags = append(flags, "timeout")
	}
	h := fmt.Sprintf("%s %s%s { type %s", kind, where, s.Name, typ)
	if len(flags) > 0 {
		h += "; flags " + strings.Join(flags, ",")
	}
	if s.Size > 0 {
		h += fmt.Sprintf("; size %d", s.Size)
	}
	if s.Comment != "" {
		h += fmt.Sprintf("; comment %q", s.Comment)
	}
	return h + "; }"
}

// FormatElement renders an element as typed values ("10.0.0.1 . tcp . 80 : ...")
// when s is known and the byte lengths fit its types, as hex otherwise.
func FormatElement(s *Set, e Element) string {
	var key, data string
	if s != nil {
		key = formatValue(s.KeyType, e.Key)
	} else {
		key = hexb(e.Key)
	}
	switch {
	case e.Verdict != nil:
		data = verdictString(e.Verdict)
	case e.Data != nil && s != nil:
		data = formatValue(s.DataType, e.Data)
	case e.Data != nil:
		data = hexb(e.Data)
	default:
		return key
	}
	return key + " : " + data
}

// formatValue renders b as a value of type t. The fields of a concatenated type are
// each padded to 4 bytes; a single field is not.
func formatValue(t nftables.SetDatatype, b []byte) string {
	fields := nftables.ConcatSetTypeElements(t)
	lens := make([]int, len(fields))
	total := 0
	for i, f := range fields {
		lens[i] = int(f.Bytes)
		if len(fields) > 1 || t.Bytes%4 == 0 && t.Bytes != f.Bytes {
			lens[i] = (lens[i] + 3) &^ 3
		}
		total += lens[i]
	}
	if total != len(b) || total == 0 {
		return hexb(b)
	}
	parts := make([]string, len(fields))
	off := 0
	for i, f := range fields {
		parts[i] = formatField(f.Name, b[off:off+lens[i]])
		off += lens[i]
	}
	return strings.Join(parts, " . ")
}

func formatField(typ string, b []byte) string {
	switch typ {
	case "ipv4_addr", "ipv6_addr":
		if a, ok := netip.AddrFromSlice(b); ok {
			return a.String()
		}
	case "inet_proto":
		return protoName(b[0])
	case "inet_service":
		return fmt.Sprint(binary.BigEndian.Uint16(b))
	case "integer", "mark":
		if len(b) == 4 {
			return fmt.Sprint(binaryutil.NativeEndian.Uint32(b))
		}
	}
	return hexb(b)
}

func protoName(p uint8) string {
	switch p {
	case unix.IPPROTO_TCP:
		return "tcp"
	case unix.IPPROTO_UDP:
		return "udp"
	case unix.IPPROTO_SCTP:
		return "sctp"
	case unix.IPPROTO_ICMP:
		return "icmp"
	case unix.IPPROTO_ICMPV6:
		return "ipv6-icmp"
	}
	return fmt.Sprint(p)
}

// ruleUserData encodes a rule comment as nft does (NFTNL_UDATA_RULE_COMMENT, type 0).
func ruleUserData(comment string) []byte {
	if comment == "" {
		return nil
	}
	return userdata.AppendString(nil, userdata.TypeComment, comment)
}

// ruleComment decodes the comment from rule user data.
func ruleComment(ud []byte) string {
	s, _ := userdata.GetString(ud, userdata.TypeComment)
	return s
}
