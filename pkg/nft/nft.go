// Package nft is dsproxy's kernel layer for nftables: a transaction is inert data
// that can be printed and inspected; only a Kernel's Apply touches the system.
// Netlink (the real kernel, over github.com/google/nftables, no nft binary) and Fake
// (an in-memory model of the kernel with a packet tracer) implement Kernel.
//
// Rules are google/nftables expression lists, so the Fake evaluates exactly the
// expressions the real kernel receives.
package nft

import (
	"context"
	"errors"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// Chain is a chain with its complete rule list.
type Chain struct {
	Name string
	// Hook, Priority and Type make a base chain; Hook nil means a regular chain.
	Hook     *nftables.ChainHook
	Priority *nftables.ChainPriority
	Type     nftables.ChainType
	Rules    []Rule
}

// Rule is one rule: its expressions and an optional comment (stored as rule
// user data, shown by nft).
type Rule struct {
	Exprs   []expr.Any
	Comment string
}

// Set is a set or map definition. Key and data types are built with
// nftables.ConcatSetType for concatenations; every field is padded to 4 bytes.
type Set struct {
	Name     string
	KeyType  nftables.SetDatatype
	DataType nftables.SetDatatype // only for maps
	IsMap    bool
	Concat   bool
	Timeout  bool // elements may carry timeouts
	Dynamic  bool // updated from the packet path (dynset)
	Size     uint32
	Comment  string
}

// Element is one set or map element as the kernel stores it: raw key and data bytes
// (data nil for plain sets). Elements of verdict maps (DataType
// nftables.TypeVerdict) carry Verdict instead of Data; a jump or goto verdict
// references its chain like a rule does.
type Element struct {
	Key     []byte
	Data    []byte
	Verdict *expr.Verdict
	// Timeout, in a set with timeouts, is how long an added element lives (0: no
	// timeout of its own); ListElements returns it as the kernel reports it.
	// Millisecond resolution.
	Timeout time.Duration
	// Expires is the life an element has left (ListElements only).
	Expires time.Duration
}

// OpKind is the kind of one transaction operation.
type OpKind int

// Transaction operations.
const (
	// OpAddTable creates the table if absent.
	OpAddTable OpKind = iota
	// OpDeleteTable deletes the table and everything in it; absent is not an error.
	OpDeleteTable
	// OpAddSet creates the set if absent (an existing set must have the same type).
	OpAddSet
	// OpDeleteSet deletes a set that no rule references.
	OpDeleteSet
	// OpSetChain creates the chain if absent and replaces its rules with Chain.Rules.
	OpSetChain
	// OpDeleteChain deletes a chain and its rules; a chain still referenced by a
	// jump/goto in another chain or by a verdict map element fails (EBUSY).
	OpDeleteChain
	// OpAddElements adds elements; adding an identical element is a no-op, adding a
	// key that exists with other data fails (EEXIST).
	OpAddElements
	// OpDeleteElements deletes elements by key; a missing key fails (ENOENT).
	OpDeleteElements
	// OpFlushSet removes every element of a set.
	OpFlushSet
	// OpAppendRules adds Chain.Rules at the end of the existing chain Chain.Name,
	// keeping its rules: unlike OpSetChain, the kernel checks only the new rules'
	// bindings, so adding one rule costs the same however big the table's sets are.
	OpAppendRules
)

// Op is one operation of a transaction.
type Op struct {
	Kind     OpKind
	Table    string
	Set      *Set      // OpAddSet
	SetName  string    // OpDeleteSet, OpAddElements, OpDeleteElements, OpFlushSet
	Chain    *Chain    // OpSetChain, OpAppendRules
	Name     string    // OpDeleteChain
	Elements []Element // OpAddElements, OpDeleteElements (Data ignored)
}

// Tx is one kernel transaction: every operation applies, or none does.
type Tx struct {
	Family *family.Family
	Ops    []Op
}

// ErrNotFound is the cause wrapped by errors about a missing table, chain, set or
// element, from the kernel and from the Fake alike (it is syscall.ENOENT).
var ErrNotFound error = syscall.ENOENT

// IsNotFound reports whether err says a table, chain, set or element is missing.
func IsNotFound(err error) bool { return errors.Is(err, syscall.ENOENT) }

// IsExist reports whether err says an element exists with other data, or an
// object exists with another type.
func IsExist(err error) bool { return errors.Is(err, syscall.EEXIST) }

// IsBusy reports whether err says an object is still referenced.
func IsBusy(err error) bool { return errors.Is(err, syscall.EBUSY) }

// Kernel applies transactions to one family's nftables state.
type Kernel interface {
	// Apply commits tx atomically. Errors wrap the cause (a syscall.Errno where the
	// kernel gave one) and name the failing operation.
	Apply(ctx context.Context, tx *Tx) error
	// ListChains returns the chains of table with their rules; ErrNotFound-wrapping
	// error when the table is absent.
	ListChains(ctx context.Context, f *family.Family, table string) ([]*Chain, error)
	// ListRules returns the rules of one chain, one netlink dump. A missing table
	// or chain has no rules (the kernel's dump answers so, without an error).
	ListRules(ctx context.Context, f *family.Family, table, chain string) ([]Rule, error)
	// ListElements returns the elements of a set.
	ListElements(ctx context.Context, f *family.Family, table, set string) ([]Element, error)
	// ListTables returns the names of the family's tables.
	ListTables(ctx context.Context, f *family.Family) ([]string, error)
}
