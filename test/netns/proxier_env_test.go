//go:build netns

package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/dsproxy/dsproxy/internal/netnstest"
	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/conntrack"
	"github.com/dsproxy/dsproxy/pkg/endpointslice"
	"github.com/dsproxy/dsproxy/pkg/family"
	ipt "github.com/dsproxy/dsproxy/pkg/iptables"
	"github.com/dsproxy/dsproxy/pkg/ipvs"
	"github.com/dsproxy/dsproxy/pkg/nfacct"
	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/nodeport"
	"github.com/dsproxy/dsproxy/pkg/proxier"
	"github.com/dsproxy/dsproxy/pkg/proxier/iptables"
	ipvsbackend "github.com/dsproxy/dsproxy/pkg/proxier/ipvs"
	"github.com/dsproxy/dsproxy/pkg/proxier/nftables"
)

// This file runs the real proxy in the harness: both family proxiers (the generic
// proxier, the nftables backend and a netlink connection into the node namespace),
// fed with hand-built Services and EndpointSlices.

const (
	pxNodeName   = "node"        // the proxiers' node name; local endpoints carry it
	pxRemoteName = "remote-node" // node name of endpoints on the remote node
	pxSvcPort    = 80            // every test Service's port
	pxPodPort    = 8080          // the harness servers' port in pods (target port)
	// pxDropWait is how long a connection that must be dropped is given: a dropped
	// packet gets no answer at all, so anything that answers does so long before.
	pxDropWait = 400 * time.Millisecond
	// pxDialWait bounds dials that must succeed or be refused.
	pxDialWait = 3 * time.Second
	// pxServeWait bounds dials that must succeed: a served dial returns long
	// before, but under the emulated IPVS guest on a loaded host one SCTP dial in
	// a thousand lost every INIT of 3 s (load-spread, a CI run beside other tests).
	pxServeWait = 10 * time.Second
)

// pxServiceCIDR is the service range of f that the proxiers are told about:
// testaddr.Svc addresses (10.96.0.0/16, fd00:96::/112).
func pxServiceCIDR(f *family.Family) netip.Prefix {
	bits := 16
	if f == family.IPv6 {
		bits = 112
	}
	return testaddr.Prefix(testaddr.Svc(f, 0), bits)
}

// pxPodCIDRs are the harness's pod ranges, local and remote: the ClusterCIDR of the
// local-traffic detector.
var pxPodCIDRs = slices.Concat(LocalPodCIDRs, RemotePodCIDRs)

// svcSpec describes one test Service, dual-stack or single-stack.
type svcSpec struct {
	name string
	// n picks the ClusterIPs: testaddr.Svc(f, n) in each family.
	n    int
	fams []*family.Family // nil: both families
	typ  v1.ServiceType   // "" is ClusterIP
	// nodePort is the TCP NodePort; UDP gets nodePort+1 and SCTP nodePort+2.
	nodePort     int32
	etpLocal     bool
	extIP, lbIP  int  // testaddr.Ext indexes of an ExternalIP / a LoadBalancer VIP, 0 for none
	extNodeIP    bool // the node's IP is an ExternalIP
	sourceRanges []string
	affinity     bool
	eps          []*NS // endpoints; pods of the remote node are not local
	// extraPorts are more service ports (port → same target port) that endpoints
	// serve over TCP, e.g. an echo server.
	extraPorts []int32
	// noNodeName leaves the endpoints' nodeName unset (a hand-made slice).
	noNodeName bool
}

// pxFamily is one family's running proxier.
type pxFamily struct {
	f *family.Family
	p *proxier.Proxier
	// b is the nftables backend (nftables mode); ib the iptables one.
	b   *nftables.Backend
	ib  *iptables.Backend
	vb  *ipvsbackend.Backend
	nl  *nft.Netlink
	obs *syncRecorder
}

