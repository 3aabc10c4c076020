package ipvs

import (
	"cmp"
	"net/netip"
	"slices"

	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/ipvs"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// setID names one of the family's ipsets.
type setID uint8

const (
	setClusterIP     setID = iota // hash:ip,port: ClusterIP, protocol, port
	setExternal                   // hash:ip,port: external addresses with traffic policy Cluster (masqueraded)
	setExternalLocal              // hash:ip,port: external addresses with traffic policy Local
	setFirewall                   // hash:ip,port: VIPs with loadBalancerSourceRanges
	setSourceRanges               // hash:ip,port,net: VIP, protocol, port, allowed source range
	setLoopBack                   // hash:ip,port,ip: local endpoint, protocol, port, endpoint (hairpin)
	setNoEndpoints                // hash:ip,port: no endpoint anywhere: REJECT
	setNoLocal                    // hash:ip,port: endpoints only on other nodes (traffic policy Local): DROP
	setNoLocalExt                 // hash:ip,port: the same for an external address served from local sources with the cluster endpoints
	setIPs                        // hash:ip: every address bound to the dummy link
	setHealthCheck                // hash:ip,port: health check node ports on each NodePort address
	setReserved                   // hash:ip,port: NodePorts the other family holds, on each NodePort address
	numSets
)

var setDefs = [numSets]struct{ name, typ string }{
	setClusterIP:     {"CLUSTER-IP", "hash:ip,port"},
	setExternal:      {"EXTERNAL", "hash:ip,port"},
	setExternalLocal: {"EXTERNAL-LOCAL", "hash:ip,port"},
	setFirewall:      {"FIREWALL", "hash:ip,port"},
	setSourceRanges:  {"SOURCE-RANGES", "hash:ip,port,net"},
	setLoopBack:      {"LOOP-BACK", "hash:ip,port,ip"},
	setNoEndpoints:   {"NO-ENDPOINTS", "hash:ip,port"},
	setNoLocal:       {"NO-LOCAL-ENDPOINTS", "hash:ip,port"},
	setNoLocalExt:    {"NO-LOCAL-EXTERNAL", "hash:ip,port"},
	setIPs:           {"IPS", "hash:ip"},
	setHealthCheck:   {"HEALTH-CHECK", "hash:ip,port"},
	setReserved:      {"RESERVED", "hash:ip,port"},
}

// Prefix starts every chain and ipset name of the IPVS mode; IPv6 ipsets, which
// share the namespace with IPv4's, start with Prefix6.
const (
	Prefix  = "DSIPVS-"
	Prefix6 = "DSIPVS6-"
)

// setName is the family's name of set s.
func setName(f *family.Family, s setID) string {
	if f.BitLen == 128 {
		return Prefix6 + setDefs[s].name
	}
	return Prefix + setDefs[s].name
}

// member is one ipset entry of one set.
type member struct {
	set setID
	e   ipvs.Entry
}

// virtual is one virtual server with its real servers, sorted.
type virtual struct {
	svc   ipvs.Service
	dests []ipvs.Dest
}

// objs is what one service port (or, for the zero name, the node) puts in the
// kernel.
type objs struct {
	vs      []virtual
	members []member
	// addrs are bound to the dummy link (and are members of setIPs).
	addrs []netip.Addr
}

// dests turns endpoints into real servers of weight 1, sorted and unique.
func dests(eps []model.Endpoint) []ipvs.Dest {
	out := make([]ipvs.Dest, 0, len(eps))
	for _, ep := range eps {
		out = append(out, ipvs.Dest{Addr: ep.Addr, Port: ep.Port, Weight: 1})
	}
	slices.SortFunc(out, cmpDest)
	return slices.CompactFunc(out, func(a, b ipvs.Dest) bool { return cmpDest(a, b) == 0 })
}

func cmpDest(a, b ipvs.Dest) int {
	return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
}

// unicast reports whether IPVS takes a as a Service address or a real server.
// The API server accepts multicast ExternalIPs and endpoint addresses outside the
// link-local ranges, but Linux refuses to bind an IPv6 multicast address to a link
// (without IFA_F_MCAUTOJOIN), and IPVS refuses a real server that is not unicast
// (EINVAL): either would fail every sync of the family.
func unicast(a netip.Addr) bool {
	return !a.IsMulticast() && !a.IsUnspecified() && a != netip.AddrFrom4([4]byte{255, 255, 255, 255})
}

// bindable reports whether a can be a Service address bound to the dummy
// link: unicast, and not an IPv6 link-local address (a load balancer's
// status may name one), which the link's own fe80:: addresses hide from the
// read-back, so every periodic check would take it for an address gone.
func bindable(a netip.Addr) bool { return unicast(a) && !ipvs.KernelOwnAddr(a) }

// render returns what ps puts in the kernel.
func render(ps *model.PortState, node *proxier.NodeConfig, sched string) *objs {
	f := node.Family
	proto := model.ProtoNumber(ps.Protocol)
	if proto == 0 {
		return nil
	}
	o := &objs{}
	// Addresses IPVS refuses are left out (logged once per render), so they cost
	// only themselves, as in kube-proxy's IPVS mode, which logs the failed bind.
	var refused []netip.Addr
	defer func() {
		if len(refused) > 0 {
			klog.InfoS("IPVS: leaving out addresses that are not unicast or are IPv6 link-local", "servicePort", ps.Name.String(),
				"ipFamily", f.Name, "addresses", slices.Compact(slices.SortedFunc(slices.Values(refused), netip.Addr.Compare)))
		}
	}()
	usable := func(eps []model.Endpoint) []model.Endpoint {
		if !slices.ContainsFunc(eps, func(ep model.Endpoint) bool { return !unicast(ep.Addr) }) {
			return eps
		}
		return slices.DeleteFunc(slices.Clone(eps), func(ep model.Endpoint) bool {
			if unicast(ep.Addr) {
				return false
			}
			refused = append(refused, ep.Addr)
			return true
		})
	}
	// add adds the virtual server a:port for eps. fallback, for an external
	// address with traffic policy Local, is the cluster endpoints: with no
	// local endpoint, they serve the node's own and its pods' connections, as
	// kube-proxy's IPVS mode serves them, while others are dropped (as in
	// kube-proxy's other modes; kube-proxy's IPVS mode forwards them with the
	// client's address as source).
	add := func(a netip.Addr, port uint16, eps, fallback []model.Endpoint) ipvs.Entry {
		eps, fallback = usable(eps), usable(fallback)
		svc := ipvs.Service{Key: ipvs.Key{Addr: a, Proto: proto, Port: port}, Scheduler: sched, HashPort: sched == "mh"}
		if ps.AffinitySeconds != 0 {
			svc.Persistent, svc.Timeout = true, ps.AffinitySeconds
		}
		e := ipvs.Entry{IP: a, Proto: proto, Port: port}
		// Without endpoints there is no virtual server: IPVS would drop the
		// packet and answer an ICMP error itself, which a local TCP client
		// (its socket locked while it sends) takes as soft, retrying for a
		// second. The filter rules refuse or drop such packets instead.
		switch {
		case len(eps) != 0:
			o.vs = append(o.vs, virtual{svc: svc, dests: dests(eps)})
		case ps.HasAny && len(fallback) != 0:
			o.vs = append(o.vs, virtual{svc: svc, dests: dests(fallback)})
			o.members = append(o.members, member{setNoLocalExt, e})
		case ps.HasAny:
			o.members = append(o.members, member{setNoLocal, e})
		default:
			o.members = append(o.members, member{setNoEndpoints, e})
		}
		return e
	}
	inFamily := func(a netip.Addr) bool { return a.IsValid() && a.BitLen() == f.BitLen }
	serves := func(a netip.Addr) bool {
		if !inFamily(a) {
			return false
		}
		if !bindable(a) {
			refused = append(refused, a)
			return false
		}
		return true
	}
	if inFamily(ps.ClusterIP) {
		o.members = append(o.members, member{setClusterIP, add(ps.ClusterIP, ps.Port, ps.InternalEndpoints(), nil)})
		o.addrs = append(o.addrs, ps.ClusterIP)
	}
	ext := setExternal
	var fallback []model.Endpoint
	if ps.ExternalPolicyLocal {
		ext, fallback = setExternalLocal, ps.Cluster
	}
	external := ps.ExternalEndpoints()
	// bind adds an external address to the dummy link (and IPS), unless it is
	// one of the node's own already: as kube-proxy's, since in IPS the INPUT
	// rules would refuse every other port of it (ssh, the kubelet).
	var served []netip.Addr // the external addresses served, for the health check
	bind := func(a netip.Addr) {
		served = append(served, a)
		if _, own := slices.BinarySearchFunc(node.LocalAddrs, a, netip.Addr.Compare); !own {
			o.addrs = append(o.addrs, a)
		}
	}
	for _, a := range ps.ExternalIPs {
		if serves(a) {
			o.members = append(o.members, member{ext, add(a, ps.Port, external, fallback)})
			bind(a)
		}
	}
	anySource := len(ps.SourceRanges) == 0 || slices.ContainsFunc(ps.SourceRanges, func(p netip.Prefix) bool { return p.Bits() == 0 })
	for _, a := range ps.LoadBalancerVIPs {
		if !serves(a) {
			continue
		}
		e := add(a, ps.Port, external, fallback)
		o.members = append(o.members, member{ext, e})
		bind(a)
		if anySource {
			continue
		}
		o.members = append(o.members, member{setFirewall, e})
		fromNode := false
		for _, r := range ps.SourceRanges {
			if r.Addr().BitLen() == f.BitLen {
				o.members = append(o.members, member{setSourceRanges, ipvs.Entry{IP: a, Proto: proto, Port: ps.Port,
					IP2: r.Addr(), CIDR2: rangeBits(r)}})
				fromNode = fromNode || r.Contains(node.NodeIP)
			}
		}
		// The node's own connections to the VIP, bound to the dummy link, take
		// it as their source: as in kube-proxy, they are allowed when a range
		// holds the node's IP (the mangle OUTPUT rule drops the others).
		if fromNode {
			o.members = append(o.members, member{setSourceRanges, ipvs.Entry{IP: a, Proto: proto, Port: ps.Port, IP2: a}})
		}
	}
	if ps.NodePort != 0 {
		for _, a := range nodePortAddrs(node) {
			o.members = append(o.members, member{ext, add(a, ps.NodePort, external, fallback)})
		}
	}
	for _, eps := range [][]model.Endpoint{ps.Cluster, ps.Local} {
		for _, ep := range eps {
			if ep.Local {
				o.members = append(o.members, member{setLoopBack, ipvs.Entry{IP: ep.Addr, Proto: proto, Port: ep.Port, IP2: ep.Addr}})
			}
		}
	}
	if ps.HealthCheckNodePort != 0 {
		// On the NodePort addresses and, as kube-proxy's IPVS mode lets the
		// port through on every address, on the Service's own external
		// addresses: some load balancers probe the VIP (in IPS, whose INPUT
		// rule would refuse it).
		for _, a := range slices.Concat(nodePortAddrs(node), served) {
			o.members = append(o.members, member{setHealthCheck, ipvs.Entry{IP: a, Proto: 6, Port: ps.HealthCheckNodePort}})
		}
	}
	return o
}

// rangeBits is a source range's prefix length as the ipset stores it: 0 for a
// single address (the set's default).
func rangeBits(r netip.Prefix) uint8 {
	if r.Bits() == r.Addr().BitLen() {
		return 0
	}
	return uint8(r.Bits())
}

// nodePortAddrs are the family's addresses NodePorts are served on (never
// link-local ones: a virtual server there would serve every link).
func nodePortAddrs(node *proxier.NodeConfig) []netip.Addr {
	var out []netip.Addr
	for _, a := range node.NodePortAddresses.Addrs {
		if a.BitLen() == node.Family.BitLen && !a.IsLinkLocalUnicast() {
			out = append(out, a)
		}
	}
	return out
}

// renderNode returns the node's own members: the NodePorts the other family holds,
// on each NodePort address.
func renderNode(node *proxier.NodeConfig) *objs {
	o := &objs{}
	for _, k := range node.ReservedNodePorts {
		if proto := model.ProtoNumber(k.Protocol); proto != 0 {
			for _, a := range nodePortAddrs(node) {
				o.members = append(o.members, member{setReserved, ipvs.Entry{IP: a, Proto: proto, Port: k.Port}})
			}
		}
	}
	return o
}
