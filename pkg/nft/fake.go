package nft

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// Fake is an in-memory model of the kernel's nftables state for both families. It
// applies transactions with the kernel's semantics (see Apply), prints its state
// canonically (Dump) and traces packets through the stored rules (Trace). It is
// safe for concurrent use.
type Fake struct {
	mu     sync.Mutex
	tables map[tableID]*fTable

	transactions   int
	lastElementOps int
	failNext       error
}

type tableID struct {
	proto uint8
	name  string
}

type fTable struct {
	name   string
	chains map[string]*Chain // a stored Chain is never modified, only replaced
	sets   map[string]*fSet
}

type fSet struct {
	def   Set
	elems map[string]Element // by string(Key)
}

// NewFake returns an empty Fake.
func NewFake() *Fake { return &Fake{tables: map[tableID]*fTable{}} }

var _ Kernel = (*Fake)(nil)

// FailNext makes the next Apply fail with err (wrapped) without changing anything,
// as a kernel error would.
func (f *Fake) FailNext(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failNext = err
}

// Transactions returns the number of non-empty transactions applied successfully.
func (f *Fake) Transactions() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.transactions
}

// LastElementOps returns Tx.ElementOps of the last successful transaction.
func (f *Fake) LastElementOps() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastElementOps
}

// Apply commits tx with the kernel's semantics: the operations run in order and
// either all apply or, on the first failure, none does. Failures wrap a
// syscall.Errno as the kernel would return it: ENOENT for a missing table, set,
// chain or element (including sets named by lookup/dynset and chains named by
// jump/goto), EEXIST for an element key present with other data or an object
// redefined with another type, EBUSY for deleting a referenced set or chain, EINVAL
// for element or rule data of the wrong length or kind, ENODATA for a rule reading
// a register it has not written (kernel 6.x register tracking), ELOOP for a jump
// loop and EOPNOTSUPP for NAT or dynset misuse.
func (f *Fake) Apply(ctx context.Context, tx *Tx) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if tx == nil || tx.Family == nil {
		return fmt.Errorf("nft: transaction without family: %w", syscall.EINVAL)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(tx.Ops) == 0 {
		return nil // Netlink sends nothing either
	}
	if err := f.failNext; err != nil {
		f.failNext = nil
		return fmt.Errorf("nft %s: injected failure: %w", tx.Family, err)
	}
	w := f.begin(tx.Family)
	for i, op := range tx.Ops {
		if err := w.apply(op); err != nil {
			return fmt.Errorf("nft %s: op %d (%s %s): %w", tx.Family, i, op.Kind, op.object(), err)
		}
	}
	if err := w.validateGraph(); err != nil {
		return fmt.Errorf("nft %s: commit: %w", tx.Family, err)
	}
	f.commit(w)
	f.transactions++
	f.lastElementOps = tx.ElementOps()
	return nil
}

// work is a transaction in progress: a copy of one family's tables in which sets are
// copied on first write, so that a failed transaction leaves the Fake untouched.
type work struct {
	fam    *family.Family
	tables map[string]*fTable
	owned  map[*fSet]bool
}

func (f *Fake) begin(fam *family.Family) *work {
	w := &work{fam: fam, tables: map[string]*fTable{}, owned: map[*fSet]bool{}}
	for id, t := range f.tables {
		if id.proto == fam.NFProto {
			w.tables[id.name] = &fTable{name: t.name, chains: maps.Clone(t.chains), sets: maps.Clone(t.sets)}
		}
	}
	return w
}

func (f *Fake) commit(w *work) {
	for id := range f.tables {
		if id.proto == w.fam.NFProto {
			delete(f.tables, id)
		}
	}
	for name, t := range w.tables {
		f.tables[tableID{w.fam.NFProto, name}] = t
	}
}