// The backends the harness runs, as --proxy-mode names them.
const (
	modeNFTables = "nftables"
	modeIPTables = "iptables"
	// modeIPTablesLegacy is the iptables backend over the legacy (x_tables)
	// binaries, as on a node whose kubelet uses them.
	modeIPTablesLegacy = "iptables-legacy"
	// modeIPVS needs a kernel with IPVS (hack/guest/run.sh boots one).
	modeIPVS = "ipvs"
)

// proxyModes are the modes whose scenarios the harness runs.
var proxyModes = []string{modeNFTables, modeIPTables, modeIPTablesLegacy, modeIPVS}

// iptFlavor is the iptables flavour of an iptables mode.
func iptFlavor(mode string) ipt.Flavor {
	if mode == modeIPTablesLegacy {
		return ipt.FlavorLegacy
	}
	return ipt.FlavorDefault
}

// iptCommand is the mode's iptables binary of f plus suffix ("-save").
func iptCommand(mode string, f *family.Family, suffix string) string {
	if mode == modeIPTablesLegacy {
		return f.IPTablesCommand + "-legacy" + suffix
	}
	return f.IPTablesCommand + suffix
}

// syncRecorder is a proxier.Observer keeping the last sync's result.
type syncRecorder struct {
	mu   sync.Mutex
	last proxier.SyncResult
}

func (r *syncRecorder) SyncDone(_ *family.Family, _ bool, _ time.Duration, res proxier.SyncResult, _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last = res
}

func (r *syncRecorder) result() proxier.SyncResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// proxyNode is a harness cluster whose node runs dsproxy for both families.
type proxyNode struct {
	t    *testing.T
	c    *Cluster
	reg  *nodeport.Registry
	sctp bool
	fam  map[*family.Family]*pxFamily
	mode string // modeNFTables, modeIPTables or modeIPTablesLegacy

	services map[string]*v1.Service
	slices   map[string]*discovery.EndpointSlice
	specs    map[string]svcSpec
}

// newProxyNode builds a cluster and starts both family proxiers in its node. The
// node gets default routes via the External namespace (a node's default gateway):
// without them, traffic to a service address has no route before the proxy's DNAT.
func newProxyNode(t *testing.T) *proxyNode {
	t.Helper()
	return newProxyNodeMode(t, modeNFTables)
}

// newProxyNodeMode is newProxyNode with the backend of mode.
func newProxyNodeMode(t *testing.T, mode string) *proxyNode {
	t.Helper()
	if mode == modeIPVS {
		netnstest.RequireIPVS(t)
	}
	if mode != modeNFTables {
		for _, f := range family.All {
			if _, err := exec.LookPath(iptCommand(mode, f, "-restore")); err != nil {
				t.Skipf("no %s: %v", iptCommand(mode, f, "-restore"), err)
			}
		}
	}
	c := New(t)
	e := &proxyNode{
		t: t, c: c, reg: nodeport.New(klog.Background()), mode: mode,
		sctp:     SCTPSupported(c.Node) == nil,
		fam:      map[*family.Family]*pxFamily{},
		services: map[string]*v1.Service{},
		slices:   map[string]*discovery.EndpointSlice{},
		specs:    map[string]svcSpec{},
	}
	ext0, err := c.Node.Netlink().LinkByName("ext0")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range family.All {
		gw := c.External.IP(f)
		r := &netlink.Route{LinkIndex: ext0.Attrs().Index, Dst: prefixToIPNet(f.AnyPrefix), Gw: net.IP(gw.AsSlice())}
		if err := c.Node.Netlink().RouteAdd(r); err != nil {
			t.Fatalf("node: default route via %s: %v", gw, err)
		}
	}
	for _, f := range family.All {
		e.fam[f] = e.startProxier(f)
	}
	e.sync(false)
	return e
}

// protos returns the protocols the kernel supports (SCTP only when it does).
func (e *proxyNode) protos() []Proto {
	if e.sctp {
		return []Proto{TCP, UDP, SCTP}
	}
	return []Proto{TCP, UDP}
}

