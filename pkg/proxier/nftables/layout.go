package nftables

import (
	"fmt"
	"strconv"

	"github.com/google/nftables"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/nft"
)

// Table names. A cold start builds the whole ruleset under the name that is not live
// and swaps it in with one small transaction, so the live table alternates between
// the two names across rebuilds.
const (
	tableA = "dsproxy"
	tableB = "dsproxy-b"
)

// TableNames are every table name the backend may use, in each family.
var TableNames = []string{tableA, tableB}

func otherTable(name string) string {
	if name == tableA {
		return tableB
	}
	return tableA
}

// fixedSet identifies one of the sets every table has.
type fixedSet uint8

const (
	setEndpoints fixedSet = iota + 1
	setNodePortEndpoints
	setAffinity
	setNodePortAffinity
	setClusterIPs
	setNodePortIPs
	setNoEndpointServices
	setNoLocalEndpointServices
	setNoEndpointNodePorts
	setNoLocalEndpointNodePorts
	setReservedNodePorts
	setFirewallIPs
	setHairpin
	setExternalFrontends
	// setKindGroups + k is the dispatch map of kind k: frontend key → group id.
	setKindGroups
	numFixedSets = setKindGroups + fixedSet(numKinds)
)

var fixedSetNames = [numFixedSets]string{
	setEndpoints:                "endpoints",
	setNodePortEndpoints:        "nodeport-endpoints",
	setAffinity:                 "affinity",
	setNodePortAffinity:         "nodeport-affinity",
	setClusterIPs:               "cluster-ips",
	setNodePortIPs:              "nodeport-ips",
	setNoEndpointServices:       "no-endpoint-services",
	setNoLocalEndpointServices:  "no-local-endpoint-services",
	setNoEndpointNodePorts:      "no-endpoint-nodeports",
	setNoLocalEndpointNodePorts: "no-local-endpoint-nodeports",
	setReservedNodePorts:        "reserved-nodeports",
	setFirewallIPs:              "firewall-ips",
	setHairpin:                  "hairpin",
	setExternalFrontends:        "external-frontends",
}

func init() {
	for k := range numKinds {
		fixedSetNames[kindMap(k)] = kinds[k].prefix + "-groups"
	}
}

// kindMap is the dispatch map of kind k.
func kindMap(k kind) fixedSet { return setKindGroups + fixedSet(k) }

// mapKind returns the kind whose dispatch map s is.
func mapKind(s fixedSet) (kind, bool) {
	if s >= setKindGroups && s < numFixedSets {
		return kind(s - setKindGroups), true
	}
	return 0, false
}

// kind is a class of frontends: how the packet's key is read, which endpoint
// list of the key's @endpoints (or @nodeport-endpoints) entries it picks from and
// in which chains it is dispatched. Each kind has one dispatch map,
// @<prefix>-groups, from frontend key to the id of its group; each frontend
// (ClusterIP, ExternalIP, LoadBalancer VIP, NodePort) has its own endpoint
// elements.
type kind uint8

const (
	// kindSvc: ClusterIPs (daddr . l4proto . dport).
	kindSvc kind = iota
	// kindExt: ExternalIPs and LoadBalancer VIPs with externalTrafficPolicy
	// Cluster; the rule marks for masquerade.
	kindExt
	// kindExtLocal: the same with externalTrafficPolicy Local (no masquerade).
	kindExtLocal
	// kindExtShort: ETP Local addresses seen from local pods or the node itself:
	// they go to the cluster endpoints (kube-proxy's short-circuit), held under
	// the same key at indexes from shortOffset (see kindInfo.first).
	kindExtShort
	// kindNP, kindNPLocal, kindNPShort: the NodePort equivalents, keyed by
	// l4proto . dport on the NodePort addresses, with @nodeport-endpoints.
	kindNP
	kindNPLocal
	kindNPShort
	numKinds
)

