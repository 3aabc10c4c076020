package nftables

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"unsafe"

	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// nodeOwner owns the elements that come from NodeConfig rather than a service port.
const nodeOwner = 0

// contrib is one element a service port (or the node config) wants: key and data
// are raw bytes held in strings; data is empty for plain sets.
type contrib struct {
	set       setKey
	key, data string
}

type owner struct {
	id   uint32
	data string
}

// element is one key of a set with everyone who wants it, ordered by owner id: first
// is the lowest, more the others (nearly always none). The kernel holds the lowest
// owner's data, so two Services claiming the same external address resolve
// deterministically, and removing one hands the key to the other. Elements are map
// values, not objects of their own: a cold start at 30k services makes about 330k of
// them per family, and every heap object is GC mark work.
type element struct {
	first owner
	more  []owner
}

func (e element) effective() string { return e.first.data }

// insert adds o before the owners with an id >= o.id.
func (e *element) insert(o owner) {
	if o.id <= e.first.id {
		e.more = slices.Insert(e.more, 0, e.first)
		e.first = o
		return
	}
	i, _ := slices.BinarySearchFunc(e.more, o.id, func(o owner, id uint32) int { return cmpU32(o.id, id) })
	e.more = slices.Insert(e.more, i, o)
}

// remove removes the first owner o and reports whether any owner is left.
func (e *element) remove(o owner) (left bool) {
	if e.first == o {
		if len(e.more) == 0 {
			return false
		}
		e.first = e.more[0]
		e.more = slices.Delete(e.more, 0, 1)
	} else if i := slices.Index(e.more, o); i >= 0 {
		e.more = slices.Delete(e.more, i, i+1)
	}
	if len(e.more) == 0 {
		e.more = nil
	}
	return true
}

type setState struct {
	key     setKey
	def     *nft.Set
	elems   map[string]element
	written bool // created in the kernel
	// pending are the elements to add, in first-added order, while the cache is
	// fresh (see cache.fresh).
	pending []nft.Element
}

// portRecord is what one service port contributed at the last sync, and the slot of
// each endpoint in its two endpoint lists (dense indexes 0..N-1 of @endpoints).
type portRecord struct {
	id       uint32
	contribs []contrib
	slots    [2][]netip.AddrPort
}

type before struct {
	data string
	ok   bool
}

// cache mirrors what the backend wrote to one table: every set's elements with
// their owners, the chains, and the per-port records used to derive element-level
// diffs. Mutations record the previous kernel value of every touched element; plan
// turns those into operations.
type cache struct {
	x      exprs
	types  setTypes
	sets   map[setKey]*setState
	ports  map[model.ServicePortName]*portRecord
	nextID uint32
	node   *proxier.NodeConfig
	nodeC  []contrib
	chains map[string]*nft.Chain // as written
	// chainsStale says the chain inputs (node config, dispatch sets) may have
	// changed since chains was computed.
	chainsStale bool

	touched map[setKey]map[string]before

	// fresh: the cache started empty and nothing was drained yet (a rebuild), so
	// every element is an addition. Mutations then record nothing in touched; a new
	// key goes to its set's pending list with the data it will have, and drain emits
	// those lists without diffing or sorting. Owners are added in increasing id
	// order (node first, then ports in name order), so the first owner of a key
	// stays its effective one; when that does not hold (an owner with an id <= the
	// first one's, or a removal) freshDirty makes drain emit from the maps instead.
	fresh, freshDirty bool
}

func newCache(x exprs) *cache {
	c := &cache{
		x: x, types: newSetTypes(x.f),
		sets:    map[setKey]*setState{},
		ports:   map[model.ServicePortName]*portRecord{},
		nextID:  nodeOwner + 1,
		chains:  map[string]*nft.Chain{},
		touched: map[setKey]map[string]before{},
	}
	for s := fixedSet(1); s < numFixedSets; s++ {
		c.set(fixedKey(s))
	}
	return c
}

func (c *cache) set(k setKey) *setState {
	s, ok := c.sets[k]
	if !ok {
		s = &setState{key: k, def: c.types.setDef(k), elems: map[string]element{}}
		c.sets[k] = s
		c.chainsStale = c.chainsStale || k.dynamic()
	}
	return s
}

// touch records the kernel value of key before its first change since the last
// drain, and returns its element.
func (c *cache) touch(s *setState, key string) (element, bool) {
	e, ok := s.elems[key]
	t := c.touched[s.key]
	if t == nil {
		t = map[string]before{}
		c.touched[s.key] = t
	}
	if _, seen := t[key]; !seen {
		t[key] = before{data: e.effective(), ok: ok}
	}
	return e, ok
}

func (c *cache) addOwner(id uint32, ct contrib) {
	s := c.set(ct.set)
	o := owner{id: id, data: ct.data}
	if c.fresh {
		e, ok := s.elems[ct.key]
		if !ok {
			s.elems[ct.key] = element{first: o}
			s.pending = append(s.pending, elementOf(ct.key, ct.data, s.def.IsMap))
			return
		}
		if id <= e.first.id {
			c.freshDirty = true
		}
		e.insert(o)
		s.elems[ct.key] = e
		return
	}
	e, ok := c.touch(s, ct.key)
	if !ok {
		s.elems[ct.key] = element{first: o}
		return
	}
	e.insert(o)
	s.elems[ct.key] = e
}

func (c *cache) removeOwner(id uint32, ct contrib) {
	s := c.set(ct.set)
	var e element
	var ok bool
	if c.fresh {
		c.freshDirty = true
		e, ok = s.elems[ct.key]
	} else {
		e, ok = c.touch(s, ct.key)
	}
	if !ok {
		return
	}
	if e.remove(owner{id: id, data: ct.data}) {
		s.elems[ct.key] = e
	} else {
		delete(s.elems, ct.key)
	}
}