// nodeAddrs lists the node namespace's addresses, for the NodePort address lister.
func (e *proxyNode) nodeAddrs() ([]netip.Addr, error) {
	addrs, err := e.c.Node.Netlink().AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(addrs))
	dummy := -1
	if l, err := e.c.Node.Netlink().LinkByName(ipvs.LinkName); err == nil {
		dummy = l.Attrs().Index
	}
	for _, a := range addrs {
		if a.LinkIndex == dummy {
			continue // the IPVS mode's Service addresses are not NodePort addresses
		}
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// startProxier builds a new proxier for f with a fresh netlink connection into the
// node, feeds it every object recorded so far and returns it without syncing.
func (e *proxyNode) startProxier(f *family.Family) *pxFamily {
	e.t.Helper()
	pf := &pxFamily{f: f, obs: &syncRecorder{}}
	var backend proxier.Backend
	switch e.mode {
	case modeIPTables, modeIPTablesLegacy:
		r, err := ipt.New(f, iptFlavor(e.mode))
		if err != nil {
			e.t.Fatalf("%s: %v", f, err)
		}
		// Three ports per transaction: full syncs here take the chunked path.
		if pf.ib, err = iptables.New(f, r, iptables.Options{MasqueradeBit: 14, LocalhostNodePorts: true, MaxPortsPerTx: 3,
			NFAcct: nfacct.NewAt(e.c.Node.Handle())}); err != nil {
			e.t.Fatalf("%s: %v", f, err)
		}
		backend = proxier.Within(pf.ib, func(fn func() error) error { return RunIn(e.c.Node, fn) })
	case modeIPVS:
		k, err := ipvs.Open(f, e.c.Node.Path(), true)
		if err != nil {
			e.t.Fatalf("%s: %v", f, err)
		}
		e.t.Cleanup(k.Close)
		r, err := ipt.New(f, ipt.FlavorDefault)
		if err != nil {
			e.t.Fatalf("%s: %v", f, err)
		}
		pf.vb = ipvsbackend.New(f, k, r, ipvsbackend.Options{MasqueradeBit: 14})
		backend = proxier.Within(pf.vb, func(fn func() error) error { return RunIn(e.c.Node, fn) })
	default:
		nl, err := nft.NewNetlink(nft.WithNetNSFd(int(e.c.Node.Handle())))
		if err != nil {
			e.t.Fatalf("%s: netlink into the node: %v", f, err)
		}
		e.t.Cleanup(func() { _ = nl.Close() })
		pf.nl, pf.b = nl, nftables.New(f, nl, nftables.Options{})
		backend = pf.b
	}
	var err error
	pf.p, err = proxier.New(proxier.Config{
		Family:    f,
		NodeName:  pxNodeName,
		Backend:   backend,
		NodePorts: e.reg,
		Addrs:     nodeport.AddrListerFunc(e.nodeAddrs),
		NodeIP:    e.c.Node.IP(f),
		Local:     proxier.LocalDetector{Mode: proxier.LocalModeClusterCIDR, CIDRs: pxPodCIDRs},
		Conntrack: conntrack.NewAt(e.c.Node.Handle()),
		Observer:  pf.obs,
	})
	if err != nil {
		e.t.Fatalf("%s: proxier: %v", f, err)
	}
	pf.p.OnServiceCIDRsChanged([]netip.Prefix{pxServiceCIDR(f)})
	for _, svc := range e.services {
		pf.p.OnServiceAdd(svc)
	}
	for _, es := range e.slices {
		if es.AddressType == f.AddressType {
			pf.p.OnEndpointSliceAdd(endpointslice.Ingest(es, pxNodeName))
		}
	}
	return pf
}

// fatalf fails the test with the node's state, Debug(node). When nft cannot print
// the ruleset (an nft binary that cannot decode a set's elements aborts; see
// TestProxierRulesetListable) the ruleset without set contents is added.
func (e *proxyNode) fatalf(t *testing.T, format string, args ...any) {
	t.Helper()
	dbg := Debug(e.c.Node)
	if e.mode != modeNFTables {
		for _, f := range family.All {
			out, err := Exec(e.c.Node, iptCommand(e.mode, f, "-save"))
			if err != nil {
				out += fmt.Sprintf("(%v)\n", err)
			}
			dbg += fmt.Sprintf("### %s: %s\n%s", e.c.Node.Name, iptCommand(e.mode, f, "-save"), out)
		}
	}
	if e.mode == modeIPVS {
		for _, cmd := range [][]string{{"cat", "/proc/net/ip_vs"}, {"ipset", "list"}, {"ip", "addr", "show", ipvs.LinkName}} {
			out, err := Exec(e.c.Node, cmd[0], cmd[1:]...)
			if err != nil {
				out += fmt.Sprintf("(%v)\n", err)
			}
			dbg += fmt.Sprintf("### %s: %s\n%s", e.c.Node.Name, strings.Join(cmd, " "), out)
		}
	}
	if _, err := Exec(e.c.Node, "nft", "list", "ruleset"); err != nil {
		terse, err := Exec(e.c.Node, "nft", "-t", "list", "ruleset")
		if err != nil {
			terse += fmt.Sprintf("(%v)\n", err)
		}
		dbg += fmt.Sprintf("### %s: nft -t list ruleset\n%s", e.c.Node.Name, terse)
	}
	t.Fatalf("%s\n%s", fmt.Sprintf(format, args...), dbg)
}

// expectNoRepairs runs a full sync of both families and fails if either found
// anything to repair (when says after what).
func (e *proxyNode) expectNoRepairs(t *testing.T, when string) {
	t.Helper()
	for f, res := range e.sync(true) {
		if res.Repairs != 0 {
			e.fatalf(t, "%s: full sync %s: %d repairs, want 0", f, when, res.Repairs)
		}
	}
}

// expectRepair is the second half of a drift test: what someone else did (named
// what) broke f's Service (broken says so), the next sync (full, or a check sync
// with nothing to do) reports repairs and the Service works again, and a full
// sync after that finds nothing more to repair.
func (e *proxyNode) expectRepair(t *testing.T, f *family.Family, what string, full bool,
	broken func(*testing.T, *family.Family, string), works func(*testing.T, *family.Family)) {
	t.Helper()
	broken(t, f, what)
	if res := e.syncFamily(f, full); res.Repairs == 0 {
		e.fatalf(t, "%s: sync (full=%v) after %s: 0 repairs", f, full, what)
	}
	works(t, f)
	if res := e.syncFamily(f, true); res.Repairs != 0 {
		e.fatalf(t, "%s: full sync after repairing %s: %d repairs", f, what, res.Repairs)
	}
	var fd proxier.FlushDetector
	switch pf := e.fam[f]; {
	case pf.b != nil:
		fd = pf.b
	case pf.vb != nil:
		fd = pf.vb
	case pf.ib != nil:
		fd = pf.ib
	}
	if fd != nil && e.flushed(t, fd) {
		e.fatalf(t, "%s: after repairing %s, the periodic check still wants a full sync", f, what)
	}
}

// flushed runs fd's periodic check in the node's namespace.
func (e *proxyNode) flushed(t *testing.T, fd proxier.FlushDetector) bool {
	t.Helper()
	var out bool
	if err := RunIn(e.c.Node, func() error { out = fd.Flushed(context.Background()); return nil }); err != nil {
		e.fatalf(t, "in the node: %v", err)
	}
	return out
}

// sync runs one sync of both families and returns their results.
func (e *proxyNode) sync(full bool) map[*family.Family]proxier.SyncResult {
	e.t.Helper()
	out := map[*family.Family]proxier.SyncResult{}
	for _, f := range family.All {
		out[f] = e.syncFamily(f, full)
	}
	return out
}

// syncFamily runs one sync of f's proxier and returns what the backend reported.
func (e *proxyNode) syncFamily(f *family.Family, full bool) proxier.SyncResult {
	e.t.Helper()
	pf := e.fam[f]
	if err := pf.p.Sync(context.Background(), full); err != nil {
		e.fatalf(e.t, "%s sync (full=%v): %v", f, full, err)
	}
	return pf.obs.result()
}

func (s svcSpec) families() []*family.Family {
	if s.fams == nil {
		return family.All
	}
	return s.fams
}

// nodePortOf returns the spec's NodePort for proto (0 for none).
func (s svcSpec) nodePortOf(p Proto) uint16 {
	if s.nodePort == 0 {
		return 0
	}
	return uint16(s.nodePort) + uint16(slices.Index(Protos, p))
}

func k8sProto(p Proto) v1.Protocol { return v1.Protocol(strings.ToUpper(string(p))) }

// service builds the Service of s.
func (e *proxyNode) service(s svcSpec) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "test", Name: s.name, CreationTimestamp: metav1.Unix(int64(1000+s.n), 0)},
		Spec:       v1.ServiceSpec{Type: s.typ},
	}
	if svc.Spec.Type == "" {
		svc.Spec.Type = v1.ServiceTypeClusterIP
	}
	for _, f := range s.families() {
		svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, testaddr.Svc(f, s.n).String())
		svc.Spec.IPFamilies = append(svc.Spec.IPFamilies, f.IPFamily)
		if s.extIP != 0 {
			svc.Spec.ExternalIPs = append(svc.Spec.ExternalIPs, testaddr.Ext(f, s.extIP).String())
		}
		if s.extNodeIP {
			svc.Spec.ExternalIPs = append(svc.Spec.ExternalIPs, e.c.Node.IP(f).String())
		}
		if s.lbIP != 0 {
			svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: testaddr.Ext(f, s.lbIP).String()})
		}
	}
	svc.Spec.ClusterIP = svc.Spec.ClusterIPs[0]
	if len(svc.Spec.IPFamilies) == 2 {
		svc.Spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicyRequireDualStack)
	} else {
		svc.Spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicySingleStack)
	}
	for _, p := range e.protos() {
		svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{
			Name: string(p), Protocol: k8sProto(p), Port: pxSvcPort,
			TargetPort: intstr.FromInt32(pxPodPort), NodePort: int32(s.nodePortOf(p)),
		})
	}
	for _, port := range s.extraPorts {
		svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{
			Name: fmt.Sprintf("extra-%d", port), Protocol: v1.ProtocolTCP, Port: port, TargetPort: intstr.FromInt32(port),
		})
	}
	if s.typ == v1.ServiceTypeNodePort || s.typ == v1.ServiceTypeLoadBalancer {
		svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
		if s.etpLocal {
			svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		}
	}
	svc.Spec.LoadBalancerSourceRanges = s.sourceRanges
	if s.affinity {
		svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		svc.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To(int32(600))}}
	}
	return svc
}

