package nftables

import (
	"context"
	"encoding/binary"
	"net/netip"
	"slices"
	"time"

	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/nft"
)

// ClientIP affinity entries hold the index of the client's endpoint in its
// frontend's list (see affinityRules). An endpoint that leaves a list frees its
// slot, and assignSlots moves the list's last endpoint into it (numgen needs dense
// indexes). Left alone, the entries of the moved endpoint's clients would then
// point past the list and those clients would pick again, and the clients of the
// removed endpoint would all land on the moved one. kube-proxy keeps every
// client whose endpoint stays (its affinity sets are per endpoint) and lets the
// removed endpoint's clients pick again. So do these:
//
//   - A sync commits its changes first, but keeps the element of each slot whose
//     endpoint moved down (a ghost: numgen no longer reaches it, the affinity hit
//     rule still does), so no client loses its endpoint meanwhile.
//   - It then reads the affinity map, and in one more transaction moves each entry
//     of a moved endpoint to its new slot, deletes the entries of the removed
//     endpoints whose slots others took, and deletes the ghosts.
//   - A rebuild applies the same to the entries it carries into the new table.
//
// A client that first connects between the two transactions and picks the slot
// of a removed endpoint (now another's) loses that entry and picks once more.
//
// Reading an affinity map costs time that grows with the square of its entries
// (the kernel's dump restarts its hash walk for each 32 KB message: 75 ms for
// IPv4 and 140 ms for IPv6 at 10k entries, 1.4 and 2.0 s at 65k;
// BenchmarkAffinityMove), and it delays the family's next sync. So only a sync
// of a port with affinity that moved an endpoint or gave a removed endpoint's
// slot to another (a rolling update does) reads the map, after its own changes
// are in the kernel, and only while the map held at most affinityMoveMax
// entries when last read (by such a sync, or by a rebuild, which reads every
// entry it carries). Beyond that the moved endpoint's clients pick again.

// affinityMove is what one frontend's list of a port with ClientIP affinity did
// to its slots at this sync.
type affinityMove struct {
	owner uint32   // the port's owner id
	list  setKey   // the endpoint map holding the list
	aff   fixedSet // the affinity map of the frontend's kind
	front string   // the frontend key
	first uint32   // the index of the list's first element (its kind's offset)
	// to holds, per old slot j, the endpoint's new slot, or dropEntry when
	// another endpoint took the slot of a removed one. to[j] == j leaves the
	// entries alone: the endpoint stayed, or it went with the list's tail (its
	// entries point past the list and the client picks again).
	to []int32
	// ghosts are the old slots past the new list whose endpoint moved down:
	// their elements stay until the entries have moved.
	ghosts []uint32
}

const dropEntry = -1

// slotMoves compares a list's old and new slots. It returns nil when every
// endpoint still in the list kept its slot and no slot changed hands, which is
// when the affinity entries need nothing.
func slotMoves(old, cur []netip.AddrPort) (to []int32, ghosts []uint32) {
	if len(old) == 0 {
		return nil, nil
	}
	at := make(map[netip.AddrPort]int32, len(cur))
	for i, ap := range cur {
		at[ap] = int32(i)
	}
	to = make([]int32, len(old))
	changed := false
	for j, ap := range old {
		i, ok := at[ap]
		switch {
		case ok:
			to[j] = i
			if int(i) != j {
				changed = true
				if j >= len(cur) {
					ghosts = append(ghosts, uint32(j))
				}
			}
		case j < len(cur):
			to[j], changed = dropEntry, true
		default:
			to[j] = int32(j)
		}
	}
	if !changed {
		return nil, nil
	}
	return to, ghosts
}

// tracksAffinity reports whether the port's affinity entries should follow its
// slots: it had affinity before and has it now, with the same traffic policies
// (a policy change makes a frontend use another list, and its entries then
// index that one).
func (b *portBuilder) tracksAffinity() bool {
	o := b.old.ps
	return !b.replay && b.aff != 0 && o != nil && o.AffinitySeconds != 0 &&
		o.InternalPolicyLocal == b.ps.InternalPolicyLocal && o.ExternalPolicyLocal == b.ps.ExternalPolicyLocal
}

// noteMove records, for the frontend key of kind k using list l, the moves of
// that list at this sync.
func (b *portBuilder) noteMove(k kind, key string, l int) {
	if b.moves[l] == nil {
		return
	}
	ki := kinds[k]
	m := affinityMove{owner: b.rec.id, list: fixedKey(setEndpoints), aff: setAffinity, front: key, first: ki.offset(),
		to: b.moves[l], ghosts: b.ghosts[l]}
	if ki.nodePort {
		m.list, m.aff = fixedKey(setNodePortEndpoints), setNodePortAffinity
	}
	b.c.moves = append(b.c.moves, m)
}

