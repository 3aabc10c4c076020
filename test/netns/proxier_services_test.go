//go:build netns

package netns

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/family"
)

// servicesFixture is the cluster of TestProxierServices: local pods a, b, c, a
// client pod that is no endpoint, a remote pod r, and the Services below.
type servicesFixture struct {
	*proxyNode
	a, b, cc, client, r *NS
	u                   *NS // only in a slice that names no node for it
	svc                 map[string]svcSpec
}

func newServicesFixture(t *testing.T, mode string) *servicesFixture {
	e := newProxyNodeMode(t, mode)
	x := &servicesFixture{proxyNode: e, svc: map[string]svcSpec{}}
	x.a, x.b, x.cc = e.c.AddPod("pod-a"), e.c.AddPod("pod-b"), e.c.AddPod("pod-c")
	x.client = e.c.AddPod("client")
	x.r = e.c.AddRemotePod("pod-r")
	x.u = e.c.AddPod("pod-u")
	for _, n := range []*NS{x.a, x.b, x.cc, x.r, x.u} {
		for _, p := range e.protos() {
			n.Serve(p, pxPodPort)
		}
	}
	v4, v6 := []*family.Family{family.IPv4}, []*family.Family{family.IPv6}
	specs := []svcSpec{
		// Dual-stack NodePort Service, externalTrafficPolicy Cluster.
		{name: "web", n: 10, typ: v1.ServiceTypeNodePort, nodePort: 30010, eps: []*NS{x.a, x.b, x.cc}},
		// Only pod-a: pod-a reaching itself through it is hairpin traffic.
		{name: "self", n: 11, eps: []*NS{x.a}},
		// The same for pod-u, in a slice that names no node for it (hand-made).
		{name: "self-unnamed", n: 20, eps: []*NS{x.u}, noNodeName: true},
		// ETP Local with a local and a remote endpoint.
		{name: "local", n: 12, typ: v1.ServiceTypeNodePort, nodePort: 30020, etpLocal: true, eps: []*NS{x.a, x.r}},
		// Only remote endpoints: ETP Local has none on this node, ETP Cluster uses them.
		{name: "remote-local", n: 13, typ: v1.ServiceTypeNodePort, nodePort: 30030, etpLocal: true, eps: []*NS{x.r}},
		{name: "remote-cluster", n: 14, typ: v1.ServiceTypeNodePort, nodePort: 30040, eps: []*NS{x.r}},
		// ExternalIP and LoadBalancer VIP; only the External namespace's range may use the VIP.
		{name: "lb", n: 15, typ: v1.ServiceTypeLoadBalancer, nodePort: 30050, extIP: 1, lbIP: 2,
			sourceRanges: []string{ExternalCIDRs[0].String(), ExternalCIDRs[1].String()}, eps: []*NS{x.a, x.b}},
		{name: "sticky", n: 16, affinity: true, eps: []*NS{x.a, x.b, x.cc}},
		{name: "empty", n: 17, typ: v1.ServiceTypeNodePort, nodePort: 30070},
		// Single-stack NodePort Services: their NodePorts are reserved on the other family.
		{name: "v4only", n: 18, fams: v4, typ: v1.ServiceTypeNodePort, nodePort: 30080, eps: []*NS{x.a}},
		{name: "v6only", n: 19, fams: v6, typ: v1.ServiceTypeNodePort, nodePort: 30090, eps: []*NS{x.b}},
		// An ExternalIP that is the node's IP, at the port (TCP) that an ETP Local
		// Service has for NodePort.
		{name: "ext-at-node", n: 21, extNodeIP: true, eps: []*NS{x.b, x.cc}},
		{name: "np-at-80", n: 22, typ: v1.ServiceTypeNodePort, nodePort: pxSvcPort, etpLocal: true, eps: []*NS{x.a, x.r}},
	}
	for _, s := range specs {
		x.svc[s.name] = s
		e.apply(s)
	}
	// A host process in the node listens on the single-stack Services' NodePorts on
	// both families: only the NodePort reservation keeps the other family off it.
	for _, name := range []string{"v4only", "v6only"} {
		for _, p := range e.protos() {
			e.c.Node.Serve(p, x.svc[name].nodePortOf(p))
		}
	}
	// Routes for the ExternalIPs and VIPs inside External (its default route already
	// points at the node; these make the intent explicit).
	err := RunIn(e.c.External, func() error {
		for _, f := range family.All {
			dst := testaddr.Prefix(testaddr.Ext(f, 0), map[int]int{32: 24, 128: 64}[f.BitLen])
			gw := e.c.Node.IP(f)
			if err := netlink.RouteReplace(&netlink.Route{Dst: prefixToIPNet(dst), Gw: net.IP(gw.AsSlice())}); err != nil {
				return fmt.Errorf("external: route %s via %s: %w", dst, gw, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	e.sync(false)
	return x
}

func (x *servicesFixture) vip(name string, f *family.Family) netip.AddrPort {
	return netip.AddrPortFrom(testaddr.Svc(f, x.svc[name].n), pxSvcPort)
}

func (x *servicesFixture) nodePort(name string, f *family.Family, p Proto) netip.AddrPort {
	return netip.AddrPortFrom(x.c.Node.IP(f), x.svc[name].nodePortOf(p))
}

// proxierScenarios is the table run over both families and every protocol.
var proxierScenarios = []struct {
	name string
	run  func(t *testing.T, x *servicesFixture, f *family.Family, p Proto)
}{
	{"ClusterIP/from-node", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		x.expectServed(t, x.c.Node, p, x.vip("web", f), x.c.Node.IP(f), x.a, x.b, x.cc)
	}},
	{"ClusterIP/from-pod-no-snat", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		x.expectServed(t, x.client, p, x.vip("web", f), x.client.IP(f), x.a, x.b, x.cc)
	}},
	{"ClusterIP/hairpin-masquerade", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		x.expectServed(t, x.a, p, x.vip("self", f), x.c.Node.IP(f), x.a)
	}},
	{"ClusterIP/hairpin-masquerade-without-node-name", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		// kube-proxy's nftables and iptables modes masquerade every endpoint
		// reaching itself; its IPVS mode only those on its node (KUBE-LOOP-BACK).
		if x.mode == modeIPVS {
			t.Skip("IPVS mode masquerades only endpoints named on this node reaching themselves, as kube-proxy's")
		}
		x.expectServed(t, x.u, p, x.vip("self-unnamed", f), x.c.Node.IP(f), x.u)
	}},
	{"ClusterIP/load-spread", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		seen := map[string]int{}
		for range 40 {
			seen[x.expectServed(t, x.client, p, x.vip("web", f), x.client.IP(f), x.a, x.b, x.cc).Server]++
		}
		if len(seen) < 2 {
			x.fatalf(t, "40 connections reached only %v, want at least 2 of 3 endpoints", seen)
		}
	}},
	{"NodePort/cluster-masquerade", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		x.expectServed(t, x.c.External, p, x.nodePort("web", f, p), x.c.Node.IP(f), x.a, x.b, x.cc)
	}},
	{"NodePort/local-preserves-source", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		for range 10 {
			x.expectServed(t, x.c.External, p, x.nodePort("local", f, p), x.c.External.IP(f), x.a)
		}
	}},
	{"NodePort/local-remote-only-dropped", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		x.expectDropped(t, x.c.External, p, x.nodePort("remote-local", f, p))
	}},
	{"NodePort/cluster-remote-endpoint", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		x.expectServed(t, x.c.External, p, x.nodePort("remote-cluster", f, p), x.c.Node.IP(f), x.r)
	}},
	{"NodePort/local-short-circuit-remote-hairpin", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		// A pod on another node (inside the cluster CIDR, so short-circuited to
		// the cluster endpoints, unmasqueraded) reaches this node's ETP Local
		// NodePort and is sent to itself: without the hairpin masquerade its
		// reply never passes back through this node, as kube-proxy's endpoint
		// chains masquerade it. IPVS mode has no short-circuit for NodePorts
		// (as kube-proxy's): it drops there (NodePort/local-remote-only-dropped).
		if x.mode == modeIPVS {
			t.Skip("IPVS mode drops ETP Local NodePort traffic without local endpoints")
		}
		x.expectServed(t, x.r, p, x.nodePort("remote-local", f, p), x.c.Node.IP(f), x.r)
	}},
	{"ExternalIP/from-external", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		x.expectServed(t, x.c.External, p, netip.AddrPortFrom(testaddr.Ext(f, 1), pxSvcPort), x.c.Node.IP(f), x.a, x.b)
	}},
	{"ExternalIP/node-IP-at-another-NodePort", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		// As in kube-proxy, whose ExternalIPs come before its NodePorts: the
		// ExternalIP's Service serves it, from outside, from local pods (which
		// the NodePort's ETP Local would short-circuit) and from the node.
		if p != TCP {
			t.Skip("only the TCP NodePort is at the ExternalIP's port")
		}
		if x.mode == modeIPVS {
			t.Skip("IPVS has one virtual server for both; kube-proxy's IPVS mode gives it to either")
		}
		dst := netip.AddrPortFrom(x.c.Node.IP(f), pxSvcPort)
		if got := x.svc["np-at-80"].nodePortOf(p); got != dst.Port() {
			x.fatalf(t, "np-at-80's NodePort is %d, want %d", got, dst.Port())
		}
		x.expectServed(t, x.c.External, p, dst, x.c.Node.IP(f), x.b, x.cc)
		x.expectServed(t, x.client, p, dst, x.c.Node.IP(f), x.b, x.cc)
		x.expectServed(t, x.c.Node, p, dst, x.c.Node.IP(f), x.b, x.cc)
	}},
	{"LoadBalancer/allowed-source", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		x.expectServed(t, x.c.External, p, netip.AddrPortFrom(testaddr.Ext(f, 2), pxSvcPort), x.c.Node.IP(f), x.a, x.b)
	}},
	{"LoadBalancer/other-source-dropped", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		// loadBalancerSourceRanges guard the VIP only (as in kube-proxy): the client
		// pod is outside them and is dropped at the VIP...
		x.expectDropped(t, x.client, p, netip.AddrPortFrom(testaddr.Ext(f, 2), pxSvcPort))
		// ...while the ExternalIP of the same Service stays open to it.
		x.dial(t, x.client, p, netip.AddrPortFrom(testaddr.Ext(f, 1), pxSvcPort))
	}},
	{"Affinity/ClientIP-sticks", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		seen := map[string]int{}
		for range 20 {
			seen[x.expectServed(t, x.client, p, x.vip("sticky", f), x.client.IP(f), x.a, x.b, x.cc).Server]++
		}
		if len(seen) != 1 {
			x.fatalf(t, "ClientIP affinity: 20 connections from one client reached %v, want one endpoint", seen)
		}
	}},
	{"Affinity/ClientIP-survives-full-sync", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		// The daemon's hourly full sync (in nftables mode a rebuild of the table
		// under its other name) keeps the client on its endpoint. The harness's
		// nftables backend rebuilds at every 12th full sync (the daemon's at each).
		first := x.expectServed(t, x.client, p, x.vip("sticky", f), x.client.IP(f), x.a, x.b, x.cc).Server
		syncs := 1
		if x.mode == modeNFTables {
			syncs = 12
		}
		for range syncs {
			x.syncFamily(f, true)
		}
		for range 10 {
			if got := x.expectServed(t, x.client, p, x.vip("sticky", f), x.client.IP(f), x.a, x.b, x.cc).Server; got != first {
				x.fatalf(t, "ClientIP affinity: the client reached %s after a full sync, %s before", got, first)
			}
		}
	}},
	{"NoEndpoints/ClusterIP-refused", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		x.expectRefused(t, x.client, p, x.vip("empty", f))
		x.expectRefusedFromNode(t, p, x.vip("empty", f))
	}},
	{"NoEndpoints/NodePort-refused", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		x.expectRefused(t, x.c.External, p, x.nodePort("empty", f, p))
	}},
	{"ClusterIP/unknown-port-refused", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		x.expectRefused(t, x.client, p, netip.AddrPortFrom(testaddr.Svc(f, x.svc["web"].n), pxSvcPort+1))
	}},
	{"ServiceCIDR/unallocated-dropped", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		x.expectDropped(t, x.client, p, netip.AddrPortFrom(testaddr.Svc(f, 200), pxSvcPort))
		x.expectDroppedFromNode(t, p, netip.AddrPortFrom(testaddr.Svc(f, 200), pxSvcPort))
	}},
	{"SingleStack/own-family-works", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		name, ep := "v4only", x.a
		if f == family.IPv6 {
			name, ep = "v6only", x.b
		}
		x.expectServed(t, x.client, p, x.vip(name, f), x.client.IP(f), ep)
		x.expectServed(t, x.c.External, p, x.nodePort(name, f, p), x.c.Node.IP(f), ep)
	}},
	{"SingleStack/NodePort-reserved-on-other-family", func(t *testing.T, x *servicesFixture, f *family.Family, p Proto) {
		// The other family's single-stack Service owns this NodePort: the node's own
		// listener on it must not be reachable on this family.
		other := "v6only"
		if f == family.IPv6 {
			other = "v4only"
		}
		x.expectRefused(t, x.c.External, p, x.nodePort(other, f, p))
	}},
}

// TestProxierServices runs the scenario table over both families and every
// protocol the kernel supports, against both family proxiers running in the node,
// once per backend (nftables, iptables).
func TestProxierServices(t *testing.T) {
	for _, mode := range proxyModes {
		t.Run(mode, func(t *testing.T) { testProxierServices(t, mode) })
	}
}

func testProxierServices(t *testing.T, mode string) {
	x := newServicesFixture(t, mode)
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			for _, sc := range proxierScenarios {
				t.Run(sc.name, func(t *testing.T) {
					for _, p := range Protos {
						t.Run(string(p), func(t *testing.T) {
							if p == SCTP && !x.sctp {
								SkipSCTP(t, SCTPSupported(x.c.Node))
							}
							sc.run(t, x, f, p)
						})
					}
				})
			}
		})
	}
	// The kernel holds what the backends believe: a full sync repairs nothing.
	x.expectNoRepairs(t, "after the scenarios")
}