func (w *work) apply(op Op) error {
	if op.Kind == OpAddTable {
		if _, ok := w.tables[op.Table]; !ok {
			w.tables[op.Table] = &fTable{name: op.Table, chains: map[string]*Chain{}, sets: map[string]*fSet{}}
		}
		return nil
	}
	if op.Kind == OpDeleteTable {
		delete(w.tables, op.Table)
		return nil
	}
	t, ok := w.tables[op.Table]
	if !ok {
		return fmt.Errorf("table %s: %w", op.Table, syscall.ENOENT)
	}
	switch op.Kind {
	case OpAddSet:
		return w.addSet(t, op.Set)
	case OpDeleteSet:
		return w.deleteSet(t, op.SetName)
	case OpSetChain:
		return w.setChain(t, op.Chain)
	case OpAppendRules:
		return w.appendRules(t, op.Chain)
	case OpDeleteChain:
		return w.deleteChain(t, op.Name)
	case OpAddElements:
		return w.addElements(t, op.SetName, op.Elements)
	case OpDeleteElements:
		return w.deleteElements(t, op.SetName, op.Elements)
	case OpFlushSet:
		s, err := w.writableSet(t, op.SetName)
		if err != nil {
			return err
		}
		clear(s.elems)
		return nil
	}
	return fmt.Errorf("unknown operation %d: %w", op.Kind, syscall.EOPNOTSUPP)
}

// maxDataLen is NFT_DATA_VALUE_MAXLEN, the longest key or data value.
const maxDataLen = 64

func (w *work) addSet(t *fTable, s *Set) error {
	if s == nil || s.Name == "" {
		return fmt.Errorf("set without name: %w", syscall.EINVAL)
	}
	if s.KeyType.Bytes == 0 || s.KeyType.Bytes > maxDataLen {
		return fmt.Errorf("key type %q of %d bytes: %w", s.KeyType.Name, s.KeyType.Bytes, syscall.EINVAL)
	}
	if s.IsMap && !isVerdictType(s.DataType) && (s.DataType.Bytes == 0 || s.DataType.Bytes > maxDataLen) {
		return fmt.Errorf("data type %q of %d bytes: %w", s.DataType.Name, s.DataType.Bytes, syscall.EINVAL)
	}
	if old, ok := t.sets[s.Name]; ok {
		// The kernel accepts NEWSET for an existing set only if it has the same flags
		// and types (nf_tables_newset), EEXIST otherwise.
		if !sameSetType(&old.def, s) {
			return fmt.Errorf("exists with another type or flags: %w", syscall.EEXIST)
		}
		return nil
	}
	ns := &fSet{def: *s, elems: map[string]Element{}}
	t.sets[s.Name] = ns
	w.owned[ns] = true
	return nil
}

func sameSetType(a, b *Set) bool {
	return a.KeyType.Name == b.KeyType.Name && a.KeyType.Bytes == b.KeyType.Bytes &&
		a.IsMap == b.IsMap && (!a.IsMap || a.DataType.Name == b.DataType.Name && a.DataType.Bytes == b.DataType.Bytes) &&
		a.Concat == b.Concat && a.Timeout == b.Timeout && a.Dynamic == b.Dynamic
}

// isVerdictType reports whether t is nftables.TypeVerdict (nft magic 1).
func isVerdictType(t nftables.SetDatatype) bool { return t.GetNFTMagic() == 1 }

func (w *work) deleteSet(t *fTable, name string) error {
	if _, ok := t.sets[name]; !ok {
		return fmt.Errorf("%w", syscall.ENOENT)
	}
	if ch, ok := setUser(t, name); ok {
		return fmt.Errorf("used by chain %s: %w", ch, syscall.EBUSY)
	}
	delete(t.sets, name)
	return nil
}

// setUser returns a chain with a rule that names set.
func setUser(t *fTable, set string) (string, bool) {
	for _, name := range slices.Sorted(maps.Keys(t.chains)) {
		for _, r := range t.chains[name].Rules {
			for _, e := range r.Exprs {
				switch e := e.(type) {
				case *expr.Lookup:
					if e.SetName == set {
						return name, true
					}
				case *expr.Dynset:
					if e.SetName == set {
						return name, true
					}
				}
			}
		}
	}
	return "", false
}

