package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/nodeport"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

const (
	tcp  = 6
	udp  = 17
	sctp = 132
	// podIface is the bridge local pods' packets come in on.
	podIface = "cbr0"
)

var protoNames = map[uint8]v1.Protocol{tcp: v1.ProtocolTCP, udp: v1.ProtocolUDP, sctp: v1.ProtocolSCTP}

const thisNode = "node-1"

// svcOpt modifies a test service port.
type svcOpt func(f *family.Family, sp *model.ServicePort)

// svc returns a service port "ns/name:p/proto" on ClusterIP Svc(n):port.
func svc(f *family.Family, name string, n int, port uint16, proto uint8, opts ...svcOpt) *model.ServicePort {
	sp := &model.ServicePort{
		Name:      model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: name}, Port: "p", Protocol: protoNames[proto]},
		ClusterIP: testaddr.Svc(f, n),
		Port:      port,
		Protocol:  protoNames[proto],
	}
	for _, o := range opts {
		o(f, sp)
	}
	return sp
}

func nodePort(p uint16) svcOpt {
	return func(_ *family.Family, sp *model.ServicePort) { sp.NodePort = p }
}
func externalIP(n int) svcOpt {
	return func(f *family.Family, sp *model.ServicePort) {
		sp.ExternalIPs = append(sp.ExternalIPs, testaddr.Ext(f, n))
	}
}
func lbVIP(n int) svcOpt {
	return func(f *family.Family, sp *model.ServicePort) {
		sp.LoadBalancerVIPs = append(sp.LoadBalancerVIPs, testaddr.Ext(f, n))
	}
}
func sourceRange(client, bits int) svcOpt {
	return func(f *family.Family, sp *model.ServicePort) {
		b := bits
		if f.BitLen == 128 {
			b += 96
		}
		sp.SourceRanges = append(sp.SourceRanges, testaddr.Prefix(testaddr.Client(f, client), b))
	}
}
func etpLocal() svcOpt {
	return func(_ *family.Family, sp *model.ServicePort) { sp.ExternalPolicyLocal = true }
}
func itpLocal() svcOpt {
	return func(_ *family.Family, sp *model.ServicePort) { sp.InternalPolicyLocal = true }
}
func affinity(sec uint32) svcOpt {
	return func(_ *family.Family, sp *model.ServicePort) { sp.AffinitySeconds = sec }
}

// ep is pod n serving port; local says it runs on this node.
func ep(f *family.Family, n int, port uint16, local bool) model.Endpoint {
	return model.Endpoint{Addr: testaddr.Pod(f, n), Port: port, Ready: true, Serving: true, Local: local}
}

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// env is one backend over a Fake, with the desired state the tests edit.
type env struct {
	t     *testing.T
	f     *family.Family
	fake  *nft.Fake
	b     *Backend
	state *model.State
	node  *proxier.NodeConfig
	eps   map[model.ServicePortName][]model.Endpoint
}

func newEnv(t testing.TB, f *family.Family) *env {
	tt, _ := t.(*testing.T)
	fake := nft.NewFake()
	return &env{
		t: tt, f: f, fake: fake, b: New(f, fake, Options{}),
		state: model.NewState(),
		node:  defaultNode(f),
		eps:   map[model.ServicePortName][]model.Endpoint{},
	}
}

func defaultNode(f *family.Family) *proxier.NodeConfig {
	bits := 16
	if f.BitLen == 128 {
		bits = 112
	}
	return &proxier.NodeConfig{
		Family:            f,
		NodeIP:            testaddr.Node(f, 1),
		NodePortAddresses: nodeport.Addresses{Family: f, MatchAll: true, Addrs: []netip.Addr{testaddr.Node(f, 1)}},
		ServiceCIDRs:      []netip.Prefix{testaddr.Prefix(testaddr.Svc(f, 0), bits)},
		Local:             proxier.LocalDetector{Mode: proxier.LocalModeClusterCIDR, CIDRs: []netip.Prefix{testaddr.PodCIDR(f)}},
	}
}

// put sets a service port and its endpoints and returns its name.
func (e *env) put(sp *model.ServicePort, eps ...model.Endpoint) model.ServicePortName {
	e.eps[sp.Name] = eps
	e.state.Ports[sp.Name] = &model.PortState{ServicePort: sp, Selection: model.Categorize(sp, eps, model.NodeInfo{Name: thisNode})}
	return sp.Name
}

func (e *env) del(name model.ServicePortName) {
	delete(e.state.Ports, name)
	delete(e.eps, name)
}