// slice builds the EndpointSlice of s in family f with endpoints eps.
func (e *proxyNode) slice(s svcSpec, f *family.Family, eps []*NS) *discovery.EndpointSlice {
	es := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "test", Name: s.name + "-" + strings.ToLower(f.Name),
			Labels: map[string]string{discovery.LabelServiceName: s.name}},
		AddressType: f.AddressType,
	}
	for _, p := range e.protos() {
		es.Ports = append(es.Ports, discovery.EndpointPort{Name: ptr.To(string(p)), Port: ptr.To(int32(pxPodPort)), Protocol: ptr.To(k8sProto(p))})
	}
	for _, port := range s.extraPorts {
		es.Ports = append(es.Ports, discovery.EndpointPort{Name: ptr.To(fmt.Sprintf("extra-%d", port)), Port: ptr.To(port), Protocol: ptr.To(v1.ProtocolTCP)})
	}
	for _, ep := range eps {
		node := pxNodeName
		if ep.Remote {
			node = pxRemoteName
		}
		e := discovery.Endpoint{
			Addresses:  []string{ep.IP(f).String()},
			Conditions: discovery.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(node),
		}
		if s.noNodeName {
			e.NodeName = nil
		}
		es.Endpoints = append(es.Endpoints, e)
	}
	return es
}