func (w *work) setChain(t *fTable, c *Chain) error {
	if c == nil || c.Name == "" {
		return fmt.Errorf("chain without name: %w", syscall.EINVAL)
	}
	if (c.Hook == nil) != (c.Priority == nil) {
		// google/nftables sends a hook only when both are set.
		return fmt.Errorf("hook and priority must be set together: %w", syscall.EINVAL)
	}
	nc := &Chain{Name: c.Name, Hook: c.Hook, Priority: c.Priority, Type: c.Type}
	if nc.Hook != nil && nc.Type == "" {
		nc.Type = "filter" // the kernel's default chain type
	}
	if old, ok := t.chains[c.Name]; ok {
		switch {
		case nc.Hook == nil:
			// Updating a chain without hook attributes keeps what it is.
			nc.Hook, nc.Priority, nc.Type = old.Hook, old.Priority, old.Type
		case old.Hook == nil || *old.Hook != *nc.Hook || *old.Priority != *nc.Priority || old.Type != nc.Type:
			return fmt.Errorf("exists with another hook, priority or type: %w", syscall.EEXIST)
		}
	}
	// The chain exists (without rules) while its rules are checked: a rule may
	// reference it only through a loop, which validateGraph rejects.
	t.chains[c.Name] = nc
	for i, r := range c.Rules {
		if err := w.validateRule(t, r); err != nil {
			return fmt.Errorf("rule %d: %w", i, err)
		}
		nc.Rules = append(nc.Rules, Rule{Exprs: cloneExprs(r.Exprs), Comment: r.Comment})
	}
	return nil
}

func (w *work) appendRules(t *fTable, c *Chain) error {
	if c == nil || c.Name == "" {
		return fmt.Errorf("chain without name: %w", syscall.EINVAL)
	}
	old, ok := t.chains[c.Name]
	if !ok {
		return fmt.Errorf("chain %s: %w", c.Name, syscall.ENOENT)
	}
	nc := *old // committed chains are shared: copy on write
	nc.Rules = slices.Clone(old.Rules)
	t.chains[c.Name] = &nc
	for i, r := range c.Rules {
		if err := w.validateRule(t, r); err != nil {
			return fmt.Errorf("rule %d: %w", i, err)
		}
		nc.Rules = append(nc.Rules, Rule{Exprs: cloneExprs(r.Exprs), Comment: r.Comment})
	}
	return nil
}

func (w *work) deleteChain(t *fTable, name string) error {
	if _, ok := t.chains[name]; !ok {
		return fmt.Errorf("%w", syscall.ENOENT)
	}
	if by, ok := chainUser(t, name); ok {
		return fmt.Errorf("referenced by %s: %w", by, syscall.EBUSY)
	}
	delete(t.chains, name)
	return nil
}