// sync runs one sync and fails the test on error.
func (e *env) sync(full bool, changed ...model.ServicePortName) SyncResult {
	e.t.Helper()
	res, err := e.b.Sync(context.Background(), &proxier.SyncRequest{Full: full, State: e.state, Changed: changed, Node: e.node})
	if err != nil {
		e.t.Fatalf("%s sync: %v", e.f, err)
	}
	return res
}

func (e *env) tnode() nft.Node {
	return nft.Node{LocalAddrs: []netip.Addr{testaddr.Node(e.f, 1)}}
}

// outcome is what a test expects of a packet.
type outcome struct {
	verdict nft.Verdict
	// dnat: the set of possible DNAT destinations (nil: not DNATed).
	dnat []netip.AddrPort
	masq bool
	// tcpReset: a reject must be a TCP reset (else ICMP port unreachable).
	tcpReset bool
}

func (o outcome) String() string {
	return fmt.Sprintf("%s dnat=%v masq=%v tcpReset=%v", o.verdict, o.dnat, o.masq, o.tcpReset)
}

// check traces p through every numgen outcome and compares with want.
func (e *env) check(p nft.Packet, want outcome) {
	e.t.Helper()
	res, err := e.fake.TraceAll(e.tnode(), p)
	if err != nil {
		e.t.Fatalf("trace %v -> %v: %v", p.Src, p.Dst, err)
	}
	got := outcome{verdict: res[0].Verdict, masq: res[0].Masquerade}
	for _, r := range res {
		if r.DNAT.IsValid() && !slices.Contains(got.dnat, r.DNAT) {
			got.dnat = append(got.dnat, r.DNAT)
		}
		if r.Verdict != got.verdict || r.Masquerade != got.masq {
			got.verdict = -1
		}
		if r.Verdict == nft.Reject && r.RejectType == 1 { // NFT_REJECT_TCP_RST
			got.tcpReset = true
		}
	}
	if got.verdict == nft.Reject && !got.tcpReset && res[0].RejectCode != e.f.ICMPRejectCode {
		e.t.Errorf("reject code %d, want %d", res[0].RejectCode, e.f.ICMPRejectCode)
	}
	slices.SortFunc(got.dnat, netip.AddrPort.Compare)
	slices.SortFunc(want.dnat, netip.AddrPort.Compare)
	if got.String() != want.String() {
		var tr []string
		for _, r := range res {
			tr = append(tr, strings.Join(r.Trace, "\n    "))
		}
		e.t.Errorf("%s %v -> %v proto %d:\n got  %s\n want %s\ntrace:\n    %s\nruleset:\n%s", e.f, p.Src, p.Dst, p.Proto, got, want,
			strings.Join(tr, "\n  ---\n    "), e.fake.Dump(e.f))
	}
}

// Packet sources.
type source func(f *family.Family) nft.Packet

// fromClient is an outside client arriving on eth0.
func fromClient(f *family.Family) nft.Packet {
	return nft.Packet{Family: f, Src: ap(testaddr.Client(f, 1), 40000), Origin: nft.OriginInbound, InIface: "eth0"}
}

// fromPod is local pod n arriving on the bridge.
func fromPod(n int) source {
	return func(f *family.Family) nft.Packet {
		return nft.Packet{Family: f, Src: ap(testaddr.Pod(f, n), 40000), Origin: nft.OriginInbound, InIface: podIface}
	}
}

// fromRemotePod is pod n of another node (inside the cluster CIDR) arriving on
// eth0.
func fromRemotePod(n int) source {
	return func(f *family.Family) nft.Packet {
		return nft.Packet{Family: f, Src: ap(testaddr.Pod(f, n), 40000), Origin: nft.OriginInbound, InIface: "eth0"}
	}
}

// fromNode is a process on the node.
func fromNode(f *family.Family) nft.Packet {
	return nft.Packet{Family: f, Src: ap(testaddr.Node(f, 1), 40000), Origin: nft.OriginLocal, OutIface: "eth0"}
}

func to(src source, dst netip.AddrPort, proto uint8) source {
	return func(f *family.Family) nft.Packet {
		p := src(f)
		p.Dst, p.Proto = dst, proto
		return p
	}
}

func syncAll(e *env) *proxier.SyncRequest {
	return &proxier.SyncRequest{Full: true, State: e.state, Node: e.node}
}

func syncChanged(e *env, names ...model.ServicePortName) *proxier.SyncRequest {
	return &proxier.SyncRequest{State: e.state, Node: e.node, Changed: names}
}
