package nft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables/binaryutil"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// NewTx returns an empty transaction for family f.
func NewTx(f *family.Family) *Tx { return &Tx{Family: f} }

// AddTable queues the creation of table (a no-op if it exists).
func (tx *Tx) AddTable(table string) {
	tx.Ops = append(tx.Ops, Op{Kind: OpAddTable, Table: table})
}

// DeleteTable queues the deletion of table and everything in it; an absent table
// is not an error.
func (tx *Tx) DeleteTable(table string) {
	tx.Ops = append(tx.Ops, Op{Kind: OpDeleteTable, Table: table})
}

// AddSet queues the creation of s in table (a no-op if an identical set exists).
func (tx *Tx) AddSet(table string, s *Set) {
	tx.Ops = append(tx.Ops, Op{Kind: OpAddSet, Table: table, Set: s})
}

// DeleteSet queues the deletion of a set no rule references.
func (tx *Tx) DeleteSet(table, set string) {
	tx.Ops = append(tx.Ops, Op{Kind: OpDeleteSet, Table: table, SetName: set})
}

// SetChain queues the creation of c if absent and the replacement of its rules.
// Jump and goto targets and the sets the rules use must exist at this point of the
// transaction (the kernel resolves them when the rule is added).
func (tx *Tx) SetChain(table string, c *Chain) {
	tx.Ops = append(tx.Ops, Op{Kind: OpSetChain, Table: table, Chain: c})
}

// AppendRules queues the addition of rules at the end of the existing chain.
func (tx *Tx) AppendRules(table, chain string, rules []Rule) {
	if len(rules) == 0 {
		return
	}
	tx.Ops = append(tx.Ops, Op{Kind: OpAppendRules, Table: table, Chain: &Chain{Name: chain, Rules: rules}})
}

// DeleteChain queues the deletion of a chain (and its rules) that no rule or verdict
// map element references.
func (tx *Tx) DeleteChain(table, chain string) {
	tx.Ops = append(tx.Ops, Op{Kind: OpDeleteChain, Table: table, Name: chain})
}

// AddElements queues the addition of elems to a set or map. Adding an identical
// element is a no-op; changing a map element's data needs DeleteElements first.
func (tx *Tx) AddElements(table, set string, elems []Element) {
	if len(elems) == 0 {
		return
	}
	tx.Ops = append(tx.Ops, Op{Kind: OpAddElements, Table: table, SetName: set, Elements: elems})
}

// DeleteElements queues the deletion of elems by key; a missing key fails the
// transaction (ENOENT).
func (tx *Tx) DeleteElements(table, set string, elems []Element) {
	if len(elems) == 0 {
		return
	}
	tx.Ops = append(tx.Ops, Op{Kind: OpDeleteElements, Table: table, SetName: set, Elements: elems})
}

// FlushSet queues the removal of every element of a set.
func (tx *Tx) FlushSet(table, set string) {
	tx.Ops = append(tx.Ops, Op{Kind: OpFlushSet, Table: table, SetName: set})
}

// Len returns the number of operations.
func (tx *Tx) Len() int { return len(tx.Ops) }

// ElementOps counts the element additions and deletions (a flush counts as one).
func (tx *Tx) ElementOps() int {
	n := 0
	for _, op := range tx.Ops {
		switch op.Kind {
		case OpAddElements, OpDeleteElements:
			n += len(op.Elements)
		case OpFlushSet:
			n++
		}
	}
	return n
}

// String prints the transaction, one operation a line, in an nft-like syntax.
// Elements are rendered by type when the set is created in the same transaction,
// as hex otherwise.
func (tx *Tx) String() string {
	var b strings.Builder
	fam := "?"
	if tx.Family != nil {
		fam = tx.Family.NFTFamilyName
	}
	sets := map[[2]string]*Set{}
	for _, op := range tx.Ops {
		if op.Kind == OpAddSet && op.Set != nil {
			sets[[2]string{op.Table, op.Set.Name}] = op.Set
		}
	}
	for _, op := range tx.Ops {
		if (op.Kind == OpAddSet && op.Set == nil) || ((op.Kind == OpSetChain || op.Kind == OpAppendRules) && op.Chain == nil) {
			fmt.Fprintf(&b, "# invalid %s without object in table %s\n", op.Kind, op.Table)
			continue
		}
		writeOp(&b, fam, op, sets[[2]string{op.Table, op.SetName}])
	}
	return b.String()
}