// Each kind picks from its own index range under a frontend's key: index i of
// its list is the kind's offset + i ("numgen random mod N offset <offset>"). One
// frontend uses at most two kinds (an ETP Local frontend's list at localOffset
// and its short-circuit's cluster list at shortOffset), but one address, port
// and protocol may be claimed by frontends of different kinds, of different
// Services (an ExternalIP shared by an ETP Cluster and an ETP Local Service, or
// equal to another Service's ClusterIP): their lists then live side by side, and
// each kind's group picks from its own (the chain order decides which Service
// serves). The lowest owner of the key within a kind wins, as for any element.
const (
	clusterOffset = 1 << 28 // ETP Cluster ExternalIPs, VIPs and NodePorts
	localOffset   = 2 << 28 // their ETP Local lists
	shortOffset   = 1 << 31 // an ETP Local frontend's short-circuit (cluster) list
)

type kindInfo struct {
	prefix   string
	nodePort bool // key is l4proto . dport and rules check the NodePort addresses
	short    bool // a short-circuit: picks from the cluster list at shortOffset
	// first is the first index of the endpoint list the kind picks from.
	first uint32
	// uses lists the chains holding this kind's rules and whether they mark the
	// packet for masquerade.
	uses []chainUse
}

type chainUse struct {
	chain string
	masq  bool
}

var kinds = [numKinds]kindInfo{
	kindSvc:      {prefix: "svc", uses: []chainUse{{chainClusterIPLB, false}}},
	kindExt:      {prefix: "ext", first: clusterOffset, uses: []chainUse{{chainExternalLB, true}}},
	kindExtLocal: {prefix: "ext-local", first: localOffset, uses: []chainUse{{chainExternalLB, false}}},
	kindExtShort: {prefix: "ext-short", short: true, first: shortOffset, uses: []chainUse{{chainShortPod, false}, {chainShortNode, true}}},
	kindNP:       {prefix: "np", nodePort: true, first: clusterOffset, uses: []chainUse{{chainNodePortLB, true}}},
	kindNPLocal:  {prefix: "np-local", nodePort: true, first: localOffset, uses: []chainUse{{chainNodePortLB, false}}},
	kindNPShort:  {prefix: "np-short", nodePort: true, short: true, first: shortOffset, uses: []chainUse{{chainShortPod, false}, {chainShortNode, true}}},
}

// offset is the first index of the endpoint list the kind picks from.
func (k kindInfo) offset() uint32 { return k.first }

// group is one dispatch group: a kind, an endpoint count and an affinity timeout
// (0 for none). Each group has an id (the data of its frontends in the kind's
// dispatch map) and, per chain use, a chain "<use chain>-<name>" holding its rule
// (two with affinity), reached through the use chain's verdict map.
type group struct {
	kind    kind
	n       uint32
	timeout uint32
}

func (g group) name() string {
	s := kinds[g.kind].prefix + "-" + strconv.FormatUint(uint64(g.n), 10)
	if g.timeout != 0 {
		s += "-a" + strconv.FormatUint(uint64(g.timeout), 10)
	}
	return s
}

func compareGroups(a, b group) int {
	switch {
	case a.kind != b.kind:
		return int(a.kind) - int(b.kind)
	case a.n != b.n:
		return cmpU32(a.n, b.n)
	}
	return cmpU32(a.timeout, b.timeout)
}

func cmpU32(a, b uint32) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// groupChain is the chain of group g in use chain use.
func groupChain(use string, g group) string { return use + "-" + g.name() }

// groupVmap is the verdict map of use chain use: group id → goto its group chain.
func groupVmap(use string) string { return use + "-groups" }

// useChains are the chains that dispatch through a verdict map, in the order their
// maps are created.
var useChains = []string{chainClusterIPLB, chainExternalLB, chainNodePortLB, chainShortPod, chainShortNode}

// setKey identifies a set in the cache: a fixed set, or the
// loadBalancerSourceRanges allow set of one prefix length (fwBits > 0).
type setKey struct {
	fixed  fixedSet
	fwBits uint8
}

func fixedKey(s fixedSet) setKey   { return setKey{fixed: s} }
func fwKey(bits int) setKey        { return setKey{fwBits: uint8(bits)} }
func (k setKey) dynamic() bool     { return k.fwBits > 0 }
func (k setKey) isFW() bool        { return k.fwBits > 0 }
func (k setKey) fixedName() string { return fixedSetNames[k.fixed] }

