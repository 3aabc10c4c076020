package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/nftables/expr"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/nodeport"
	"github.com/dsproxy/dsproxy/pkg/proxier"
	v1 "k8s.io/api/core/v1"
)

type behaviourCase struct {
	name  string
	setup func(e *env)
	pkt   source
	want  func(f *family.Family) outcome
}

// Addresses used by the cases, per family.
func cip(f *family.Family, n int, port uint16) netip.AddrPort { return ap(testaddr.Svc(f, n), port) }
func pod(f *family.Family, n int, port uint16) netip.AddrPort { return ap(testaddr.Pod(f, n), port) }
func ext(f *family.Family, n int, port uint16) netip.AddrPort { return ap(testaddr.Ext(f, n), port) }
func nodeAP(f *family.Family, port uint16) netip.AddrPort     { return ap(testaddr.Node(f, 1), port) }
func dnatTo(masq bool, eps ...netip.AddrPort) outcome {
	return outcome{verdict: nft.Accept, dnat: eps, masq: masq}
}
func dropped() outcome                                                                 { return outcome{verdict: nft.Drop} }
func rejected(tcpReset bool) outcome                                                   { return outcome{verdict: nft.Reject, tcpReset: tcpReset} }
func dst(fn func(f *family.Family) netip.AddrPort) func(*family.Family) netip.AddrPort { return fn }

// at builds a packet source with a per-family destination.
func at(src source, d func(f *family.Family) netip.AddrPort, proto uint8) source {
	return func(f *family.Family) nft.Packet { return to(src, d(f), proto)(f) }
}

// twoRemote: web:80 → pods 1 and 2 (remote) on 8080, with NodePort 30080,
// ExternalIP Ext(1) and LB VIP Ext(2).
func twoRemote(opts ...svcOpt) func(e *env) {
	return func(e *env) {
		all := append([]svcOpt{nodePort(30080), externalIP(1), lbVIP(2)}, opts...)
		e.put(svc(e.f, "web", 10, 80, tcp, all...), ep(e.f, 1, 8080, false), ep(e.f, 2, 8080, false))
	}
}

// oneLocal: like twoRemote, but pod 1 runs on this node.
func oneLocal(opts ...svcOpt) func(e *env) {
	return func(e *env) {
		all := append([]svcOpt{nodePort(30080), externalIP(1), lbVIP(2)}, opts...)
		e.put(svc(e.f, "web", 10, 80, tcp, all...), ep(e.f, 1, 8080, true), ep(e.f, 2, 8080, false))
	}
}

// sharedExternalIP: Services "a" (pods 1..na) and "b" (pods 11..10+nb), both
// with ExternalIP Ext(3) on port 80.
func sharedExternalIP(na, nb int) func(e *env) {
	return func(e *env) {
		var a, b []model.Endpoint
		for i := range na {
			a = append(a, ep(e.f, 1+i, 8080, false))
		}
		for i := range nb {
			b = append(b, ep(e.f, 11+i, 8080, false))
		}
		e.put(svc(e.f, "a", 20, 80, tcp, externalIP(3)), a...)
		e.put(svc(e.f, "b", 21, 80, tcp, externalIP(3)), b...)
	}
}

// remoteOnly: web:80 → pod 2 (remote) on 8080, with NodePort 30080 and
// ExternalIP Ext(1).
func remoteOnly(opts ...svcOpt) func(e *env) {
	return func(e *env) {
		all := append([]svcOpt{nodePort(30080), externalIP(1)}, opts...)
		e.put(svc(e.f, "web", 10, 80, tcp, all...), ep(e.f, 2, 8080, false))
	}
}

// sharedExternalIPKinds: Service "a" (ETP Local; pod 1 local, pod 2 remote)
// and "b" (ETP Cluster; pods 11 and 12 remote), both with ExternalIP Ext(3) on
// port 80. "a" is the lowest owner of the shared key.
func sharedExternalIPKinds() func(e *env) {
	return func(e *env) {
		e.put(svc(e.f, "a", 20, 80, tcp, externalIP(3), etpLocal()), ep(e.f, 1, 8080, true), ep(e.f, 2, 8080, false))
		e.put(svc(e.f, "b", 21, 80, tcp, externalIP(3)), ep(e.f, 11, 8080, false), ep(e.f, 12, 8080, false))
	}
}

