package nftables

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/google/nftables/expr"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// rebuild builds the whole ruleset from req under the table name that is not live,
// without base chains, in transactions of at most MaxElementsPerTx elements; the
// last one adds the base chains and deletes the old table, so traffic switches
// atomically and is never left without rules. repairs is carried into the result.
//
// The alternative, one transaction that deletes and recreates the table, holds the
// nftables lock for the whole load (about 2 s at 30k services in the spike) where
// the chunked build holds it at most about 60 ms per chunk (5000 elements at 30k
// services, bench TestKernelFigures); the swap itself only adds eight one-rule
// base chains and deletes a table, whose elements the kernel frees after the
// commit.
func (b *Backend) rebuild(ctx context.Context, req *proxier.SyncRequest, repairs int) (SyncResult, error) {
	res := SyncResult{Repairs: repairs}
	b.dirty = true // until the swap commits
	live, err := b.liveTable(ctx)
	if err != nil {
		return res, err
	}
	if b.table != "" && live != b.table {
		// The table this backend last built is gone or unhooked, someone
		// else's doing: a repair (one, if verify counted it already).
		res.Repairs = max(res.Repairs, 1)
	}
	target := otherTable(live)
	carry := b.affinityEntries(ctx, live)
	c := newCache(b.x)
	c.fill(req, b.c)
	carry = b.moveCarried(carry, c.takeMoves())
	carry = c.liveAffinity(carry, b.f.BitLen/8)
	p := c.drain(target, true)
	p.chains = c.chainOps(target)
	n, next := b.coldTxs(c, target, p)
	for i := range n {
		tx := next()
		if i == n-1 && len(carry) > 0 {
			// The clients' affinity moves with the swap. Should the kernel refuse
			// an entry (a table of another version), the swap goes without them.
			withCarry := *tx
			withCarry.Ops = append(slices.Clip(tx.Ops), carry...)
			var carried SyncResult
			err := b.apply(ctx, &withCarry, &carried)
			if err == nil {
				res.Transactions += carried.Transactions
				res.Operations += carried.Operations
				continue
			}
			klog.InfoS("Rebuilt the nftables table without the ClientIP affinity entries of the old one", "ipFamily", b.f.Name, "err", err)
		}
		if err := b.apply(ctx, tx, &res); err != nil {
			return res, fmt.Errorf("nftables %s: rebuild of table %s, transaction %d of %d: %w", b.f, target, i+1, n, err)
		}
	}
	b.c, b.table, b.dirty = c, target, false
	return res, nil
}

// affinityEntries returns, as additions to the other table, the ClientIP
// affinity entries the live table holds, each with the life it has left, so a
// rebuild (the hourly full sync, a restart) keeps every client on its endpoint, as
// kube-proxy's affinity sets survive its syncs. An entry holds the index of the
// client's endpoint in its frontend's list; the rebuild keeps every list's slots
// (fill), so the index still names that endpoint, and moves the entries of the
// endpoints it moves (moveCarried). After a restart the slots of
// lists that changed since the old process built its table are not known, and
// such a client may move, as when its entry expires. Entries that do not fit the
// new maps are left out; a table that cannot be read carries nothing.
func (b *Backend) affinityEntries(ctx context.Context, live string) []nft.Op {
	if live == "" {
		return nil
	}
	var ops []nft.Op
	for _, s := range []fixedSet{setAffinity, setNodePortAffinity} {
		name := fixedSetNames[s]
		def := newSetTypes(b.f).setDef(fixedKey(s))
		els, err := b.k.ListElements(ctx, b.f, live, name)
		if err != nil {
			klog.V(2).InfoS("Not carrying ClientIP affinity into the rebuilt table", "ipFamily", b.f.Name, "set", name, "err", err)
			continue
		}
		b.affinitySeen[s] = len(els)
		carry := els[:0]
		for _, e := range els {
			if len(e.Key) == int(def.KeyType.Bytes) && len(e.Data) == int(def.DataType.Bytes) && e.Expires >= time.Millisecond {
				carry = append(carry, nft.Element{Key: e.Key, Data: e.Data, Timeout: e.Expires})
			}
		}
		if len(carry) > 0 {
			ops = append(ops, nft.Op{Kind: nft.OpAddElements, Table: otherTable(live), SetName: name, Elements: carry})
		}
	}
	return ops
}