// apply records s (a new Service or a change of one) and hands it to both
// proxiers and the NodePort registry, as the daemon's handler does. It does not sync.
func (e *proxyNode) apply(s svcSpec) {
	svc := e.service(s)
	old := e.services[s.name]
	e.services[s.name] = svc
	e.specs[s.name] = s
	e.reg.Update(svc)
	for _, f := range family.All {
		if old == nil {
			e.fam[f].p.OnServiceAdd(svc)
		} else {
			e.fam[f].p.OnServiceUpdate(old, svc)
		}
	}
	for _, f := range s.families() {
		es := e.slice(s, f, s.eps)
		if oldES := e.slices[es.Name]; oldES != nil {
			e.fam[f].p.OnEndpointSliceUpdate(endpointslice.Ingest(oldES, pxNodeName), endpointslice.Ingest(es, pxNodeName))
		} else {
			e.fam[f].p.OnEndpointSliceAdd(endpointslice.Ingest(es, pxNodeName))
		}
		e.slices[es.Name] = es
	}
}

// dial dials and fails the test with the node's state on error.
func (e *proxyNode) dial(t *testing.T, from *NS, p Proto, dst netip.AddrPort) Reply {
	t.Helper()
	r, err := Dial(from, p, dst, pxServeWait)
	if err != nil {
		e.fatalf(t, "%s %s -> %s: %v", p, from, dst, err)
	}
	return r
}