// chainUser returns what jumps to chain: another chain's rule or a verdict map.
func chainUser(t *fTable, chain string) (string, bool) {
	for _, name := range slices.Sorted(maps.Keys(t.chains)) {
		if name == chain {
			continue
		}
		for _, r := range t.chains[name].Rules {
			for _, e := range r.Exprs {
				if v, ok := e.(*expr.Verdict); ok && v.Chain == chain {
					return "chain " + name, true
				}
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(t.sets)) {
		for _, e := range t.sets[name].elems {
			if e.Verdict != nil && e.Verdict.Chain == chain {
				return "map " + name, true
			}
		}
	}
	return "", false
}

func (w *work) writableSet(t *fTable, name string) (*fSet, error) {
	s, ok := t.sets[name]
	if !ok {
		return nil, fmt.Errorf("%w", syscall.ENOENT)
	}
	if !w.owned[s] {
		s = &fSet{def: s.def, elems: maps.Clone(s.elems)}
		t.sets[name] = s
		w.owned[s] = true
	}
	return s, nil
}

func (w *work) addElements(t *fTable, set string, elems []Element) error {
	s, err := w.writableSet(t, set)
	if err != nil {
		return err
	}
	for _, e := range elems {
		if err := checkElement(t, &s.def, e); err != nil {
			return err
		}
		k := string(e.Key)
		if old, ok := s.elems[k]; ok {
			if !sameData(old, e) {
				return fmt.Errorf("element %s exists with other data: %w", FormatElement(&s.def, old), syscall.EEXIST)
			}
			continue
		}
		if s.def.Size > 0 && uint32(len(s.elems)) >= s.def.Size {
			return fmt.Errorf("set full (size %d): %w", s.def.Size, syscall.ENFILE)
		}
		s.elems[k] = cloneElement(e)
	}
	return nil
}

func (w *work) deleteElements(t *fTable, set string, elems []Element) error {
	s, err := w.writableSet(t, set)
	if err != nil {
		return err
	}
	for _, e := range elems {
		if len(e.Key) != int(s.def.KeyType.Bytes) {
			return fmt.Errorf("key %s: length %d, set key is %d bytes: %w", hexb(e.Key), len(e.Key), s.def.KeyType.Bytes, syscall.EINVAL)
		}
		k := string(e.Key)
		if _, ok := s.elems[k]; !ok {
			return fmt.Errorf("element %s: %w", formatValue(s.def.KeyType, e.Key), syscall.ENOENT)
		}
		delete(s.elems, k)
	}
	return nil
}

// checkElement checks an element against its set's types as nft_setelem_parse_key
// and nft_setelem_parse_data do.
func checkElement(t *fTable, s *Set, e Element) error {
	if len(e.Key) != int(s.KeyType.Bytes) {
		return fmt.Errorf("key %s: length %d, set key is %d bytes: %w", hexb(e.Key), len(e.Key), s.KeyType.Bytes, syscall.EINVAL)
	}
	if e.Timeout != 0 && !s.Timeout {
		return fmt.Errorf("element %s with a timeout in a set without timeouts: %w", hexb(e.Key), syscall.EINVAL)
	}
	switch {
	case !s.IsMap:
		if e.Data != nil || e.Verdict != nil {
			return fmt.Errorf("element with data in a set: %w", syscall.EINVAL)
		}
	case isVerdictType(s.DataType):
		if e.Verdict == nil {
			return fmt.Errorf("verdict map element without verdict: %w", syscall.EINVAL)
		}
		return checkVerdictTarget(t, e.Verdict)
	default:
		if e.Verdict != nil || len(e.Data) != int(s.DataType.Bytes) {
			return fmt.Errorf("data %s: length %d, map data is %d bytes: %w", hexb(e.Data), len(e.Data), s.DataType.Bytes, syscall.EINVAL)
		}
	}
	return nil
}

// checkVerdictTarget checks that a jump or goto names an existing regular chain.
func checkVerdictTarget(t *fTable, v *expr.Verdict) error {
	if v.Kind != expr.VerdictJump && v.Kind != expr.VerdictGoto {
		return nil
	}
	c, ok := t.chains[v.Chain]
	if !ok {
		return fmt.Errorf("%s: chain %s: %w", verdictString(v), v.Chain, syscall.ENOENT)
	}
	if c.Hook != nil {
		return fmt.Errorf("%s: base chain %s: %w", verdictString(v), v.Chain, syscall.EOPNOTSUPP)
	}
	return nil
}

func sameData(a, b Element) bool {
	if (a.Verdict == nil) != (b.Verdict == nil) {
		return false
	}
	if a.Verdict != nil {
		return *a.Verdict == *b.Verdict
	}
	return bytes.Equal(a.Data, b.Data)
}

func cloneElement(e Element) Element {
	c := Element{Key: bytes.Clone(e.Key), Data: bytes.Clone(e.Data), Timeout: e.Timeout, Expires: e.Expires}
	if c.Expires == 0 {
		c.Expires = c.Timeout // the fake's clock does not run
	}
	if e.Verdict != nil {
		v := *e.Verdict
		c.Verdict = &v
	}
	return c
}

// ListTables returns the family's table names, sorted.
func (f *Fake) ListTables(ctx context.Context, fam *family.Family) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var names []string
	for id := range f.tables {
		if id.proto == fam.NFProto {
			names = append(names, id.name)
		}
	}
	sort.Strings(names)
	return names, nil
}

// ListChains returns copies of the chains of table sorted by name. The expressions
// are shared with the Fake and must not be modified.
func (f *Fake) ListChains(ctx context.Context, fam *family.Family, table string) ([]*Chain, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.tables[tableID{fam.NFProto, table}]
	if !ok {
		return nil, fmt.Errorf("nft %s: table %s: %w", fam, table, syscall.ENOENT)
	}
	var out []*Chain
	for _, name := range slices.Sorted(maps.Keys(t.chains)) {
		c := *t.chains[name]
		c.Rules = slices.Clone(c.Rules)
		out = append(out, &c)
	}
	return out, nil
}

// ListRules returns a copy of the rules of one chain; a missing table or chain
// has no rules, as the kernel's dump answers. The expressions are shared with
// the Fake.
func (f *Fake) ListRules(ctx context.Context, fam *family.Family, table, chain string) ([]Rule, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.tables[tableID{fam.NFProto, table}]
	if !ok {
		return nil, nil
	}
	c, ok := t.chains[chain]
	if !ok {
		return nil, nil
	}
	return slices.Clone(c.Rules), nil
}

// ListElements returns copies of the elements of a set sorted by key.
func (f *Fake) ListElements(ctx context.Context, fam *family.Family, table, set string) ([]Element, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.lookupSet(fam, table, set)
	if err != nil {
		return nil, err
	}
	return sortedElements(s), nil
}

// Set returns the definition of a set, or false.
func (f *Fake) Set(fam *family.Family, table, set string) (Set, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, err := f.lookupSet(fam, table, set)
	if err != nil {
		return Set{}, false
	}
	return s.def, true
}

func (f *Fake) lookupSet(fam *family.Family, table, set string) (*fSet, error) {
	t, ok := f.tables[tableID{fam.NFProto, table}]
	if !ok {
		return nil, fmt.Errorf("nft %s: table %s: %w", fam, table, syscall.ENOENT)
	}
	s, ok := t.sets[set]
	if !ok {
		return nil, fmt.Errorf("nft %s: set %s/%s: %w", fam, table, set, syscall.ENOENT)
	}
	return s, nil
}

func sortedElements(s *fSet) []Element {
	out := make([]Element, 0, len(s.elems))
	for _, k := range slices.Sorted(maps.Keys(s.elems)) {
		out = append(out, cloneElement(s.elems[k]))
	}
	return out
}

// Dump prints the family's whole state canonically: tables by name, in each the
// chains by name (rules in order, see FormatRule) and then the sets by name with
// their elements sorted by key bytes and rendered by type. Two Fakes holding the
// same state print the same text.
func (f *Fake) Dump(fam *family.Family) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	var names []string
	for id := range f.tables {
		if id.proto == fam.NFProto {
			names = append(names, id.name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		t := f.tables[tableID{fam.NFProto, name}]
		fmt.Fprintf(&b, "table %s %s\n", fam.NFTFamilyName, name)
		for _, cn := range slices.Sorted(maps.Keys(t.chains)) {
			c := t.chains[cn]
			fmt.Fprintf(&b, "  chain %s\n", chainHeader(c))
			for i, r := range c.Rules {
				fmt.Fprintf(&b, "    %d: %s\n", i, FormatRule(r))
			}
		}
		for _, sn := range slices.Sorted(maps.Keys(t.sets)) {
			s := t.sets[sn]
			fmt.Fprintf(&b, "  %s\n", setHeader("", &s.def))
			for _, e := range sortedElements(s) {
				fmt.Fprintf(&b, "    %s\n", FormatElement(&s.def, e))
			}
		}
	}
	return b.String()
}