// fill loads req into a new cache: the node config, then every port in name order
// (so owner ids and the element order are deterministic). A port's endpoints keep
// the slots they have in prev, the cache of the live table (nil: none), so the
// ClientIP affinity entries carried over still name their endpoints. It computes every port's
// contributions first and sizes each set's map and pending list from their counts,
// so the maps never grow and rehash. The contributions are dropped once added.
func (c *cache) fill(req *proxier.SyncRequest, prev *cache) {
	c.fresh = true
	c.setNode(req.Node)
	names := make([]model.ServicePortName, 0, len(req.State.Ports))
	for n := range req.State.Ports {
		names = append(names, n)
	}
	slices.SortFunc(names, model.ServicePortName.Compare)
	c.ports = make(map[model.ServicePortName]*portRecord, len(names))
	recs := make([]portRecord, len(names))
	contribs := make([][]contrib, len(names))
	counts := map[setKey]int{}
	var last setKey
	run := 0
	for i, n := range names {
		rec := &recs[i]
		rec.id = c.nextID
		c.nextID++
		c.ports[n] = rec
		// Only lists whose slots are not their endpoints' order, or that change
		// now, need the old slots: the rest get the same ones afresh.
		if prev != nil {
			if pr := prev.ports[n]; pr != nil && (pr.slots[0] != nil || pr.slots[1] != nil || pr.ps != req.State.Ports[n]) {
				rec.ps, rec.slots = pr.ps, pr.slots
			}
		}
		contribs[i] = c.portContribs(req.State.Ports[n], rec)
		for j := range contribs[i] {
			if k := contribs[i][j].set; k != last || run == 0 {
				if run > 0 {
					counts[last] += run
				}
				last, run = k, 0
			}
			run++
		}
	}
	if run > 0 {
		counts[last] += run
	}
	for k, n := range counts {
		s := c.set(k)
		if len(s.elems) == 0 {
			s.elems = make(map[string]element, n)
		}
		s.pending = slices.Grow(s.pending, n)
	}
	for i := range recs {
		for _, ct := range contribs[i] {
			c.addOwner(recs[i].id, ct)
		}
		contribs[i] = nil
	}
}

// coldTxs splits a fresh table's plan into transactions: the first creates the
// table, sets and regular chains; element additions fill transactions up to the
// limit; the last also hooks the table in and deletes the other table name. It
// returns how many there are and a function that builds the next one: the
// endpoint maps' lists are expanded into elements only as their transaction is
// built, so a cold start holds one transaction's elements at a time rather than
// all of them (16 MB at 10k Services in both families).
func (b *Backend) coldTxs(c *cache, target string, p *plan) (int, func() *nft.Tx) {
	limit := b.opts.MaxElementsPerTx
	total := 0
	for _, op := range p.adds {
		if size := p.listSize[op.SetName]; size > 0 {
			for _, l := range op.Elements {
				total += len(l.Data) / size
			}
		} else {
			total += len(op.Elements)
		}
	}
	n := max(1, (total+limit-1)/limit)
	cur := &elemCursor{ops: p.adds, sizes: p.listSize}
	built := 0
	return n, func() *nft.Tx {
		tx := nft.NewTx(b.f)
		if built == 0 {
			tx.DeleteTable(target)
			tx.AddTable(target)
			tx.Ops = slices.Concat(tx.Ops, p.addSets, p.chains)
		}
		built++
		for room := limit; room > 0; {
			set, elems := cur.take(room)
			if len(elems) == 0 {
				break
			}
			tx.AddElements(target, set, elems)
			room -= len(elems)
		}
		if built == n {
			for _, ch := range b.x.baseChainList() {
				c.chains[ch.Name] = ch
				tx.SetChain(target, ch)
			}
			tx.DeleteTable(otherTable(target))
		}
		return tx
	}
}

// elemCursor hands out the elements of a plan's additions in order, expanding
// the endpoint maps' lists (ops whose set has a size in sizes) as they are taken.
type elemCursor struct {
	ops   []nft.Op
	sizes map[string]int
	op    int           // the current op
	pos   int           // its next element or list
	rest  []nft.Element // the expanded elements of a list not taken yet
}

// take returns up to n elements of one set and the set's name; none when every
// element was taken.
func (c *elemCursor) take(n int) (string, []nft.Element) {
	for c.op < len(c.ops) {
		op := &c.ops[c.op]
		if len(c.rest) > 0 {
			k := min(n, len(c.rest))
			out := c.rest[:k]
			c.rest = c.rest[k:]
			return op.SetName, out
		}
		if c.pos == len(op.Elements) {
			c.op, c.pos = c.op+1, 0
			continue
		}
		size := c.sizes[op.SetName]
		if size == 0 {
			k := min(n, len(op.Elements)-c.pos)
			out := op.Elements[c.pos : c.pos+k]
			c.pos += k
			return op.SetName, out
		}
		// Whole lists while they fit; a list that does not is expanded alone
		// and handed out in parts.
		j, cnt := c.pos, 0
		for j < len(op.Elements) && cnt+len(op.Elements[j].Data)/size <= n {
			cnt += len(op.Elements[j].Data) / size
			j++
		}
		if j == c.pos {
			c.rest = expandLists(op.Elements[j:j+1], size)
			c.pos++
			continue
		}
		out := expandLists(op.Elements[c.pos:j], size)
		c.pos = j
		return op.SetName, out
	}
	return "", nil
}