// clusterIPAsExternalIP: Service "b" (ClusterIP Svc(21):80, pod 1) and "a"
// (pods 11, 12, 13) whose ExternalIP is b's ClusterIP, on the same port. "a" is
// the lowest owner of the shared key.
func clusterIPAsExternalIP() func(e *env) {
	return func(e *env) {
		e.put(svc(e.f, "b", 21, 80, tcp), ep(e.f, 1, 8080, false))
		e.put(svc(e.f, "a", 20, 80, tcp, func(f *family.Family, sp *model.ServicePort) {
			sp.ExternalIPs = append(sp.ExternalIPs, testaddr.Svc(f, 21))
		}), ep(e.f, 11, 8080, false), ep(e.f, 12, 8080, false), ep(e.f, 13, 8080, false))
	}
}

// externalIPAtNodePort: Service "a" (pods 1 and 2, remote, or none when !aEps)
// whose ExternalIP is the node IP, on port 30080, and Service "b" (pods 11 and
// 12 on 8080; ETP Local when bLocal, pod 11 on this node) whose NodePort is
// 30080.
func externalIPAtNodePort(aEps, bLocal bool, aOpts ...svcOpt) func(e *env) {
	return func(e *env) {
		opts := append([]svcOpt{func(f *family.Family, sp *model.ServicePort) {
			sp.ExternalIPs = append(sp.ExternalIPs, testaddr.Node(f, 1))
		}}, aOpts...)
		var eps []model.Endpoint
		if aEps {
			eps = []model.Endpoint{ep(e.f, 1, 8080, false), ep(e.f, 2, 8080, false)}
		}
		e.put(svc(e.f, "a", 20, 30080, tcp, opts...), eps...)
		bOpts := []svcOpt{nodePort(30080)}
		if bLocal {
			bOpts = append(bOpts, etpLocal())
		}
		e.put(svc(e.f, "b", 21, 80, tcp, bOpts...), ep(e.f, 11, 8080, bLocal), ep(e.f, 12, 8080, false))
	}
}

func both(f *family.Family) []netip.AddrPort {
	return []netip.AddrPort{pod(f, 1, 8080), pod(f, 2, 8080)}
}