func writeOp(b *strings.Builder, fam string, op Op, set *Set) {
	switch op.Kind {
	case OpAddTable:
		fmt.Fprintf(b, "add table %s %s\n", fam, op.Table)
	case OpDeleteTable:
		fmt.Fprintf(b, "delete table %s %s\n", fam, op.Table)
	case OpAddSet:
		fmt.Fprintf(b, "add %s\n", setHeader(fam+" "+op.Table+" ", op.Set))
	case OpDeleteSet:
		fmt.Fprintf(b, "delete set %s %s %s\n", fam, op.Table, op.SetName)
	case OpSetChain:
		fmt.Fprintf(b, "add chain %s %s %s\n", fam, op.Table, chainHeader(op.Chain))
		fmt.Fprintf(b, "flush chain %s %s %s\n", fam, op.Table, op.Chain.Name)
		for _, r := range op.Chain.Rules {
			fmt.Fprintf(b, "add rule %s %s %s %s\n", fam, op.Table, op.Chain.Name, FormatRule(r))
		}
	case OpAppendRules:
		for _, r := range op.Chain.Rules {
			fmt.Fprintf(b, "add rule %s %s %s %s\n", fam, op.Table, op.Chain.Name, FormatRule(r))
		}
	case OpDeleteChain:
		fmt.Fprintf(b, "delete chain %s %s %s\n", fam, op.Table, op.Name)
	case OpAddElements, OpDeleteElements:
		verb := "add"
		if op.Kind == OpDeleteElements {
			verb = "delete"
		}
		for _, e := range op.Elements {
			fmt.Fprintf(b, "%s element %s %s %s { %s }\n", verb, fam, op.Table, op.SetName, FormatElement(set, e))
		}
	case OpFlushSet:
		fmt.Fprintf(b, "flush set %s %s %s\n", fam, op.Table, op.SetName)
	default:
		fmt.Fprintf(b, "# unknown op kind %d\n", op.Kind)
	}
}

func (k OpKind) String() string {
	switch k {
	case OpAddTable:
		return "add table"
	case OpDeleteTable:
		return "delete table"
	case OpAddSet:
		return "add set"
	case OpDeleteSet:
		return "delete set"
	case OpSetChain:
		return "set chain"
	case OpDeleteChain:
		return "delete chain"
	case OpAddElements:
		return "add elements"
	case OpDeleteElements:
		return "delete elements"
	case OpFlushSet:
		return "flush set"
	case OpAppendRules:
		return "append rules"
	}
	return fmt.Sprintf("op(%d)", int(k))
}

// object names the object an operation touches, for error messages.
func (op Op) object() string {
	switch op.Kind {
	case OpAddTable, OpDeleteTable:
		return "table " + op.Table
	case OpAddSet:
		if op.Set == nil {
			return "set <nil> in table " + op.Table
		}
		return "set " + op.Table + "/" + op.Set.Name
	case OpSetChain, OpAppendRules:
		if op.Chain == nil {
			return "chain <nil> in table " + op.Table
		}
		return "chain " + op.Table + "/" + op.Chain.Name
	case OpDeleteChain:
		return "chain " + op.Table + "/" + op.Name
	}
	return "set " + op.Table + "/" + op.SetName
}

// Key and data encoding. Every field of a concatenation takes whole 32-bit
// registers, so each helper returns a multiple of 4 bytes, except AddrBytes for
// IPv4 (4) and IPv6 (16), which already are.

// AddrBytes returns a in network order: 4 bytes for IPv4 (including IPv4-mapped
// IPv6, which is unmapped), 16 for IPv6.
func AddrBytes(a netip.Addr) []byte { return a.Unmap().AsSlice() }

// ProtoBytes encodes an L4 protocol as meta l4proto leaves it in a register: one
// byte, zero-padded to 4.
func ProtoBytes(p uint8) []byte { return []byte{p, 0, 0, 0} }

// PortBytes encodes a port as a th dport/sport payload load leaves it: big-endian,
// zero-padded to 4.
func PortBytes(p uint16) []byte {
	b := make([]byte, 4)
	binary.BigEndian.PutUint16(b, p)
	return b
}

// IndexBytes encodes an endpoint index as numgen writes it: a host-endian u32.
func IndexBytes(i uint32) []byte { return binaryutil.NativeEndian.PutUint32(i) }

// MarkBytes encodes a packet mark (or any u32 that meta/ct load, such as a ct state
// bit mask or a fib address type) as the kernel keeps it in a register: host-endian.
func MarkBytes(m uint32) []byte { return binaryutil.NativeEndian.PutUint32(m) }

// Concat concatenates fields into one key or data value.
func Concat(fields ...[]byte) []byte {
	n := 0
	for _, f := range fields {
		n += len(f)
	}
	out := make([]byte, 0, n)
	for _, f := range fields {
		out = append(out, f...)
	}
	return out
}
