package nftables

import (
	"encoding/binary"
	"net/netip"
	"slices"

	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// Key encodings (see pkg/nft): every field padded to 4 bytes.
//
//	vip key             addr . proto . port          (ClusterIP, ExternalIP, LB VIP)
//	np key              proto . port                 (NodePort)
//	@endpoints          vip key . index → epaddr . epport
//	@nodeport-endpoints np key . index → epaddr . epport
//
// Every frontend has its own endpoint elements, index O+0..O+N-1 (host-endian
// u32, as numgen writes it; O its kind's offset, see kindInfo.first); an ETP
// Local frontend also holds its short-circuit (cluster) list at
// shortOffset+0..N-1.

func vipKey(a netip.Addr, proto uint8, port uint16) string {
	return string(nft.Concat(nft.AddrBytes(a), nft.ProtoBytes(proto), nft.PortBytes(port)))
}

func npKeyBytes(proto uint8, port uint16) string {
	return string(nft.Concat(nft.ProtoBytes(proto), nft.PortBytes(port)))
}

// Endpoint lists of a port, indexing portRecord.slots.
const (
	listCluster = 0
	listLocal   = 1
)

func listOf(local bool) int {
	if local {
		return listLocal
	}
	return listCluster
}

// portBuilder computes one service port's contributions.
type portBuilder struct {
	c     *cache // for the dispatch groups' ids
	ps    *model.PortState
	proto uint8
	aff   uint32
	out   []contrib
	rec   *portRecord
	used  [2]bool
	// replay: rec's slots are the ones to use, not to reassign.
	replay bool
	// old is rec as it was before this assignment (unless replay): its slots
	// are derived only for the lists used.
	old portRecord
	// slots and data hold each used list's slots and their @endpoints data
	// (epaddr . epport of every slot, in one string), shared by every frontend
	// that uses the list.
	slots [2][]netip.AddrPort
	data  [2]string
	// short: a short-circuit kind uses the cluster list (see hairpin).
	short bool
	// unserved are the external address keys boundExternal left out.
	unserved map[string]bool
	// moves and ghosts are each used list's slotMoves when the port's affinity
	// entries follow its slots (tracksAffinity).
	moves  [2][]int32
	ghosts [2][]uint32
}

func (b *portBuilder) add(set setKey, key, data string) {
	b.out = append(b.out, contrib{set: set, key: key, data: data})
}

// list returns the Local (or Cluster) endpoint list in slot order and its
// elements' data, assigning the slots on first use: every frontend that uses a
// list shares its slots.
func (b *portBuilder) list(local bool) ([]netip.AddrPort, string) {
	l := listOf(local)
	if !b.used[l] {
		eps := b.ps.Cluster
		if local {
			eps = b.ps.Local
		}
		b.used[l] = true
		if b.replay {
			b.slots[l] = b.rec.slotList(l)
		} else {
			old := b.old.slotList(l)
			b.slots[l] = assignSlots(old, eps)
			b.rec.slots[l] = nil
			if !inOrder(b.slots[l], eps) {
				b.rec.slots[l] = b.slots[l]
			}
			if b.tracksAffinity() {
				b.moves[l], b.ghosts[l] = slotMoves(old, b.slots[l])
			}
		}
		b.data[l] = epData(b.slots[l])
	}
	return b.slots[l], b.data[l]
}

// inOrder reports whether slots are eps in order without duplicates (what
// assignSlots gives without old slots).
func inOrder(slots []netip.AddrPort, eps []model.Endpoint) bool {
	j := 0
	for i := range eps {
		ap := eps[i].AddrPort()
		if j < len(slots) && slots[j] == ap {
			j++
		} else if !slices.Contains(slots[:j], ap) {
			return false
		}
	}
	return j == len(slots)
}

// epData encodes the endpoints as @endpoints data (epaddr . epport each), one
// after the other in one string.
func epData(eps []netip.AddrPort) string {
	if len(eps) == 0 {
		return ""
	}
	n := len(eps[0].Addr().Unmap().AsSlice()) + 4
	buf := make([]byte, 0, n*len(eps))
	for _, ap := range eps {
		buf = appendAddr(buf, ap.Addr())
		buf = append(buf, byte(ap.Port()>>8), byte(ap.Port()), 0, 0)
	}
	return string(buf)
}

// appendAddr appends a's nft.AddrBytes.
func appendAddr(buf []byte, a netip.Addr) []byte {
	a = a.Unmap()
	if a.Is4() {
		b := a.As4()
		return append(buf, b[:]...)
	}
	b := a.As16()
	return append(buf, b[:]...)
}

// frontend puts key (a vip key, or an np key for the NodePort kinds) into the
// dispatch map of kind k, naming its group, and writes its endpoint elements,
// key . (offset + i) → endpoint i of the Local (or Cluster) list, as one list
// contribution (see listKey).
func (b *portBuilder) frontend(k kind, key string, local bool) {
	ki := kinds[k]
	eps, data := b.list(local)
	b.short = b.short || ki.short
	b.add(fixedKey(kindMap(k)), key, b.c.groupData(group{kind: k, n: uint32(len(eps)), timeout: b.aff}))
	set := fixedKey(setEndpoints)
	if ki.nodePort {
		set = fixedKey(setNodePortEndpoints)
	}
	if len(eps) == 0 {
		return
	}
	b.add(set, listKey(key, ki.offset()), data)
	b.noteMove(k, key, listOf(local))
}

// listKey is the key of a list contribution to an endpoint map: the frontend key
// and the index of the list's first element, which is the key of that element.
func listKey(front string, first uint32) string {
	return string(appendIndexKey(make([]byte, 0, len(front)+4), front, first))
}

// appendIndexKey appends the endpoint map key front . index i (nft.IndexBytes:
// host-endian, as numgen writes it).
func appendIndexKey[F ~string | ~[]byte](buf []byte, front F, i uint32) []byte {
	buf = append(buf, front...)
	return binary.NativeEndian.AppendUint32(buf, i)
}

// portContribs computes what ps needs in the sets, assigning rec's slots and
// recording ps and the node config in rec. A port with a protocol the kernel rules
// can't match contributes nothing.
func (c *cache) portContribs(ps *model.PortState, rec *portRecord) []contrib {
	old := *rec
	rec.ps, rec.node = ps, c.node
	return c.contribs(rec, false, old)
}

// recorded computes again what rec's port contributed when it was last set: the
// same state, node config and slots give the same elements.
func (c *cache) recorded(rec *portRecord) []contrib {
	return c.contribs(rec, true, portRecord{})
}

// contribs computes the contributions of rec.ps with the node config rec.node.
// Unless replay is set it first (re)assigns rec's slots from old; with replay the
// slots are used as they are.
func (c *cache) contribs(rec *portRecord, replay bool, old portRecord) []contrib {
	ps := rec.ps
	if ps == nil {
		return nil
	}
	b := &portBuilder{c: c, ps: ps, proto: model.ProtoNumber(ps.Protocol), aff: ps.AffinitySeconds, rec: rec, replay: replay, old: old}
	if b.proto == 0 || !c.x.f.Contains(ps.ClusterIP) {
		if !replay {
			rec.slots = [2][]netip.AddrPort{}
		}
		return nil
	}
	b.out = make([]contrib, 0, contribsHint(ps))
	b.add(fixedKey(setClusterIPs), string(nft.AddrBytes(ps.ClusterIP)), "")
	b.clusterIP()
	if ps.ExternallyAccessible() {
		b.external()
	}
	b.firewall(rec.node)
	b.hairpin()
	if !replay {
		for l := range b.used {
			if !b.used[l] {
				rec.slots[l] = nil
			}
		}
	}
	return b.out
}

// contribsHint estimates how many contributions ps makes (exact for the common
// shapes with endpoints: a ClusterIP, optionally a NodePort and external
// addresses, each also in @external-frontends, ETP Cluster, and the @hairpin
// elements of local and unnamed endpoints).
func contribsHint(ps *model.PortState) int {
	fronts := 1
	n := 1 // @cluster-ips
	if ps.ExternallyAccessible() {
		ext := len(ps.ExternalIPs) + len(ps.LoadBalancerVIPs)
		fronts += ext
		if ps.HasAny {
			n += ext // @external-frontends
		}
		if ps.NodePort != 0 {
			fronts++
		}
	}
	n += 2 * fronts // dispatch element and endpoint list of each
	for i := range ps.Cluster {
		if e := &ps.Cluster[i]; e.Local || e.NoNodeName || ps.ExternalPolicyLocal {
			n++ // @hairpin
		}
	}
	return n
}

func (b *portBuilder) clusterIP() {
	ps := b.ps
	key := vipKey(ps.ClusterIP, b.proto, ps.Port)
	switch {
	case len(ps.InternalEndpoints()) > 0:
		b.frontend(kindSvc, key, ps.InternalPolicyLocal)
	case ps.HasAny:
		b.add(fixedKey(setNoLocalEndpointServices), key, "")
	default:
		b.add(fixedKey(setNoEndpointServices), key, "")
	}
}

func (b *portBuilder) externalKeys() []string {
	ps := b.ps
	keys := make([]string, 0, len(ps.ExternalIPs)+len(ps.LoadBalancerVIPs))
	for _, a := range slices.Concat(ps.ExternalIPs, ps.LoadBalancerVIPs) {
		keys = append(keys, vipKey(a, b.proto, ps.Port))
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// external handles ExternalIPs, LoadBalancer VIPs and the NodePort: ETP Cluster
// goes to the cluster endpoints and is masqueraded; ETP Local goes to the local
// ones, except from local pods and the node, which short-circuit to the cluster
// endpoints. Without usable endpoints: reject, or drop when only other nodes have
// endpoints.
func (b *portBuilder) external() {
	ps := b.ps
	keys := b.externalKeys()
	served := b.boundExternal(keys)
	np := npKeyBytes(b.proto, ps.NodePort)
	if ps.HasAny {
		// As kube-proxy's @service-ips, which holds them when the port has
		// endpoints anywhere: such an address at a NodePort's port is this
		// port's, not the NodePort's, even when it is a node address.
		for _, k := range keys {
			b.add(fixedKey(setExternalFrontends), k, "")
		}
	}
	if len(ps.ExternalEndpoints()) > 0 {
		ek, nk := kindExt, kindNP
		if ps.ExternalPolicyLocal {
			ek, nk = kindExtLocal, kindNPLocal
		}
		b.addExternal(served, np, ek, nk, ps.ExternalPolicyLocal)
		// The addresses not served are refused, as when the port has no
		// endpoints, not left to route on unproxied.
		for _, k := range keys[len(served):] {
			b.add(fixedKey(setNoEndpointServices), k, "")
		}
	} else {
		svcSet, npSet := setNoEndpointServices, setNoEndpointNodePorts
		if ps.HasAny {
			svcSet, npSet = setNoLocalEndpointServices, setNoLocalEndpointNodePorts
		}
		for _, k := range keys {
			b.add(fixedKey(svcSet), k, "")
		}
		if ps.NodePort != 0 {
			b.add(fixedKey(npSet), np, "")
		}
	}
	if ps.ExternalPolicyLocal && len(ps.Cluster) > 0 {
		b.addExternal(served, np, kindExtShort, kindNPShort, false)
	}
}

// maxExternalElements bounds the elements one service port's ExternalIPs and
// load-balancer IPs write. Each of them holds its own copy of the port's
// endpoint list (with ETP Local also of the cluster list), and each VIP its
// source ranges (and, when a range holds the node IP, every VIP as a source), so
// a Service with thousands of external addresses and of endpoints would write
// millions of elements: a transaction that holds the nftables lock for minutes,
// and kernel memory in gigabytes. kube-proxy's cost is their sum. 100k elements
// are about 20 MB of kernel memory and 0.7 s to write.
const maxExternalElements = 100000

// boundExternal returns the external address keys to serve, and sets
// b.unserved to the others: all of them, or, when the elements of all could
// pass maxExternalElements, as many (in key order, at least one) as fit,
// logging the others. The count per address is its endpoint lists, dispatch
// elements, firewall elements and @external-frontends element, with every
// endpoint of the port counted (ps.Endpoints), whatever this node chooses, so
// every node serves the same addresses; the cut-off moves with that count. Each
// address left out still costs two elements: its refusal and its
// @external-frontends element.
func (b *portBuilder) boundExternal(keys []string) []string {
	ps := b.ps
	per := ps.Endpoints + 1 // its list and its dispatch element
	if ps.ExternalPolicyLocal {
		per *= 2 // the local list and the short-circuit's cluster list
	}
	per++ // its @external-frontends element
	if len(ps.LoadBalancerVIPs) > 0 && len(ps.SourceRanges) > 0 {
		per += 1 + len(ps.SourceRanges) + len(ps.LoadBalancerVIPs)
	}
	if len(keys)*per <= maxExternalElements {
		return keys
	}
	n := max(1, maxExternalElements/per)
	if !b.replay {
		klog.ErrorS(nil, "Not serving some ExternalIPs and load-balancer IPs of a service port: each would hold its own copy of the endpoint list",
			"servicePort", ps.Name.String(), "externalAddresses", len(keys), "served", n, "endpoints", ps.Endpoints, "maxElements", maxExternalElements)
	}
	b.unserved = map[string]bool{}
	for _, k := range keys[n:] {
		b.unserved[k] = true
	}
	return keys[:n]
}

func (b *portBuilder) addExternal(keys []string, np string, ek, nk kind, local bool) {
	for _, k := range keys {
		b.frontend(ek, k, local)
	}
	if b.ps.NodePort != 0 {
		b.frontend(nk, np, local)
	}
}

// firewall writes loadBalancerSourceRanges: @firewall-ips guards each VIP and
// @fw-allow-L holds vip . masked source for each range of length L. As kube-proxy
// does, when a range holds the node's IP the VIPs themselves are allowed as sources
// (a VIP bound locally loops back with itself as source).
func (b *portBuilder) firewall(node *proxier.NodeConfig) {
	ps := b.ps
	if len(ps.LoadBalancerVIPs) == 0 || len(ps.SourceRanges) == 0 ||
		slices.ContainsFunc(ps.SourceRanges, func(p netip.Prefix) bool { return p.Bits() == 0 }) {
		return
	}
	fromNode := node != nil && slices.ContainsFunc(ps.SourceRanges, func(p netip.Prefix) bool { return p.Contains(node.NodeIP) })
	for _, vip := range ps.LoadBalancerVIPs {
		key := vipKey(vip, b.proto, ps.Port)
		if b.unserved[key] {
			continue // refused to every source (see boundExternal)
		}
		b.add(fixedKey(setFirewallIPs), key, "")
		for _, p := range ps.SourceRanges {
			b.add(fwKey(p.Bits()), key+string(nft.AddrBytes(p.Masked().Addr())), "")
		}
		if fromNode {
			for _, src := range ps.LoadBalancerVIPs {
				b.add(fwKey(src.BitLen()), key+string(nft.AddrBytes(src)), "")
			}
		}
	}
}

// hairpin writes into @hairpin the endpoints that a connection from the
// endpoint itself may reach unmasqueraded: the local endpoints of the used lists
// (and those whose slice names no node, which may be local) and, when a
// short-circuit kind uses the cluster list, its remote ones too. A pod on
// another node is inside the cluster CIDR, so its connection to this
// node's ETP Local NodePort (or an external address routed here) short-circuits
// to the cluster endpoints unmasqueraded; sent to itself, it would answer itself
// directly and never see the reply it waits for. kube-proxy masquerades every
// endpoint reaching itself (a rule in each endpoint's chain); here ClusterIP
// traffic of remote pods, which only comes here when routed without their own
// node's proxy, is left out: that would put every endpoint of the cluster into
// @hairpin.
func (b *portBuilder) hairpin() {
	seen := map[netip.Addr]bool{}
	for l, eps := range [2][]model.Endpoint{listCluster: b.ps.Cluster, listLocal: b.ps.Local} {
		if !b.used[l] {
			continue
		}
		remote := l == listCluster && b.short
		for _, e := range eps {
			if (e.Local || e.NoNodeName || remote) && !seen[e.Addr] {
				seen[e.Addr] = true
				a := string(nft.AddrBytes(e.Addr))
				b.add(fixedKey(setHairpin), a+a, "")
			}
		}
	}
}

// assignSlots gives eps dense indexes 0..len-1, keeping every endpoint that stays
// in its old slot: new endpoints fill the holes first, and when the list shrinks the
// last ones move into the remaining holes. A one-endpoint change thus rewrites at
// most two @endpoints elements.
func assignSlots(old []netip.AddrPort, eps []model.Endpoint) []netip.AddrPort {
	if len(old) == 0 && len(eps) <= 32 {
		// First assignment (a cold start): eps in order, without duplicates.
		slots := make([]netip.AddrPort, 0, len(eps))
		for i := range eps {
			if ap := eps[i].AddrPort(); !slices.Contains(slots, ap) {
				slots = append(slots, ap)
			}
		}
		return slots
	}
	want := make(map[netip.AddrPort]bool, len(eps))
	for i := range eps {
		want[eps[i].AddrPort()] = true
	}
	slots := make([]netip.AddrPort, 0, max(len(old), len(eps)))
	have := make(map[netip.AddrPort]bool, len(old))
	var holes []int
	for _, ap := range old {
		if want[ap] && !have[ap] {
			have[ap] = true
			slots = append(slots, ap)
		} else {
			holes = append(holes, len(slots))
			slots = append(slots, netip.AddrPort{})
		}
	}
	for i := range eps {
		ap := eps[i].AddrPort()
		if have[ap] {
			continue
		}
		have[ap] = true
		if len(holes) > 0 {
			slots[holes[0]] = ap
			holes = holes[1:]
		} else {
			slots = append(slots, ap)
		}
	}
	for len(holes) > 0 {
		last := len(slots) - 1
		if h := holes[len(holes)-1]; h == last {
			holes = holes[:len(holes)-1]
		} else {
			slots[holes[0]] = slots[last]
			holes = holes[1:]
		}
		slots = slots[:last]
	}
	return slots
}

// nodeContribs are the elements that come from the node config: the NodePort
// addresses (when not every local address) and the other family's NodePorts.
func nodeContribs(x exprs, node *proxier.NodeConfig) []contrib {
	var out []contrib
	if !node.NodePortAddresses.MatchAll {
		for _, a := range node.NodePortAddresses.Addrs {
			if x.f.Contains(a) && !x.f.Loopback.Contains(a) {
				out = append(out, contrib{set: fixedKey(setNodePortIPs), key: string(nft.AddrBytes(a))})
			}
		}
	}
	for _, k := range node.ReservedNodePorts {
		if p := model.ProtoNumber(k.Protocol); p != 0 && k.Port != 0 {
			out = append(out, contrib{set: fixedKey(setReservedNodePorts), key: npKeyBytes(p, k.Port)})
		}
	}
	return out
}