var behaviourCases = []behaviourCase{
	{"clusterIP from local pod: DNAT, no masquerade", twoRemote(), at(fromPod(5), dst(func(f *family.Family) netip.AddrPort { return cip(f, 10, 80) }), tcp),
		func(f *family.Family) outcome { return dnatTo(false, both(f)...) }},
	{"clusterIP from outside: DNAT and masquerade", twoRemote(), at(fromClient, func(f *family.Family) netip.AddrPort { return cip(f, 10, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, both(f)...) }},
	{"clusterIP from the node: masquerade", twoRemote(), at(fromNode, func(f *family.Family) netip.AddrPort { return cip(f, 10, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, both(f)...) }},
	{"masqueradeAll: pod traffic masqueraded", func(e *env) { e.node.MasqueradeAll = true; twoRemote()(e) },
		at(fromPod(5), func(f *family.Family) netip.AddrPort { return cip(f, 10, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, both(f)...) }},
	{"bridge detector: pod on the bridge not masqueraded", func(e *env) {
		e.node.Local.Mode, e.node.Local.Interface = "BridgeInterface", podIface
		twoRemote()(e)
	}, at(fromPod(5), func(f *family.Family) netip.AddrPort { return cip(f, 10, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(false, both(f)...) }},
	{"interface prefix detector: outside client masqueraded", func(e *env) {
		e.node.Local.Mode, e.node.Local.Interface = "InterfaceNamePrefix", "cbr"
		twoRemote()(e)
	}, at(fromClient, func(f *family.Family) netip.AddrPort { return cip(f, 10, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, both(f)...) }},
	{"udp clusterIP", func(e *env) { e.put(svc(e.f, "dns", 11, 53, udp), ep(e.f, 3, 5353, false)) },
		at(fromPod(5), func(f *family.Family) netip.AddrPort { return cip(f, 11, 53) }, udp),
		func(f *family.Family) outcome { return dnatTo(false, pod(f, 3, 5353)) }},
	{"sctp clusterIP", func(e *env) { e.put(svc(e.f, "sig", 12, 3868, sctp), ep(e.f, 3, 3868, false)) },
		at(fromPod(5), func(f *family.Family) netip.AddrPort { return cip(f, 12, 3868) }, sctp),
		func(f *family.Family) outcome { return dnatTo(false, pod(f, 3, 3868)) }},
	{"nodePort from outside: DNAT and masquerade", twoRemote(), at(fromClient, func(f *family.Family) netip.AddrPort { return nodeAP(f, 30080) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, both(f)...) }},
	{"nodePort on a listed address", func(e *env) {
		e.node.NodePortAddresses = nodeport.Addresses{Family: e.f, Addrs: []netip.Addr{testaddr.Node(e.f, 1)}}
		twoRemote()(e)
	}, at(fromClient, func(f *family.Family) netip.AddrPort { return nodeAP(f, 30080) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, both(f)...) }},
	{"udp nodePort", func(e *env) { e.put(svc(e.f, "dns", 11, 53, udp, nodePort(30053)), ep(e.f, 3, 5353, false)) },
		at(fromClient, func(f *family.Family) netip.AddrPort { return nodeAP(f, 30053) }, udp),
		func(f *family.Family) outcome { return dnatTo(true, pod(f, 3, 5353)) }},
	{"externalIP from outside: DNAT and masquerade", twoRemote(), at(fromClient, func(f *family.Family) netip.AddrPort { return ext(f, 1, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, both(f)...) }},
	{"LB VIP, source in range", twoRemote(sourceRange(1, 24)), at(fromClient, func(f *family.Family) netip.AddrPort { return ext(f, 2, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, both(f)...) }},
	{"LB VIP, source out of range dropped", twoRemote(sourceRange(200, 30)), at(fromClient, func(f *family.Family) netip.AddrPort { return ext(f, 2, 80) }, tcp),
		func(f *family.Family) outcome { return dropped() }},
	{"source ranges don't guard the externalIP", twoRemote(sourceRange(200, 30)), at(fromClient, func(f *family.Family) netip.AddrPort { return ext(f, 1, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, both(f)...) }},
	{"ETP Local nodePort: local endpoint only, no masquerade", oneLocal(etpLocal()), at(fromClient, func(f *family.Family) netip.AddrPort { return nodeAP(f, 30080) }, tcp),
		func(f *family.Family) outcome { return dnatTo(false, pod(f, 1, 8080)) }},
	{"ETP Local LB VIP: local endpoint only", oneLocal(etpLocal()), at(fromClient, func(f *family.Family) netip.AddrPort { return ext(f, 2, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(false, pod(f, 1, 8080)) }},
	{"ETP Local without local endpoints: dropped", twoRemote(etpLocal()), at(fromClient, func(f *family.Family) netip.AddrPort { return nodeAP(f, 30080) }, tcp),
		func(f *family.Family) outcome { return dropped() }},
	{"ETP Local without local endpoints: externalIP dropped", twoRemote(etpLocal()), at(fromClient, func(f *family.Family) netip.AddrPort { return ext(f, 1, 80) }, tcp),
		func(f *family.Family) outcome { return dropped() }},
	{"ETP Local short-circuit: pod to LB VIP uses cluster endpoints", twoRemote(etpLocal()), at(fromPod(5), func(f *family.Family) netip.AddrPort { return ext(f, 2, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(false, both(f)...) }},
	{"ETP Local short-circuit: node to nodePort uses cluster endpoints, masqueraded", twoRemote(etpLocal()), at(fromNode, func(f *family.Family) netip.AddrPort { return nodeAP(f, 30080) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, both(f)...) }},
	{"ETP Local: clusterIP still uses all endpoints", oneLocal(etpLocal()), at(fromPod(5), func(f *family.Family) netip.AddrPort { return cip(f, 10, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(false, both(f)...) }},
	{"ITP Local: clusterIP uses local endpoint only", oneLocal(itpLocal()), at(fromPod(5), func(f *family.Family) netip.AddrPort { return cip(f, 10, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(false, pod(f, 1, 8080)) }},
	{"ITP Local: nodePort still uses all endpoints", oneLocal(itpLocal()), at(fromClient, func(f *family.Family) netip.AddrPort { return nodeAP(f, 30080) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, both(f)...) }},
	{"ITP Local without local endpoints: clusterIP dropped", twoRemote(itpLocal()), at(fromPod(5), func(f *family.Family) netip.AddrPort { return cip(f, 10, 80) }, tcp),
		func(f *family.Family) outcome { return dropped() }},
	{"ITP and ETP Local: pod to LB VIP short-circuits to all endpoints", oneLocal(itpLocal(), etpLocal()), at(fromPod(5), func(f *family.Family) netip.AddrPort { return ext(f, 2, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(false, both(f)...) }},
	{"ITP and ETP Local: outside to LB VIP local only", oneLocal(itpLocal(), etpLocal()), at(fromClient, func(f *family.Family) netip.AddrPort { return ext(f, 2, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(false, pod(f, 1, 8080)) }},
	{"no endpoints, tcp: reset", func(e *env) { e.put(svc(e.f, "empty", 13, 80, tcp)) },
		at(fromPod(5), func(f *family.Family) netip.AddrPort { return cip(f, 13, 80) }, tcp),
		func(f *family.Family) outcome { return rejected(true) }},
	{"no endpoints, tcp from the node: reset", func(e *env) { e.put(svc(e.f, "empty", 13, 80, tcp)) },
		at(fromNode, func(f *family.Family) netip.AddrPort { return cip(f, 13, 80) }, tcp),
		func(f *family.Family) outcome { return rejected(true) }},
	{"no endpoints, udp: icmp port unreachable", func(e *env) { e.put(svc(e.f, "empty", 13, 53, udp)) },
		at(fromPod(5), func(f *family.Family) netip.AddrPort { return cip(f, 13, 53) }, udp),
		func(f *family.Family) outcome { return rejected(false) }},
	{"no endpoints, nodePort: reset", func(e *env) { e.put(svc(e.f, "empty", 13, 80, tcp, nodePort(30099))) },
		at(fromClient, func(f *family.Family) netip.AddrPort { return nodeAP(f, 30099) }, tcp),
		func(f *family.Family) outcome { return rejected(true) }},
	{"no endpoints, externalIP: reset", func(e *env) { e.put(svc(e.f, "empty", 13, 80, tcp, externalIP(3))) },
		at(fromClient, func(f *family.Family) netip.AddrPort { return ext(f, 3, 80) }, tcp),
		func(f *family.Family) outcome { return rejected(true) }},
	{"reserved nodePort of the other family: rejected", func(e *env) {
		e.node.ReservedNodePorts = []nodeport.Key{{Protocol: v1.ProtocolUDP, Port: 30555}}
		twoRemote()(e)
	}, at(fromClient, func(f *family.Family) netip.AddrPort { return nodeAP(f, 30555) }, udp),
		func(f *family.Family) outcome { return rejected(false) }},
	{"unknown port of a clusterIP: rejected", twoRemote(), at(fromPod(5), func(f *family.Family) netip.AddrPort { return cip(f, 10, 81) }, tcp),
		func(f *family.Family) outcome { return rejected(true) }},
	{"unallocated service IP: dropped", twoRemote(), at(fromPod(5), func(f *family.Family) netip.AddrPort { return cip(f, 99, 80) }, tcp),
		func(f *family.Family) outcome { return dropped() }},
	{"hairpin: pod reaching itself is masqueraded", func(e *env) { e.put(svc(e.f, "self", 14, 80, tcp), ep(e.f, 1, 8080, true)) },
		at(fromPod(1), func(f *family.Family) netip.AddrPort { return cip(f, 14, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, pod(f, 1, 8080)) }},
	{"hairpin: an endpoint without a node name reaching itself is masqueraded", func(e *env) {
		unnamed := ep(e.f, 1, 8080, false)
		unnamed.NoNodeName = true
		e.put(svc(e.f, "self", 14, 80, tcp), unnamed)
	}, at(fromPod(1), func(f *family.Family) netip.AddrPort { return cip(f, 14, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, pod(f, 1, 8080)) }},
	{"hairpin: a remote endpoint reaching itself through a ClusterIP is not masqueraded", func(e *env) { e.put(svc(e.f, "self", 14, 80, tcp), ep(e.f, 1, 8080, false)) },
		at(fromPod(1), func(f *family.Family) netip.AddrPort { return cip(f, 14, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(false, pod(f, 1, 8080)) }},
	{"hairpin: remote pod short-circuited to itself is masqueraded", remoteOnly(etpLocal()),
		at(fromRemotePod(2), func(f *family.Family) netip.AddrPort { return nodeAP(f, 30080) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, pod(f, 2, 8080)) }},
	{"hairpin: remote pod short-circuited to another endpoint is not masqueraded", remoteOnly(etpLocal()),
		at(fromRemotePod(5), func(f *family.Family) netip.AddrPort { return nodeAP(f, 30080) }, tcp),
		func(f *family.Family) outcome { return dnatTo(false, pod(f, 2, 8080)) }},
	{"hairpin: remote pod short-circuited to itself through an ExternalIP", remoteOnly(etpLocal()),
		at(fromRemotePod(2), func(f *family.Family) netip.AddrPort { return ext(f, 1, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, pod(f, 2, 8080)) }},
	{"affinity: first connection may go to any endpoint", twoRemote(affinity(10800)), at(fromPod(5), func(f *family.Family) netip.AddrPort { return cip(f, 10, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(false, both(f)...) }},
	{"affinity on nodePort", twoRemote(affinity(60)), at(fromClient, func(f *family.Family) netip.AddrPort { return nodeAP(f, 30080) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, both(f)...) }},
	// Two Services claiming one ExternalIP:port: the first by name (the lowest
	// owner) gets all of its traffic, over all of its endpoints: the dispatch
	// map holds one element per frontend, the owner's group, as @endpoints
	// holds the owner's list.
	{"shared ExternalIP: the first Service serves it", sharedExternalIP(3, 5), at(fromClient, func(f *family.Family) netip.AddrPort { return ext(f, 3, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, pod(f, 1, 8080), pod(f, 2, 8080), pod(f, 3, 8080)) }},
	{"shared ExternalIP: the first Service serves it, though its list is longer", sharedExternalIP(5, 3), at(fromClient, func(f *family.Family) netip.AddrPort { return ext(f, 3, 80) }, tcp),
		func(f *family.Family) outcome {
			return dnatTo(true, pod(f, 1, 8080), pod(f, 2, 8080), pod(f, 3, 8080), pod(f, 4, 8080), pod(f, 5, 8080))
		}},
	// One address and port claimed by frontends of different kinds: each kind's
	// group picks from its own list (each kind has its own index range under
	// the key), and the chain order decides which Service serves: ETP Cluster
	// before ETP Local, short-circuits for local pods first, a ClusterIP before
	// an external address.
	{"shared ExternalIP, ETP Local and Cluster: outside traffic to the Cluster one", sharedExternalIPKinds(), at(fromClient, func(f *family.Family) netip.AddrPort { return ext(f, 3, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, pod(f, 11, 8080), pod(f, 12, 8080)) }},
	{"shared ExternalIP, ETP Local and Cluster: local pods short-circuit to the Local one's cluster endpoints", sharedExternalIPKinds(), at(fromPod(5), func(f *family.Family) netip.AddrPort { return ext(f, 3, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(false, pod(f, 1, 8080), pod(f, 2, 8080)) }},
	{"ExternalIP equal to another Service's ClusterIP: the ClusterIP's", clusterIPAsExternalIP(), at(fromPod(5), func(f *family.Family) netip.AddrPort { return cip(f, 21, 80) }, tcp),
		func(f *family.Family) outcome { return dnatTo(false, pod(f, 1, 8080)) }},
	// An ExternalIP equal to a node IP, at a port that is another Service's
	// NodePort: as in kube-proxy, whose @service-ips comes before the NodePorts,
	// the ExternalIP's Service serves it (when it has endpoints), from
	// everywhere, and drops there when ETP Local finds no local endpoint.
	{"ExternalIP at another Service's NodePort: outside traffic to the ExternalIP's", externalIPAtNodePort(true, true),
		at(fromClient, func(f *family.Family) netip.AddrPort { return nodeAP(f, 30080) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, both(f)...) }},
	{"ExternalIP at another Service's ETP Local NodePort: local pods to the ExternalIP's", externalIPAtNodePort(true, true),
		at(fromPod(5), func(f *family.Family) netip.AddrPort { return nodeAP(f, 30080) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, both(f)...) }},
	{"ExternalIP at another Service's ETP Local NodePort: the node to the ExternalIP's", externalIPAtNodePort(true, true),
		at(fromNode, func(f *family.Family) netip.AddrPort { return nodeAP(f, 30080) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, both(f)...) }},
	{"ETP Local ExternalIP without local endpoints at another Service's NodePort: dropped", externalIPAtNodePort(true, false, etpLocal()),
		at(fromClient, func(f *family.Family) netip.AddrPort { return nodeAP(f, 30080) }, tcp),
		func(f *family.Family) outcome { return dropped() }},
	{"ExternalIP without endpoints at another Service's NodePort: the NodePort's", externalIPAtNodePort(false, false),
		at(fromClient, func(f *family.Family) netip.AddrPort { return nodeAP(f, 30080) }, tcp),
		func(f *family.Family) outcome { return dnatTo(true, pod(f, 11, 8080), pod(f, 12, 8080)) }},
	{"other traffic is untouched", twoRemote(), at(fromPod(5), func(f *family.Family) netip.AddrPort { return ext(f, 50, 443) }, tcp),
		func(f *family.Family) outcome { return outcome{verdict: nft.Accept} }},
}

// TestBehaviour runs every case for both families, once built by a cold start and
// once by an incremental sync, and checks both build the same ruleset.
func TestBehaviour(t *testing.T) {
	for _, f := range family.All {
		for _, tc := range behaviourCases {
			t.Run(f.Name+"/"+tc.name, func(t *testing.T) {
				cold := newEnv(t, f)
				tc.setup(cold)
				cold.sync(true)
				cold.check(tc.pkt(f), tc.want(f))

				inc := newEnv(t, f)
				inc.sync(false)
				tc.setup(inc)
				var names []model.ServicePortName
				for n := range inc.state.Ports {
					names = append(names, n)
				}
				res, err := inc.b.Sync(t.Context(), &proxier.SyncRequest{State: inc.state, Changed: names, Node: inc.node, NodeChanged: true})
				if err != nil {
					t.Fatal(err)
				}
				if res.Transactions != 1 {
					t.Errorf("incremental sync: %d transactions, want 1", res.Transactions)
				}
				inc.check(tc.pkt(f), tc.want(f))
				if c, i := cold.fake.Dump(f), inc.fake.Dump(f); c != i {
					t.Errorf("incremental ruleset differs from cold start:\ncold:\n%s\nincremental:\n%s", c, i)
				}
			})
		}
	}
}

// TestDispatchOneRule: however many endpoint counts are in use, a new connection
// to a ClusterIP evaluates one rule in clusterip-lb (its kind's dispatch) and one
// in its group's chain. With a rule per count it walked every count before its own.
func TestDispatchOneRule(t *testing.T) {
	for _, f := range family.All {
		e := newEnv(t, f)
		const counts = 20
		for n := 1; n <= counts; n++ {
			eps := make([]model.Endpoint, n)
			for j := range eps {
				eps[j] = ep(f, j+1, 8080, false)
			}
			e.put(svc(f, fmt.Sprintf("s%02d", n), n, 80, tcp), eps...)
		}
		e.sync(true)
		for _, n := range []int{1, counts} {
			res, err := e.fake.Trace(e.tnode(), to(fromPod(30), cip(f, n, 80), tcp)(f))
			if err != nil {
				t.Fatal(err)
			}
			lb, group := 0, 0
			for _, l := range res.Trace {
				switch {
				case strings.Contains(l, " clusterip-lb rule "):
					lb++
				case strings.Contains(l, fmt.Sprintf(" clusterip-lb-svc-%d rule ", n)):
					group++
				case strings.Contains(l, " clusterip-lb-"):
					t.Errorf("%s: %d endpoints: another group's chain: %s", f, n, l)
				}
			}
			if lb != 1 || group != 1 || !res.DNAT.IsValid() {
				t.Errorf("%s: %d endpoints: %d clusterip-lb rules, %d group rules, dnat %v; want 1, 1, an endpoint:\n%s",
					f, n, lb, group, res.DNAT, strings.Join(res.Trace, "\n"))
			}
		}
	}
}

// TestInvalidDrop: a forwarded packet conntrack marks invalid is dropped, as in
// kube-proxy's iptables mode, unless the node sets nf_conntrack_tcp_be_liberal;
// a valid one to the same pod passes either way.
func TestInvalidDrop(t *testing.T) {
	for _, f := range family.All {
		for _, liberal := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/liberal=%v", f.Name, liberal), func(t *testing.T) {
				e := newEnv(t, f)
				e.b = New(f, e.fake, Options{TCPBeLiberal: liberal})
				twoRemote()(e)
				e.sync(true)
				p := to(fromClient, pod(f, 1, 8080), tcp)(f)
				p.CtState = nft.CtEstablished
				e.check(p, outcome{verdict: nft.Accept})
				p.CtState = nft.CtInvalid
				if liberal {
					e.check(p, outcome{verdict: nft.Accept})
				} else {
					e.check(p, dropped())
				}
			})
		}
	}
}

// TestMasqueradeMark: with kube-proxy's nftables.masqueradeBit set to 5, the
// packets that need masquerading carry 0x20 to postrouting, and a mark another
// program set in bit 14 (the default bit) neither masquerades a packet nor is
// cleared. With ClientIP affinity too (its rules set the bit themselves).
func TestMasqueradeMark(t *testing.T) {
	const mark, other = 1 << 5, 1 << 14
	for _, f := range family.All {
		for _, sticky := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/affinity=%v", f.Name, sticky), func(t *testing.T) {
				e := newEnv(t, f)
				e.b = New(f, e.fake, Options{MasqueradeMark: mark})
				var opts []svcOpt
				if sticky {
					opts = append(opts, affinity(60))
				}
				twoRemote(opts...)(e)
				e.sync(true)
				for _, tc := range []struct {
					name     string
					p        nft.Packet
					masq     bool
					inMark   uint32
					wantMark uint32
				}{
					{"nodePort from outside", to(fromClient, nodeAP(f, 30080), tcp)(f), true, 0, 0},
					{"nodePort from outside, other's bit 14", to(fromClient, nodeAP(f, 30080), tcp)(f), true, other, other},
					{"clusterIP from outside the cluster", to(fromClient, cip(f, 10, 80), tcp)(f), true, other, other},
					{"clusterIP from a pod", to(fromPod(5), cip(f, 10, 80), tcp)(f), false, 0, 0},
					{"clusterIP from a pod, other's bit 14", to(fromPod(5), cip(f, 10, 80), tcp)(f), false, other, other},
				} {
					tc.p.Mark = tc.inMark
					res, err := e.fake.TraceAll(e.tnode(), tc.p)
					if err != nil {
						t.Fatal(err)
					}
					// Twice more, keeping the affinity entry: pick, then hit.
					for range 2 {
						r, err := e.fake.Trace(e.tnode(), tc.p)
						if err != nil {
							t.Fatal(err)
						}
						res = append(res, r)
					}
					if sticky && !slices.ContainsFunc(res, func(r nft.Result) bool {
						return strings.Contains(strings.Join(r.Trace, "\n"), "affinity hit") && !strings.Contains(strings.Join(r.Trace, "\n"), "affinity pick")
					}) {
						t.Errorf("%s: no trace took the affinity hit rule", tc.name)
					}
					for _, r := range res {
						if r.Masquerade != tc.masq || r.Mark != tc.wantMark || !r.DNAT.IsValid() {
							t.Errorf("%s: masquerade %v, mark %#x, dnat %v; want masquerade %v, mark %#x, DNAT\n%s",
								tc.name, r.Masquerade, r.Mark, r.DNAT, tc.masq, tc.wantMark, strings.Join(r.Trace, "\n"))
						}
					}
				}
			})
		}
	}
}

// TestFlushed: Flushed reports the live table gone (as after "nft flush
// ruleset"), emptied ("nft flush table") or a base chain changed, so the
// proxier's periodic check resyncs; never before the first sync, and not once the
// full sync it asks for has repaired the table, which counts one repair.
func TestFlushed(t *testing.T) {
	tamper := []struct {
		name string
		tx   func(f *family.Family, table string) *nft.Tx
	}{
		{"table deleted", func(f *family.Family, table string) *nft.Tx {
			tx := nft.NewTx(f)
			tx.DeleteTable(table)
			return tx
		}},
		{"base chains emptied", func(f *family.Family, table string) *nft.Tx {
			tx := nft.NewTx(f)
			for _, c := range newExprs(f).baseChainList() {
				c.Rules = nil
				tx.SetChain(table, c)
			}
			return tx
		}},
		{"nat-postrouting edited", func(f *family.Family, table string) *nft.Tx {
			tx := nft.NewTx(f)
			for _, c := range newExprs(f).baseChainList() {
				if c.Name == chainNATPostrouting {
					c.Rules = []nft.Rule{{Exprs: []expr.Any{verdict(expr.VerdictAccept)}}}
					tx.SetChain(table, c)
				}
			}
			return tx
		}},
	}
	for _, f := range family.All {
		for _, tc := range tamper {
			e := newEnv(t, f)
			if e.b.Flushed(t.Context()) {
				t.Errorf("%s: flushed before the first sync", f)
			}
			twoRemote()(e)
			e.sync(true)
			if e.b.Flushed(t.Context()) {
				t.Errorf("%s: flushed right after a sync", f)
			}
			if err := e.fake.Apply(t.Context(), tc.tx(f, e.b.Table())); err != nil {
				t.Fatal(err)
			}
			if !e.b.Flushed(t.Context()) {
				t.Errorf("%s, %s: Flushed says no", f, tc.name)
			}
			e.b.opts.RebuildEvery = 1 // as the daemon: every full sync rebuilds
			// The full sync Flushed asks for fails: its retry counts the repair.
			e.fake.FailNext(syscall.ENOMEM)
			if _, err := e.b.Sync(t.Context(), &proxier.SyncRequest{Full: true, State: e.state, Node: e.node}); err == nil {
				t.Fatalf("%s, %s: the full sync did not fail", f, tc.name)
			}
			if res := e.sync(true); res.Repairs != 1 {
				t.Errorf("%s, %s: the retried full sync after it: %d repairs, want 1", f, tc.name, res.Repairs)
			}
			if e.b.Flushed(t.Context()) {
				t.Errorf("%s, %s: flushed after the full sync that rebuilt the table", f, tc.name)
			}
			if res := e.sync(true); res.Repairs != 0 {
				t.Errorf("%s, %s: a rebuild of an untouched table: %d repairs, want 0", f, tc.name, res.Repairs)
			}
			e.check(to(fromClient, cip(f, 10, 80), tcp)(f), dnatTo(true, both(f)...))
		}
	}
}
