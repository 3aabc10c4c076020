package nftables

import (
	"maps"
	"net/netip"
	"slices"
	"strings"

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

// element is one key of a set with everyone who wants it, ordered by owner id. The
// kernel holds the lowest owner's data, so two Services claiming the same external
// address resolve deterministically, and removing one hands the key to the other.
type element struct{ owners []owner }

func (e *element) effective() (string, bool) {
	if len(e.owners) == 0 {
		return "", false
	}
	return e.owners[0].data, true
}

type setState struct {
	key     setKey
	def     *nft.Set
	elems   map[string]*element
	written bool // created in the kernel
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
		s = &setState{key: k, def: c.types.setDef(k), elems: map[string]*element{}}
		c.sets[k] = s
		c.chainsStale = c.chainsStale || k.dynamic()
	}
	return s
}

func (c *cache) touch(s *setState, key string) *element {
	e := s.elems[key]
	t := c.touched[s.key]
	if t == nil {
		t = map[string]before{}
		c.touched[s.key] = t
	}
	if _, ok := t[key]; !ok {
		var b before
		if e != nil {
			b.data, b.ok = e.effective()
		}
		t[key] = b
	}
	return e
}

func (c *cache) addOwner(id uint32, ct contrib) {
	s := c.set(ct.set)
	e := c.touch(s, ct.key)
	if e == nil {
		e = &element{}
		s.elems[ct.key] = e
	}
	i, _ := slices.BinarySearchFunc(e.owners, id, func(o owner, id uint32) int { return cmpU32(o.id, id) })
	e.owners = slices.Insert(e.owners, i, owner{id: id, data: ct.data})
}

func (c *cache) removeOwner(id uint32, ct contrib) {
	s := c.set(ct.set)
	e := c.touch(s, ct.key)
	if e == nil {
		return
	}
	if i := slices.IndexFunc(e.owners, func(o owner) bool { return o.id == id && o.data == ct.data }); i >= 0 {
		e.owners = slices.Delete(e.owners, i, i+1)
	}
	if len(e.owners) == 0 {
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
		del, add := c.elementDiff(s)
		if len(del) > 0 {
			p.deletes = append(p.deletes, nft.Op{Kind: nft.OpDeleteElements, Table: table, SetName: s.def.Name, Elements: del})
		}
		if len(add) > 0 {
			p.adds = append(p.adds, nft.Op{Kind: nft.OpAddElements, Table: table, SetName: s.def.Name, Elements: add})
		}
	}
	clear(c.touched)
	return p
}

func (c *cache) elementDiff(s *setState) (del, add []nft.Element) {
	t := c.touched[s.key]
	for _, key := range slices.Sorted(maps.Keys(t)) {
		b := t[key]
		var now before
		if e := s.elems[key]; e != nil {
			now.data, now.ok = e.effective()
		}
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

func elementOf(key, data string, isMap bool) nft.Element {
	e := nft.Element{Key: []byte(key)}
	if isMap {
		e.Data = []byte(data)
	}
	return e
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