// affinityMoveMax bounds the entries of an affinity map that a sync reads to
// move entries: about 75 ms for IPv4 and 140 ms for IPv6 here (20k: 0.23 and
// 0.37 s).
const affinityMoveMax = 10000

// affordable returns the moves whose affinity map held at most affinityMoveMax
// entries when last read.
func (b *Backend) affordable(moves []affinityMove) []affinityMove {
	return slices.DeleteFunc(moves, func(m affinityMove) bool {
		if n := b.affinitySeen[m.aff]; n > affinityMoveMax {
			klog.V(2).InfoS("Not moving ClientIP affinity entries: too many to read", "ipFamily", b.f.Name, "set", fixedSetNames[m.aff], "entries", n)
			return true
		}
		return false
	})
}

// takeMoves returns the moves recorded since the last call whose lists are the
// ones the kernel holds (a frontend two ports claim holds the lowest owner's),
// and forgets them all.
func (c *cache) takeMoves() []affinityMove {
	moves := c.moves
	c.moves = nil
	return slices.DeleteFunc(moves, func(m affinityMove) bool {
		s := c.sets[m.list]
		if s == nil {
			return true
		}
		e, ok := s.elems[listKey(m.front, m.first)]
		return !ok || e.first.id != m.owner
	})
}

// keepGhosts takes the deletions of the moves' ghost elements out of p and
// returns them as operations of their own.
func keepGhosts(p *plan, c *cache, moves []affinityMove) []nft.Op {
	ghosts := map[string]map[string]bool{} // set name → element keys
	for _, m := range moves {
		name := c.sets[m.list].def.Name
		for _, j := range m.ghosts {
			if ghosts[name] == nil {
				ghosts[name] = map[string]bool{}
			}
			ghosts[name][listKey(m.front, m.first+j)] = true
		}
	}
	if len(ghosts) == 0 {
		return nil
	}
	var out []nft.Op
	for i := range p.deletes {
		op := &p.deletes[i]
		keys := ghosts[op.SetName]
		if keys == nil {
			continue
		}
		var kept, taken []nft.Element
		for _, e := range op.Elements {
			if keys[string(e.Key)] {
				taken = append(taken, e)
			} else {
				kept = append(kept, e)
			}
		}
		if len(taken) > 0 {
			op.Elements = kept
			out = append(out, nft.Op{Kind: nft.OpDeleteElements, Table: op.Table, SetName: op.SetName, Elements: taken})
		}
	}
	p.deletes = slices.DeleteFunc(p.deletes, func(op nft.Op) bool { return len(op.Elements) == 0 })
	return out
}

// moveIndex finds a frontend's moves by affinity map and frontend key: more than
// one when kinds of different offsets share the key (an ETP Local frontend's
// list and its short-circuit's).
type moveIndex map[fixedSet]map[string][]*affinityMove

func indexMoves(moves []affinityMove) moveIndex {
	ix := moveIndex{}
	for i := range moves {
		m := &moves[i]
		if ix[m.aff] == nil {
			ix[m.aff] = map[string][]*affinityMove{}
		}
		ix[m.aff][m.front] = append(ix[m.aff][m.front], m)
	}
	return ix
}

// entry returns what becomes of one entry of affinity map s (key saddr .
// frontend, addrLen bytes of address): its new data, or drop, or neither when
// it stays as it is.
func (ix moveIndex) entry(s fixedSet, addrLen int, key, data []byte) (moved []byte, drop bool) {
	if len(key) <= addrLen || len(data) != 4 {
		return nil, false
	}
	d := binary.NativeEndian.Uint32(data)
	for _, m := range ix[s][string(key[addrLen:])] {
		if d < m.first || d-m.first >= uint32(len(m.to)) {
			continue
		}
		j := d - m.first
		switch to := m.to[j]; {
		case to == dropEntry:
			return nil, true
		case to != int32(j):
			return binary.NativeEndian.AppendUint32(nil, m.first+uint32(to)), false
		}
		return nil, false
	}
	return nil, false
}

// affinityMargin is the life an entry must have left, beyond the time the read
// took, for a sync to move it: deleting an entry that expired meanwhile fails
// the whole transaction. A client whose entry is that close to its end picks
// again, as when it ends.
const affinityMargin = 2 * time.Second