// expectServed dials once and checks the server is one of servers and the observed
// source address is src.
func (e *proxyNode) expectServed(t *testing.T, from *NS, p Proto, dst netip.AddrPort, src netip.Addr, servers ...*NS) Reply {
	t.Helper()
	r := e.dial(t, from, p, dst)
	if !slices.ContainsFunc(servers, func(n *NS) bool { return n.Name == r.Server }) {
		e.fatalf(t, "%s %s -> %s: answered by %s, want one of %v", p, from, dst, r.Server, servers)
	}
	if r.ObservedSrc.Addr() != src {
		e.fatalf(t, "%s %s -> %s: %s observed source %s, want %s", p, from, dst, r.Server, r.ObservedSrc, src)
	}
	return r
}

// expectRefused checks that dst refuses quickly (TCP reset or ICMP port
// unreachable in under a second).
func (e *proxyNode) expectRefused(t *testing.T, from *NS, p Proto, dst netip.AddrPort) {
	t.Helper()
	start := time.Now()
	r, err := Dial(from, p, dst, pxDialWait)
	took := time.Since(start)
	switch {
	case err == nil:
		e.fatalf(t, "%s %s -> %s: answered (%v), want refused", p, from, dst, r)
	case p == SCTP && (IsTimeout(err) || IsRefused(err)):
		// Linux SCTP takes an ICMP port unreachable for its INIT as a hard error
		// only when the socket is not locked as it arrives (IP_RECVERR set);
		// otherwise it notices at an INIT retransmission (3 s), if the dial
		// waits that long. Seen with every backend on the guest kernel. So a
		// refusal, however late, or a timeout is what "refused" looks like.
	case !IsRefused(err):
		e.fatalf(t, "%s %s -> %s: %v, want refused", p, from, dst, err)
	case took > time.Second:
		e.fatalf(t, "%s %s -> %s: refused after %v, want < 1s", p, from, dst, took)
	}
}