// setPort replaces the contributions of one service port (ps nil: deleted).
func (c *cache) setPort(name model.ServicePortName, ps *model.PortState) {
	rec := c.ports[name]
	if rec != nil {
		for _, ct := range rec.contribs {
			c.removeOwner(rec.id, ct)
		}
	}
	if ps == nil {
		delete(c.ports, name)
		return
	}
	if rec == nil {
		rec = &portRecord{id: c.nextID}
		c.nextID++
		c.ports[name] = rec
	}
	rec.contribs = c.portContribs(ps, rec)
	for _, ct := range rec.contribs {
		c.addOwner(rec.id, ct)
	}
}

// setNode replaces the node-level contributions.
func (c *cache) setNode(node *proxier.NodeConfig) {
	for _, ct := range c.nodeC {
		c.removeOwner(nodeOwner, ct)
	}
	n := *node
	c.node = &n
	c.chainsStale = true
	c.nodeC = nodeContribs(c.x, node)
	for _, ct := range c.nodeC {
		c.addOwner(nodeOwner, ct)
	}
}

// plan is the operations derived from the touched elements, by phase.
type plan struct {
	addSets, deletes, adds, chains, delSets []nft.Op
}

// drain turns the touched elements into delete and add operations (a changed map
// value is a delete plus an add, which the kernel needs in one transaction), creates
// the sets not yet written, and garbage-collects empty dispatch sets when gc is set.
// The chain operations come from chainOps. It resets the touched record.
func (c *cache) drain(table string, gc bool) *plan {
	p := &plan{}
	for _, k := range c.sortedSetKeys() {
		s := c.sets[k]
		if gc && k.dynamic() && len(s.elems) == 0 {
			if s.written {
				p.delSets = append(p.delSets, nft.Op{Kind: nft.OpDeleteSet, Table: table, SetName: s.def.Name})
			}
			delete(c.sets, k)
			c.chainsStale = true
			continue
		}
		if !s.written {
			p.addSets = append(p.addSets, nft.Op{Kind: nft.OpAddSet, Table: table, Set: s.def})
			s.written = true
		}
		var del, add []nft.Element
		switch {
		case c.fresh && !c.freshDirty:
			add = s.pending
		case c.fresh:
			add = c.allElements(s)
		default:
			del, add = c.elementDiff(s)
		}
		s.pending = nil
		if len(del) > 0 {
			p.deletes = append(p.deletes, nft.Op{Kind: nft.OpDeleteElements, Table: table, SetName: s.def.Name, Elements: del})
		}
		if len(add) > 0 {
			p.adds = append(p.adds, nft.Op{Kind: nft.OpAddElements, Table: table, SetName: s.def.Name, Elements: add})
		}
	}
	clear(c.touched)
	c.fresh, c.freshDirty = false, false
	return p
}

// allElements returns every element of s with its effective data, sorted by key.
func (c *cache) allElements(s *setState) []nft.Element {
	out := make([]nft.Element, 0, len(s.elems))
	for _, key := range slices.Sorted(maps.Keys(s.elems)) {
		out = append(out, elementOf(key, s.elems[key].effective(), s.def.IsMap))
	}
	return out
}

func (c *cache) elementDiff(s *setState) (del, add []nft.Element) {
	t := c.touched[s.key]
	for _, key := range slices.Sorted(maps.Keys(t)) {
		b := t[key]
		e, ok := s.elems[key]
		now := before{data: e.effective(), ok: ok}
		if b == now {
			continue
		}
		if b.ok {
			del = append(del, nft.Element{Key: []byte(key)})
		}
		if now.ok {
			add = append(add, elementOf(key, now.data, s.def.IsMap))
		}
	}
	return del, add
}

// elementOf returns the element for key and data. Its byte slices share the
// strings' memory (nothing writes to elements' bytes): a cold start emits every
// element, and copying them doubled its garbage.
func elementOf(key, data string, isMap bool) nft.Element {
	e := nft.Element{Key: bytesOf(key)}
	if isMap {
		e.Data = bytesOf(data)
	}
	return e
}

// bytesOf returns the bytes of s without copying them; they must not be modified.
func bytesOf(s string) []byte {
	if s == "" {
		return nil
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

func (c *cache) sortedSetKeys() []setKey {
	keys := slices.Collect(maps.Keys(c.sets))
	slices.SortFunc(keys, func(a, b setKey) int { return strings.Compare(a.name(), b.name()) })
	return keys
}

// chainInputs returns what the regular chains depend on.
func (c *cache) chainInputs() chainInputs {
	in := chainInputs{node: c.node}
	for k := range c.sets {
		switch {
		case k.isGrp:
			in.groups = append(in.groups, k.grp)
		case k.isFW():
			in.fwBits = append(in.fwBits, int(k.fwBits))
		}
	}
	slices.SortFunc(in.groups, compareGroups)
	slices.Sort(in.fwBits)
	return in
}

// chainOps returns SetChain operations for the regular chains that differ from what
// was written, and records them as written. It computes nothing unless a dispatch
// set or the node config changed.
func (c *cache) chainOps(table string) []nft.Op {
	if !c.chainsStale {
		return nil
	}
	c.chainsStale = false
	var ops []nft.Op
	for _, ch := range c.x.regularChains(c.chainInputs()) {
		if chainsEqual(c.chains[ch.Name], ch) {
			continue
		}
		c.chains[ch.Name] = ch
		ops = append(ops, nft.Op{Kind: nft.OpSetChain, Table: table, Chain: ch})
	}
	return ops
}