// moveAffinity makes the live table's affinity entries follow the moves (see the
// top of this file), then deletes the ghosts. Should that transaction fail, the
// ghosts go alone (the moved endpoints' clients pick again); should that fail too,
// the next sync rebuilds.
func (b *Backend) moveAffinity(ctx context.Context, moves []affinityMove, ghosts []nft.Op, res *SyncResult) {
	ix := indexMoves(moves)
	addrLen := b.f.BitLen / 8
	var dels, adds []nft.Op
	for _, s := range []fixedSet{setAffinity, setNodePortAffinity} {
		if ix[s] == nil {
			continue
		}
		name := fixedSetNames[s]
		start := time.Now()
		els, err := b.k.ListElements(ctx, b.f, b.table, name)
		if err != nil {
			klog.V(2).InfoS("Not moving ClientIP affinity entries", "ipFamily", b.f.Name, "set", name, "err", err)
			continue
		}
		b.affinitySeen[s] = len(els)
		margin := time.Since(start) + affinityMargin
		var del, add []nft.Element
		for _, e := range els {
			moved, drop := ix.entry(s, addrLen, e.Key, e.Data)
			if (moved == nil && !drop) || e.Expires < margin {
				continue
			}
			del = append(del, nft.Element{Key: e.Key})
			if moved != nil {
				add = append(add, nft.Element{Key: e.Key, Data: moved, Timeout: e.Expires})
			}
		}
		if len(del) > 0 {
			dels = append(dels, nft.Op{Kind: nft.OpDeleteElements, Table: b.table, SetName: name, Elements: del})
		}
		if len(add) > 0 {
			adds = append(adds, nft.Op{Kind: nft.OpAddElements, Table: b.table, SetName: name, Elements: add})
		}
	}
	tx := nft.NewTx(b.f)
	tx.Ops = slices.Concat(dels, ghosts, adds)
	if len(tx.Ops) == 0 {
		return
	}
	err := b.k.Apply(ctx, tx)
	if err == nil {
		res.Transactions++
		res.Operations += countOps(tx)
		return
	}
	klog.InfoS("Could not move ClientIP affinity entries with their endpoints; those clients pick again", "ipFamily", b.f.Name, "err", err)
	if len(ghosts) > 0 {
		tx.Ops = ghosts
		if err := b.apply(ctx, tx, res); err != nil {
			klog.InfoS("Could not delete the old slots of moved endpoints; the next sync rebuilds the table", "ipFamily", b.f.Name, "err", err)
		}
	}
}

// moveCarried applies the moves to the affinity entries a rebuild carries.
func (b *Backend) moveCarried(carry []nft.Op, moves []affinityMove) []nft.Op {
	if len(moves) == 0 {
		return carry
	}
	ix := indexMoves(moves)
	addrLen := b.f.BitLen / 8
	for i := range carry {
		op := &carry[i]
		s := setAffinity
		if op.SetName == fixedSetNames[setNodePortAffinity] {
			s = setNodePortAffinity
		}
		op.Elements = slices.DeleteFunc(op.Elements, func(e nft.Element) bool {
			_, drop := ix.entry(s, addrLen, e.Key, e.Data)
			return drop
		})
		for j := range op.Elements {
			if moved, _ := ix.entry(s, addrLen, op.Elements[j].Key, op.Elements[j].Data); moved != nil {
				op.Elements[j].Data = moved
			}
		}
	}
	return slices.DeleteFunc(carry, func(op nft.Op) bool { return len(op.Elements) == 0 })
}

// liveAffinity keeps, of the affinity entries a rebuild carries, those of
// frontends that still dispatch to a group with ClientIP affinity in c (the
// new table's cache): the entries of deleted Services, frontends and ports
// that lost affinity go with the old table, as kube-proxy deletes the affinity
// sets of gone endpoints at its next sync. Without this they were carried
// into every rebuilt table until their timeout, filling the family's one
// @affinity map (affinitySize entries for every Service).
func (c *cache) liveAffinity(carry []nft.Op, addrLen int) []nft.Op {
	for i := range carry {
		op := &carry[i]
		np := op.SetName == fixedSetNames[setNodePortAffinity]
		op.Elements = slices.DeleteFunc(op.Elements, func(e nft.Element) bool {
			return len(e.Key) <= addrLen || !c.affinityFront(np, string(e.Key[addrLen:]))
		})
	}
	return slices.DeleteFunc(carry, func(op nft.Op) bool { return len(op.Elements) == 0 })
}

// affinityFront reports whether front (a vip key, or an np key when nodePort)
// is in a dispatch map naming a group with ClientIP affinity.
func (c *cache) affinityFront(nodePort bool, front string) bool {
	for k := range numKinds {
		if kinds[k].nodePort != nodePort {
			continue
		}
		s := c.sets[fixedKey(kindMap(k))]
		if s == nil {
			continue
		}
		e, ok := s.elems[front]
		if !ok || len(e.effective()) != 4 {
			continue
		}
		if g, ok := c.byID[binary.NativeEndian.Uint32(bytesOf(e.effective()))]; ok && g.timeout != 0 {
			return true
		}
	}
	return false
}