// expectDropped checks that dst does not answer at all within pxDropWait.
func (e *proxyNode) expectDropped(t *testing.T, from *NS, p Proto, dst netip.AddrPort) {
	t.Helper()
	r, err := Dial(from, p, dst, pxDropWait)
	switch {
	case err == nil:
		e.fatalf(t, "%s %s -> %s: answered (%v), want dropped", p, from, dst, r)
	case !IsTimeout(err):
		e.fatalf(t, "%s %s -> %s: %v, want a timeout (dropped)", p, from, dst, err)
	}
}

// expectRefusedFromNode is expectRefused for a client on the node itself. A UDP
// datagram that the node's own output hook rejects never leaves: the kernel
// fails the send with EPERM, so that is what "refused" looks like there
// (kube-proxy's rules behave the same); TCP still gets its reset, and SCTP, whose
// connect sends its INIT asynchronously, its ICMP error or ABORT. The IPVS mode,
// whose Service addresses are the node's own, rejects in its output hook too.
func (e *proxyNode) expectRefusedFromNode(t *testing.T, p Proto, dst netip.AddrPort) {
	t.Helper()
	if p != UDP {
		e.expectRefused(t, e.c.Node, p, dst)
		return
	}
	e.expectLocalSendBlocked(t, p, dst)
}

// expectDroppedFromNode is expectDropped for a client on the node itself; as in
// expectRefusedFromNode, a datagram dropped by the output hook fails with EPERM
// (a dropped SCTP INIT, sent asynchronously, is a timeout).
func (e *proxyNode) expectDroppedFromNode(t *testing.T, p Proto, dst netip.AddrPort) {
	t.Helper()
	if p != UDP {
		e.expectDropped(t, e.c.Node, p, dst)
		return
	}
	e.expectLocalSendBlocked(t, p, dst)
}

func (e *proxyNode) expectLocalSendBlocked(t *testing.T, p Proto, dst netip.AddrPort) {
	t.Helper()
	r, err := Dial(e.c.Node, p, dst, pxDropWait)
	switch {
	case err == nil:
		e.fatalf(t, "%s node -> %s: answered (%v), want the send blocked by the output hook", p, dst, r)
	case !errors.Is(err, syscall.EPERM):
		e.fatalf(t, "%s node -> %s: %v, want EPERM (send blocked by the output hook)", p, dst, err)
	}
}

// serveEcho starts a TCP echo server on port in each namespace, for long-lived
// connections (the harness servers answer once and close).
func serveEcho(t *testing.T, port uint16, nss ...*NS) {
	t.Helper()
	for _, n := range nss {
		var lns []net.Listener
		err := RunIn(n, func() error {
			for _, network := range []string{"tcp4", "tcp6"} {
				addr := fmt.Sprintf("0.0.0.0:%d", port)
				if network == "tcp6" {
					addr = fmt.Sprintf("[::]:%d", port)
				}
				ln, err := net.Listen(network, addr)
				if err != nil {
					return err
				}
				lns = append(lns, ln)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s: echo server: %v", n, err)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		var conns []net.Conn
		for _, ln := range lns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					mu.Lock()
					conns = append(conns, c)
					mu.Unlock()
					wg.Add(1)
					go func() {
						defer wg.Done()
						buf := make([]byte, 4096)
						for {
							k, err := c.Read(buf)
							if err != nil {
								return
							}
							if _, err := c.Write(buf[:k]); err != nil {
								return
							}
						}
					}()
				}
			}()
		}
		t.Cleanup(func() {
			for _, ln := range lns {
				ln.Close()
			}
			mu.Lock()
			for _, c := range conns {
				c.Close()
			}
			mu.Unlock()
			wg.Wait()
		})
	}
}

// openConn opens a connection from inside ns (the socket stays in ns and may be
// used from any goroutine).
func openConn(from *NS, network string, dst netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	err := RunIn(from, func() error {
		var err error
		c, err = net.DialTimeout(network, dst.String(), pxDialWait)
		return err
	})
	return c, err
}
