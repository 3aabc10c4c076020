package nftables

import (
	"encoding/binary"
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
// is the lowest, more the others (nearly always none, so they sit behind a pointer:
// 32 bytes per element rather than 48). The kernel holds the lowest owner's data, so
// two Services claiming the same external address resolve deterministically, and
// removing one hands the key to the other. In the endpoint maps an element is a
// whole endpoint list (see setState.elemSize), so a frontend that two ports claim
// gets the lowest owner's list. Elements are map values, not objects of their own:
// a cold start at 30k services makes about 100k of them per family (lists counted
// once), and every heap object is GC mark work.
type element struct {
	first owner
	more  *[]owner
}

func (e element) effective() string { return e.first.data }

// others returns the owners after first.
func (e *element) others() []owner {
	if e.more == nil {
		return nil
	}
	return *e.more
}

func (e *element) setOthers(o []owner) {
	if len(o) == 0 {
		e.more = nil
		return
	}
	e.more = &o
}

// insert adds o before the owners with an id >= o.id.
func (e *element) insert(o owner) {
	if o.id <= e.first.id {
		e.setOthers(slices.Insert(e.others(), 0, e.first))
		e.first = o
		return
	}
	more := e.others()
	i, _ := slices.BinarySearchFunc(more, o.id, func(o owner, id uint32) int { return cmpU32(o.id, id) })
	e.setOthers(slices.Insert(more, i, o))
}

// remove removes the first owner o and reports whether any owner is left.
func (e *element) remove(o owner) (left bool) {
	more := e.others()
	if e.first == o {
		if len(more) == 0 {
			return false
		}
		e.first = more[0]
		e.setOthers(slices.Delete(more, 0, 1))
	} else if i := slices.Index(more, o); i >= 0 {
		e.setOthers(slices.Delete(more, i, i+1))
	}
	return true
}

type setState struct {
	key   setKey
	def   *nft.Set
	elems map[string]element
	// elemSize is set for the endpoint maps (listSet): the size of one element's
	// data. Their elems hold lists, one per frontend and endpoint list, each keyed
	// by its first element's key with its elements' data one after the other;
	// drain expands them. count is then how many elements the kernel's map holds.
	//
	// A list is nearly always one element of the cache where its elements were
	// ten: at 10k Services that was 200k map entries and 400k strings in both
	// families, the largest thing the proxy kept.
	elemSize, count int
	written         bool // created in the kernel
	// pending are the elements (for the endpoint maps, lists) to add, in
	// first-added order, while the cache is fresh (see cache.fresh).
	pending []nft.Element
}

// portRecord is what one service port was programmed from at the last sync: its
// state, the node config then, and the slot of each endpoint in its two endpoint
// lists (dense indexes 0..N-1 of @endpoints). Its contributions are not kept: they
// are computed again from these when the port changes (see contribs), which costs
// a few microseconds then and saves a list of elements per port (20 MB at 10k
// Services).
//
// A list's slots are kept only when they differ from the list's endpoints in
// order (without duplicates), which is what a first assignment gives: slots[l] nil
// means that order, derived from ps when needed (see slotList). So a port that
// never changed keeps no slots (9 MB at 10k Services).
type portRecord struct {
	id    uint32
	ps    *model.PortState
	node  *proxier.NodeConfig
	slots [2][]netip.AddrPort
}

// slotList returns the slots of list l.
func (rec *portRecord) slotList(l int) []netip.AddrPort {
	if rec.slots[l] != nil || rec.ps == nil {
		return rec.slots[l]
	}
	eps := rec.ps.Cluster
	if l == listLocal {
		eps = rec.ps.Local
	}
	return assignSlots(nil, eps)
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
	// vmaps are the use chains' verdict maps as written: group id → group chain.
	vmaps map[string]map[uint32]string
	// chainsStale says the chain inputs (node config, dispatch groups) may have
	// changed since chains was computed.
	chainsStale bool
	// groups are the dispatch groups, in the order their chains were created:
	// sorted at a rebuild, then each new group at the end. grp holds their state,
	// byID finds a group by its id.
	groups []group
	grp    map[group]*groupState
	byID   map[uint32]group
	nextG  uint32

	touched map[setKey]map[string]before

	// fresh: the cache started empty and nothing was drained yet (a rebuild), so
	// every element is an addition. Mutations then record nothing in touched; a new
	// key goes to its set's pending list with the data it will have, and drain emits
	// those lists without diffing or sorting. Owners are added in increasing id
	// order (node first, then ports in name order), so the first owner of a key
	// stays its effective one; when that does not hold (an owner with an id <= the
	// first one's, or a removal) freshDirty makes drain emit from the maps instead.
	fresh, freshDirty bool

	// moves are the slot moves of lists with ClientIP affinity since the last
	// takeMoves (see affinity.go).
	moves []affinityMove
}

func newCache(x exprs) *cache {
	c := &cache{
		x: x, types: newSetTypes(x.f),
		sets:    map[setKey]*setState{},
		ports:   map[model.ServicePortName]*portRecord{},
		nextID:  nodeOwner + 1,
		chains:  map[string]*nft.Chain{},
		vmaps:   map[string]map[uint32]string{},
		touched: map[setKey]map[string]before{},
		grp:     map[group]*groupState{},
		byID:    map[uint32]group{},
		nextG:   1,
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
		if listSet(k) {
			s.elemSize = c.x.f.BitLen/8 + 4 // epaddr . epport
		}
		c.sets[k] = s
		c.chainsStale = c.chainsStale || k.dynamic()
	}
	return s
}

// groupState is one dispatch group's: its id, how many owners' dispatch map
// contributions name it (so not only effective elements: a group stays while
// any owner wants it), and whether its chains and verdict map elements are
// written.
type groupState struct {
	id      uint32
	data    string // the dispatch map data naming id (typed mark: host order)
	users   int
	written bool
}

// groupData returns the dispatch map data naming g's id, creating the group when
// new. Ids are not reused within a cache (a table's life), so a verdict map
// element never changes its target.
func (c *cache) groupData(g group) string {
	if st, ok := c.grp[g]; ok {
		return st.data
	}
	st := &groupState{id: c.nextG, data: string(nft.MarkBytes(c.nextG))}
	c.nextG++
	c.grp[g] = st
	c.byID[st.id] = g
	c.groups = append(c.groups, g)
	c.chainsStale = true
	return st.data
}

// use counts an owner's contribution ct in or out of its group's users when ct
// is a dispatch map element.
func (c *cache) use(ct contrib, delta int) {
	if _, ok := ct.set.kind(); !ok || len(ct.data) != 4 {
		return
	}
	if g, ok := c.byID[binary.NativeEndian.Uint32(bytesOf(ct.data))]; ok {
		c.grp[g].users += delta
	}
}

// used reports whether group g exists and has users.
func (c *cache) used(g group) bool {
	st, ok := c.grp[g]
	return ok && st.users > 0
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

// listSet reports whether k is an endpoint map, whose elements the cache keeps
// as lists (see setState.elemSize). These are unread sets (unreadSet): verify
// never compares their lists with the kernel's elements.
func listSet(k setKey) bool {
	return !k.isFW() && (k.fixed == setEndpoints || k.fixed == setNodePortEndpoints)
}

// size returns how many elements the kernel's set holds.
func (s *setState) size() int {
	if s.elemSize > 0 {
		return s.count
	}
	return len(s.elems)
}

// recount keeps count when a list's effective data goes from old to cur.
func (s *setState) recount(old, cur string) {
	if s.elemSize > 0 {
		s.count += (len(cur) - len(old)) / s.elemSize
	}
}

func (c *cache) addOwner(id uint32, ct contrib) {
	s := c.set(ct.set)
	c.use(ct, 1)
	o := owner{id: id, data: ct.data}
	if c.fresh {
		e, ok := s.elems[ct.key]
		if !ok {
			s.elems[ct.key] = element{first: o}
			s.recount("", ct.data)
			s.pending = append(s.pending, elementOf(ct.key, ct.data, s.def.IsMap))
			return
		}
		if id <= e.first.id {
			c.freshDirty = true
		}
		old := e.effective()
		e.insert(o)
		s.recount(old, e.effective())
		s.elems[ct.key] = e
		return
	}
	e, ok := c.touch(s, ct.key)
	if !ok {
		s.elems[ct.key] = element{first: o}
		s.recount("", ct.data)
		return
	}
	old := e.effective()
	e.insert(o)
	s.recount(old, e.effective())
	s.elems[ct.key] = e
}

func (c *cache) removeOwner(id uint32, ct contrib) {
	s := c.set(ct.set)
	c.use(ct, -1)
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
	old := e.effective()
	if e.remove(owner{id: id, data: ct.data}) {
		s.elems[ct.key] = e
		s.recount(old, e.effective())
	} else {
		delete(s.elems, ct.key)
		s.recount(old, "")
	}
}

// setPort replaces the contributions of one service port (ps nil: deleted).
func (c *cache) setPort(name model.ServicePortName, ps *model.PortState) {
	rec := c.ports[name]
	if rec != nil {
		for _, ct := range c.recorded(rec) {
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
	for _, ct := range c.portContribs(ps, rec) {
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
	// listSize is set at a cold start: the adds of the endpoint maps named here
	// hold lists (see setState.elemSize) of elements of this data size, which
	// coldTxs expands one transaction at a time.
	listSize map[string]int
}

// drain turns the touched elements into delete and add operations (a changed map
// value is a delete plus an add, which the kernel needs in one transaction), creates
// the sets not yet written, and garbage-collects unused dispatch groups when gc is set.
// The chain operations come from chainOps. It resets the touched record.
func (c *cache) drain(table string, gc bool) *plan {
	p := &plan{}
	if gc {
		c.collectGroups()
	}
	c.addSpares()
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
		case s.elemSize > 0:
			del, add = c.listDiff(s)
		default:
			del, add = c.elementDiff(s)
		}
		if c.fresh && s.elemSize > 0 {
			if p.listSize == nil {
				p.listSize = map[string]int{}
			}
			p.listSize[s.def.Name] = s.elemSize
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

// collectGroups forgets the groups without users that are not spares; chainOps
// then deletes their chains and verdict map elements.
func (c *cache) collectGroups() {
	gone := func(g group) bool { return !c.used(g) && !c.spare(g) }
	for _, g := range c.groups {
		if gone(g) {
			c.chainsStale = true
		}
	}
	c.groups = slices.DeleteFunc(c.groups, func(g group) bool {
		if !gone(g) {
			return false
		}
		delete(c.byID, c.grp[g].id)
		delete(c.grp, g)
		return true
	})
}

// spare reports whether the group g is kept though unused: a group with one
// endpoint more or less than a used group of its kind. A new dispatch group costs
// chains whose rules bind @endpoints (or @nodeport-endpoints), and the kernel
// checks every element of the map when it binds one: 90 ms at 300k elements. A
// rebuild creates these neighbours while the maps are still empty, so the usual
// change of an endpoint count by one is only element operations.
func (c *cache) spare(g group) bool {
	for _, n := range neighbours(g.n) {
		h := g
		h.n = n
		if c.used(h) {
			return true
		}
	}
	return false
}

// neighbours returns the endpoint counts next to n (none below 1).
func neighbours(n uint32) []uint32 {
	switch {
	case n == 0 || n == ^uint32(0):
		return nil
	case n == 1:
		return []uint32{2}
	}
	return []uint32{n - 1, n + 1}
}

// spareMaxElements bounds the endpoint map for which a sync that creates a group
// also creates its spares: each spare's rule costs a walk of the map (about
// 0.3 µs per element).
const spareMaxElements = 20000

// cheapBind reports whether a new rule of group g binds its endpoint map cheaply:
// the map is not in the kernel yet (a rebuild adds rules before elements) or small.
func (c *cache) cheapBind(g group) bool {
	m := c.sets[fixedKey(setEndpoints)]
	if kinds[g.kind].nodePort {
		m = c.sets[fixedKey(setNodePortEndpoints)]
	}
	return !m.written || m.size() < spareMaxElements
}

// addSpares creates the spare groups of the groups this sync creates (all of them
// at a rebuild; at other syncs only while cheapBind), and orders the new groups
// after the written ones: the used ones, then the unused spares, each sorted, so
// that the chains are created in a deterministic order.
func (c *cache) addSpares() {
	for _, g := range slices.Clone(c.groups) {
		if c.grp[g].written || !c.used(g) || !c.cheapBind(g) {
			continue
		}
		for _, n := range neighbours(g.n) {
			h := g
			h.n = n
			c.groupData(h)
		}
	}
	fresh := func(g group) bool { return !c.grp[g].written }
	empty := func(g group) bool { return !c.used(g) }
	news := slices.DeleteFunc(slices.Clone(c.groups), func(g group) bool { return !fresh(g) })
	if len(news) == 0 {
		return
	}
	slices.SortFunc(news, func(a, b group) int {
		if ea, eb := empty(a), empty(b); ea != eb {
			if ea {
				return 1
			}
			return -1
		}
		return compareGroups(a, b)
	})
	c.groups = append(slices.DeleteFunc(c.groups, fresh), news...)
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

// listDiff is elementDiff for an endpoint map: every touched list is compared
// element by element with what it was, so a list that changed in one endpoint
// costs one element.
func (c *cache) listDiff(s *setState) (del, add []nft.Element) {
	t := c.touched[s.key]
	for _, key := range slices.Sorted(maps.Keys(t)) {
		e := s.elems[key] // the zero element when gone: no data
		del, add = diffList(del, add, key, t[key].data, e.effective(), s.elemSize)
	}
	return del, add
}

// diffList appends to del and add the element operations that turn list key's
// elements (size bytes of data each) from old into cur: an element whose data
// changed is deleted and added again (a map element can't be overwritten).
func diffList(del, add []nft.Element, key, old, cur string, size int) ([]nft.Element, []nft.Element) {
	if old == cur {
		return del, add
	}
	front, first := key[:len(key)-4], binary.NativeEndian.Uint32(bytesOf(key[len(key)-4:]))
	for i := range max(len(old), len(cur)) / size {
		var o, n string
		if (i+1)*size <= len(old) {
			o = old[i*size : (i+1)*size]
		}
		if (i+1)*size <= len(cur) {
			n = cur[i*size : (i+1)*size]
		}
		if o == n {
			continue
		}
		k := listKey(front, first+uint32(i))
		if o != "" {
			del = append(del, nft.Element{Key: bytesOf(k)})
		}
		if n != "" {
			add = append(add, elementOf(k, n, true))
		}
	}
	return del, add
}

// expandLists turns lists of an endpoint map (see setState.elemSize) into the
// kernel's elements: frontend . (first + i) → the list's endpoint i. The keys of
// one list share one allocation.
func expandLists(lists []nft.Element, size int) []nft.Element {
	n := 0
	for _, l := range lists {
		n += len(l.Data) / size
	}
	out := make([]nft.Element, 0, n)
	for _, l := range lists {
		cnt, kl := len(l.Data)/size, len(l.Key)
		first := binary.NativeEndian.Uint32(l.Key[kl-4:])
		buf := make([]byte, 0, kl*cnt)
		for i := range cnt {
			at := len(buf)
			buf = appendIndexKey(buf, l.Key[:kl-4], first+uint32(i))
			out = append(out, nft.Element{Key: buf[at:len(buf):len(buf)], Data: l.Data[i*size : (i+1)*size : (i+1)*size]})
		}
	}
	return out
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
	keys := make([]setKey, 0, len(c.sets))
	for k := range c.sets {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b setKey) int { return strings.Compare(a.name(), b.name()) })
	return keys
}

// chainInputs returns what the regular chains depend on.
func (c *cache) chainInputs() chainInputs {
	in := chainInputs{node: c.node, groups: slices.Clone(c.groups)}
	in.ids = make([]uint32, len(in.groups))
	for i, g := range in.groups {
		in.ids[i] = c.grp[g].id
	}
	for k := range c.sets {
		if k.isFW() {
			in.fwBits = append(in.fwBits, int(k.fwBits))
		}
	}
	slices.Sort(in.fwBits)
	return in
}

// chainOps returns the operations for the regular chains, the group chains and
// the use chains' verdict maps that differ from what was written, and records
// them as written: AppendRules when the written rules are a prefix of the new
// ones, else SetChain, which rewrites the chain. The verdict maps are created
// first; a new group's chains come before its verdict map elements, and a gone
// group's elements are deleted before its chains. It computes nothing unless a
// dispatch group or the node config changed.
//
// A rewrite costs the kernel time proportional to the big maps the chain's rules
// look up (50 ms at 10k services, 150-210 ms at 30k), an append does not; a new
// endpoint count creates chains and verdict map elements and rewrites nothing.
func (c *cache) chainOps(table string) []nft.Op {
	if !c.chainsStale {
		return nil
	}
	c.chainsStale = false
	var ops, adds, dels, delChains []nft.Op
	for _, use := range useChains {
		if _, ok := c.vmaps[use]; !ok {
			ops = append(ops, nft.Op{Kind: nft.OpAddSet, Table: table, Set: vmapDef(use)})
			c.vmaps[use] = map[uint32]string{}
		}
	}
	in := c.chainInputs()
	chains := c.x.regularChains(in)
	want := make(map[string]bool, len(chains))
	for _, ch := range chains {
		want[ch.Name] = true
		old := c.chains[ch.Name]
		switch {
		case chainsEqual(old, ch):
			continue
		case old != nil && len(old.Rules) < len(ch.Rules) && chainsEqual(old, &nft.Chain{Name: ch.Name, Rules: ch.Rules[:len(old.Rules)]}):
			ops = append(ops, nft.Op{Kind: nft.OpAppendRules, Table: table, Chain: &nft.Chain{Name: ch.Name, Rules: ch.Rules[len(old.Rules):]}})
		default:
			ops = append(ops, nft.Op{Kind: nft.OpSetChain, Table: table, Chain: ch})
		}
		c.chains[ch.Name] = ch
	}
	for _, name := range slices.Sorted(maps.Keys(c.chains)) {
		if !want[name] && !isBaseChain(name) {
			delChains = append(delChains, nft.Op{Kind: nft.OpDeleteChain, Table: table, Name: name})
			delete(c.chains, name)
		}
	}
	vm := groupVmaps(in)
	for _, use := range useChains {
		add, del := vmapDiff(c.vmaps[use], vm[use])
		if len(add) > 0 {
			adds = append(adds, nft.Op{Kind: nft.OpAddElements, Table: table, SetName: groupVmap(use), Elements: add})
		}
		if len(del) > 0 {
			dels = append(dels, nft.Op{Kind: nft.OpDeleteElements, Table: table, SetName: groupVmap(use), Elements: del})
		}
		c.vmaps[use] = vm[use]
	}
	for _, g := range c.groups {
		c.grp[g].written = true
	}
	return slices.Concat(dels, ops, adds, delChains)
}

// vmapDiff returns the verdict map elements to add and delete to go from old to
// cur (group id → chain), in id order.
func vmapDiff(old, cur map[uint32]string) (add, del []nft.Element) {
	for _, id := range slices.Sorted(maps.Keys(cur)) {
		if old[id] != cur[id] {
			if _, ok := old[id]; ok {
				del = append(del, nft.Element{Key: nft.MarkBytes(id)})
			}
			add = append(add, vmapElement(id, cur[id]))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(old)) {
		if _, ok := cur[id]; !ok {
			del = append(del, nft.Element{Key: nft.MarkBytes(id)})
		}
	}
	return add, del
}