// liveTable returns the name of the table whose base chains are hooked in, or "".
func (b *Backend) liveTable(ctx context.Context) (string, error) {
	tables, err := b.k.ListTables(ctx, b.f)
	if err != nil {
		return "", fmt.Errorf("nftables %s: listing tables: %w", b.f, err)
	}
	for _, name := range TableNames {
		if !slices.Contains(tables, name) {
			continue
		}
		chains, err := b.k.ListChains(ctx, b.f, name)
		if err != nil {
			return "", fmt.Errorf("nftables %s: listing chains of table %s: %w", b.f, name, err)
		}
		if slices.ContainsFunc(chains, func(c *nft.Chain) bool { return c.Hook != nil }) {
			return name, nil
		}
	}
	return "", nil
}

// verify compares the kernel with the cache and queues repairs into tx: the chains
// (by their canonical text), the group verdict maps and the elements of every set
// but @endpoints, @nodeport-endpoints and the affinity maps. A missing table,
// chain or set, or a chain or verdict map that differs, asks for a rebuild: a rule
// may name a set that was deleted with it, and the big sets can't be checked
// cheaply. Element differences are repaired in place.
func (b *Backend) verify(ctx context.Context, tx *nft.Tx) (repairs int, rebuild bool, err error) {
	chains, err := b.k.ListChains(ctx, b.f, b.table)
	if nft.IsNotFound(err) {
		return 1, true, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("nftables %s: listing chains of table %s: %w", b.f, b.table, err)
	}
	have := make(map[string]*nft.Chain, len(chains))
	for _, ch := range chains {
		have[ch.Name] = ch
	}
	for name, want := range b.c.chains {
		if !chainsEqual(have[name], want) {
			repairs++
		}
	}
	for _, use := range useChains {
		n, err := b.checkVmap(ctx, use)
		if err != nil {
			return 0, false, err
		}
		repairs += n
	}
	if repairs > 0 {
		return repairs, true, nil
	}
	for _, k := range b.c.sortedSetKeys() {
		s := b.c.sets[k]
		if unreadSet(k) || !s.written {
			continue
		}
		n, missing, err := b.repairSet(ctx, tx, s)
		if err != nil {
			return 0, false, err
		}
		if missing {
			return repairs + 1, true, nil
		}
		repairs += n
	}
	return repairs, false, nil
}

// checkVmap counts the elements of use chain use's verdict map that differ from
// the cache (a missing map counts one).
func (b *Backend) checkVmap(ctx context.Context, use string) (int, error) {
	got, err := b.k.ListElements(ctx, b.f, b.table, groupVmap(use))
	if nft.IsNotFound(err) {
		return 1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("nftables %s: reading verdict map %s/%s: %w", b.f, b.table, groupVmap(use), err)
	}
	want := b.c.vmaps[use]
	n := 0
	for _, e := range got {
		if len(e.Key) != 4 || e.Verdict == nil || e.Verdict.Kind != expr.VerdictGoto || want[binary.NativeEndian.Uint32(e.Key)] != e.Verdict.Chain {
			n++
		}
	}
	return n + max(0, len(want)-(len(got)-n)), nil
}

// repairSet queues the operations that make the kernel's set s match the cache and
// returns how many elements differed.
func (b *Backend) repairSet(ctx context.Context, tx *nft.Tx, s *setState) (int, bool, error) {
	got, err := b.k.ListElements(ctx, b.f, b.table, s.def.Name)
	if nft.IsNotFound(err) {
		return 0, true, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("nftables %s: reading set %s/%s: %w", b.f, b.table, s.def.Name, err)
	}
	var del, add []nft.Element
	seen := make(map[string]bool, len(got))
	for _, e := range got {
		key := string(e.Key)
		seen[key] = true
		want, ok := s.elems[key]
		data := want.effective()
		switch {
		case !ok:
			del = append(del, nft.Element{Key: e.Key})
		case s.def.IsMap && string(e.Data) != data:
			del = append(del, nft.Element{Key: e.Key})
			add = append(add, elementOf(key, data, true))
		}
	}
	for key, e := range s.elems {
		if !seen[key] {
			add = append(add, elementOf(key, e.effective(), s.def.IsMap))
		}
	}
	tx.DeleteElements(b.table, s.def.Name, del)
	tx.AddElements(b.table, s.def.Name, add)
	return len(del) + len(add) - countBoth(del, add), false, nil
}

// countBoth counts keys that are both deleted and re-added (one repair each).
func countBoth(del, add []nft.Element) int {
	keys := make(map[string]bool, len(del))
	for _, e := range del {
		keys[string(e.Key)] = true
	}
	n := 0
	for _, e := range add {
		if keys[string(e.Key)] {
			n++
		}
	}
	return n
}