// kind returns the kind whose dispatch map k is.
func (k setKey) kind() (kind, bool) {
	if k.isFW() {
		return 0, false
	}
	return mapKind(k.fixed)
}

func (k setKey) name() string {
	if k.fwBits > 0 {
		return "fw-allow-" + strconv.Itoa(int(k.fwBits))
	}
	return k.fixedName()
}

// addrType is the nftables datatype of one family's addresses.
func addrType(f *family.Family) nftables.SetDatatype {
	if f.BitLen == 128 {
		return nftables.TypeIP6Addr
	}
	return nftables.TypeIPAddr
}

// setTypes are the key and data types of one family. The endpoint index is typed
// mark: a fixed-size host-endian u32 like what numgen writes. (integer has no
// size in nft, which then aborts listing the set's elements.)
type setTypes struct {
	addr, vip, np, epKey, npEPKey, ep, affKey, npAffKey, fwKey, hairpin nftables.SetDatatype
}

func newSetTypes(f *family.Family) setTypes {
	a := addrType(f)
	proto, svc, idx := nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeMark
	return setTypes{
		addr:     a,
		vip:      nftables.MustConcatSetType(a, proto, svc),
		np:       nftables.MustConcatSetType(proto, svc),
		epKey:    nftables.MustConcatSetType(a, proto, svc, idx),
		npEPKey:  nftables.MustConcatSetType(proto, svc, idx),
		ep:       nftables.MustConcatSetType(a, svc),
		affKey:   nftables.MustConcatSetType(a, a, proto, svc),
		npAffKey: nftables.MustConcatSetType(a, proto, svc),
		fwKey:    nftables.MustConcatSetType(a, proto, svc, a),
		hairpin:  nftables.MustConcatSetType(a, a),
	}
}

// affinitySize bounds the kernel memory of each ClientIP affinity map (the
// kernel's default for a set filled from the packet path); a var for tests.
var affinitySize uint32 = 65535

// setDef returns the definition of the set k in family types t.
func (t setTypes) setDef(k setKey) *nft.Set {
	s := &nft.Set{Name: k.name(), Concat: true}
	if kd, ok := k.kind(); ok {
		s.IsMap, s.KeyType, s.DataType = true, t.vip, nftables.TypeMark
		if kinds[kd].nodePort {
			s.KeyType = t.np
		}
		return s
	}
	switch {
	case k.isFW():
		s.KeyType = t.fwKey
	default:
		t.fixedDef(s, k.fixed)
	}
	return s
}

func (t setTypes) fixedDef(s *nft.Set, f fixedSet) {
	switch f {
	case setEndpoints:
		s.IsMap, s.KeyType, s.DataType = true, t.epKey, t.ep
	case setNodePortEndpoints:
		s.IsMap, s.KeyType, s.DataType = true, t.npEPKey, t.ep
	case setAffinity, setNodePortAffinity:
		s.IsMap, s.KeyType, s.DataType = true, t.affKey, nftables.TypeMark
		if f == setNodePortAffinity {
			s.KeyType = t.npAffKey
		}
		s.Timeout, s.Dynamic, s.Size = true, true, affinitySize
	case setClusterIPs, setNodePortIPs:
		s.KeyType, s.Concat = t.addr, false
	case setNoEndpointNodePorts, setNoLocalEndpointNodePorts, setReservedNodePorts:
		s.KeyType = t.np
	case setHairpin:
		s.KeyType = t.hairpin
	default: // the service-key sets
		s.KeyType = t.vip
	}
}

// unreadSets are never read back by a full sync: they are big (one element per
// endpoint and frontend) or written by the packet path. See Backend.Sync for how
// they are kept correct.
func unreadSet(k setKey) bool {
	switch k.fixed {
	case setEndpoints, setNodePortEndpoints, setAffinity, setNodePortAffinity:
		return true
	}
	return false
}

func (k setKey) String() string { return fmt.Sprintf("set %s", k.name()) }
