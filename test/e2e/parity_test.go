//go:build e2e && netns

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/dsproxy/dsproxy/test/netns"
)

// parityProbe is one connection of the KubeProxyParity matrix.
type parityProbe struct {
	name   string // "<Service> <target> from <source>"
	from   *netns.NS
	proto  netns.Proto
	dst    netip.AddrPort
	sticky bool // ClientIP affinity: the outcome says whether one server answered all
}

func (p parityProbe) key() string { return fmt.Sprintf("%s %s %s", p.name, p.proto, p.dst.Addr()) }

// parityOutcome is what a probe's dials saw: the servers that answered, the
// source each saw (classified), and the failures by kind.
type parityOutcome struct {
	servers, srcs map[string]bool
	fails         map[string]bool // "refused", "dropped", or the error
	dials         int
}

func (o parityOutcome) String() string {
	var parts []string
	if len(o.servers) > 0 {
		parts = append(parts, fmt.Sprintf("served by %s, source %s", strings.Join(slices.Sorted(maps.Keys(o.servers)), ","),
			strings.Join(slices.Sorted(maps.Keys(o.srcs)), ",")))
	}
	parts = append(parts, slices.Sorted(maps.Keys(o.fails))...)
	return strings.Join(parts, "; ")
}

// covers reports whether o has seen everything want saw.
func (o parityOutcome) covers(want parityOutcome) bool {
	for _, m := range [][2]map[string]bool{{o.servers, want.servers}, {o.srcs, want.srcs}, {o.fails, want.fails}} {
		for k := range m[1] {
			if !m[0][k] {
				return false
			}
		}
	}
	return true
}

// parityFixture is the Services and pods of KubeProxyParity.
type parityFixture struct {
	e       *env
	remote  *netns.NS // the pod on the remote node
	nodeIPs map[netip.Addr]bool
	probes  []parityProbe
	health  []healthProbe
}

// healthProbe is a GET of a health check node port.
type healthProbe struct {
	from *netns.NS
	dst  netip.AddrPort
}

func (h healthProbe) String() string { return fmt.Sprintf("http://%s/ from %s", h.dst, h.from) }

// testKubeProxyParity runs the real kube-proxy v1.36 as the oracle: the same
// Services (traffic policies Local with local and remote endpoints, on
// NodePorts, ExternalIPs and load-balancer IPs, trafficDistribution across zones, no endpoints, unready,
// publishNotReadyAddresses and only terminating endpoints, ExternalIPs,
// load-balancer IPs with source ranges and with ipMode Proxy, ClientIP
// affinity, hairpin, another proxy's Service, unknown ports, unallocated
// ServiceCIDR addresses, localhost NodePorts) are probed over TCP and UDP on
// both families from the node, a pod and outside, first through kube-proxy
// and then through dsproxy in the same mode, for the iptables and nftables
// modes, each also with masqueradeAll. Every probe must end the same way: served by the same endpoints with
// the same source address seen, refused, or dropped. The health check node
// ports must answer alike (status, body, headers, or a refused connection), on
// the node IPs from outside and on loopback from the node, for dual-stack and
// single-stack Services on both families. DSPROXY_E2E_PARITY_LOG=1
// logs every outcome.
func testKubeProxyParity(t *testing.T, e *env) {
	kubeProxyParity(t, e, "iptables", "nftables", "iptables+masquerade-all", "nftables+masquerade-all")
}

// parityOptions are the settings a run may add to a mode ("nftables+masquerade-all"):
// kube-proxy's configuration fields (v1alpha1: masqueradeAll is read from the
// section of the mode) and dsproxy's flag for each.
var parityOptions = map[string]struct{ config, flag string }{
	"masquerade-all": {"iptables:\n  masqueradeAll: true\nnftables:\n  masqueradeAll: true\n", "--masquerade-all"},
}

// kubeProxyParity compares kube-proxy and dsproxy in each of runs: a mode, or a
// mode and an option joined by "+" (parityOptions).
func kubeProxyParity(t *testing.T, e *env, runs ...string) {
	x := newParityFixture(t, e)
	t.Logf("%d probes per proxy, %d health check URLs", len(x.probes), len(x.health))
	kpOuts, dsOuts := map[string]map[string]parityOutcome{}, map[string]map[string]parityOutcome{}
	skip := map[string]bool{} // run + "iptables-save" or "ip6tables-save": that family is not compared
	for _, run := range runs {
		mode, optName, _ := strings.Cut(run, "+")
		opt, ok := parityOptions[optName]
		if optName != "" && !ok {
			t.Fatalf("unknown parity option %q", optName)
		}
		// kube-proxy alone.
		if err := e.cur().stop(); err != nil {
			e.fatalf(t, "stopping dsproxy: %v", err)
		}
		if out, err := netns.Exec(e.c.Node, e.bin, "--cleanup"); err != nil {
			e.fatalf(t, "dsproxy --cleanup: %v\n%s", err, out)
		}
		if out, err := netns.Exec(e.c.Node, "conntrack", "-F"); err != nil {
			e.fatalf(t, "conntrack -F: %v\n%s", err, out)
		}
		kp := startKubeProxyConfig(t, e, mode, opt.config)
		// In IPVS mode its IPv6 is checked below.
		x.waitServing(t, "kube-proxy "+run, func(a netip.Addr) bool { return mode != "ipvs" || a.Is4() })
		// An unhealthy oracle makes every comparison moot.
		if err := waitHealthy(e, "127.0.0.1:10356", time.Minute); err != nil {
			kp.stop()
			e.fatalf(t, "kube-proxy %s: %v\nits errors:\n%s", run, err, kp.errors())
		}
		// A field it does not know would be ignored (lenient decoding): the run
		// would compare nothing.
		if data, _ := os.ReadFile(kp.log); strings.Contains(string(data), "strict decoding failed") {
			kp.stop()
			e.fatalf(t, "kube-proxy %s did not take its configuration strictly:\n%s", run, kp.tail())
		}
		if os.Getenv("DSPROXY_E2E_PARITY_LOG") == "1" {
			for _, cmd := range [][]string{{"iptables-save"}, {"ip6tables-save"}, {"ipset", "list", "-n"}} {
				out, err := netns.Exec(e.c.Node, cmd[0], cmd[1:]...)
				t.Logf("kube-proxy %s, %v (%v):\n%s", run, cmd, err, out)
			}
		}
		// noOracle leaves out of the comparison the families (named by their
		// save command) whose kube-proxy state is not ready; with both out,
		// the run has no oracle.
		noOracle := func(saves []string, why string) {
			for _, save := range saves {
				if !skip[run+save] {
					skip[run+save] = true
					t.Logf("kube-proxy %s, %s: %s: that family is not compared; its errors:\n%s", run, save, why, kp.errors())
				}
			}
			if skip[run+"iptables-save"] && skip[run+"ip6tables-save"] {
				kp.stop()
				t.Skipf("kube-proxy %s: %s in both families: no oracle", run, why)
			}
		}
		// kube-proxy's IPVS mode serves through its virtual servers before
		// its sync has written the iptables rules that masquerade and filter,
		// which under the guest's emulation takes minutes: wait for them. A
		// family still without them is no oracle.
		if mode == "ipvs" {
			noOracle(waitKubeProxyIPVSRules(e, 4*time.Minute), "no rules in KUBE-SERVICES after 4m")
			if !skip[run+"ip6tables-save"] {
				x.waitServing(t, "kube-proxy "+run, netip.Addr.Is6)
			}
		}
		// Probe once kube-proxy has the node's zone (trafficDistribution),
		// which may come after its first sync, and has ended a sync after
		// that and every sync it queued.
		caughtUp := time.Now()
		zoneAt, ok := kp.topologyChange(time.Minute, 1)
		if !ok {
			t.Logf("kube-proxy %s: no call of its topology handler logged after 1m; taking the node's zone away and giving it back", run)
			zoneAt, ok = x.rezone(t, kp)
		}
		if !ok {
			kp.stop()
			e.fatalf(t, "kube-proxy %s: no call of its topology handler logged:\n%s", run, kp.tail())
		}
		behind := waitKubeProxyCaughtUp(e, zoneAt, 4*time.Minute)
		t.Logf("kube-proxy %s: the wait for its zone (handed over at %s) and its queued syncs took %v", run, zoneAt.Format("15:04:05.000000"), time.Since(caughtUp).Round(time.Millisecond))
		if len(behind) > 0 && mode != "ipvs" {
			kp.stop()
			e.fatalf(t, "kube-proxy %s: the last sync queued for %v not ended after 4m; its errors:\n%s", run, behind, kp.errors())
		}
		noOracle(behind, "the last sync it queued not ended after 4m")
		kpHealth := append(x.fetchHealth(t), proxyHealth(t, e, "127.0.0.1:10356")...)
		start := time.Now()
		kpOut := x.run(nil)
		t.Logf("kube-proxy %s: %d probes in %v", run, len(kpOut), time.Since(start).Round(time.Millisecond))
		if err := kp.stop(); err != nil {
			e.fatalf(t, "kube-proxy on SIGTERM: %v", err)
		}
		if out, err := netns.Exec(e.c.Node, e.bin, "--cleanup", "--cleanup-kube-proxy"); err != nil {
			e.fatalf(t, "dsproxy --cleanup --cleanup-kube-proxy: %v\n%s", err, out)
		}

		// dsproxy alone, in the same mode, from an empty conntrack table (as
		// kube-proxy started): a dial that reuses a source port of one of
		// kube-proxy's UDP flows would follow that flow's translation.
		if out, err := netns.Exec(e.c.Node, "conntrack", "-F"); err != nil {
			e.fatalf(t, "conntrack -F: %v\n%s", err, out)
		}
		e.mu.Lock()
		e.args = []string{"--proxy-mode", mode}
		if opt.flag != "" {
			e.args = append(e.args, opt.flag)
		}
		e.mu.Unlock()
		p := e.startDsproxy(t)
		if err := p.waitLog(30*time.Second, `"Synced" ipFamily="IPv4"`, `"Synced" ipFamily="IPv6"`); err != nil {
			e.fatalf(t, "dsproxy %s: %v", run, err)
		}
		x.waitServing(t, "dsproxy "+run, nil)
		dsHealth := append(x.fetchHealth(t), proxyHealth(t, e, "127.0.0.1:10256")...)
		start = time.Now()
		dsOut := x.run(kpOut)
		t.Logf("dsproxy %s: %d probes in %v", run, len(dsOut), time.Since(start).Round(time.Millisecond))

		kpOuts[run], dsOuts[run] = kpOut, dsOut
		for i, what := range append(healthNames(x.health), "/healthz", "/livez") {
			if i < len(x.health) && skip[run+familySave(x.health[i].dst.Addr())] {
				continue
			}
			if kpHealth[i] != dsHealth[i] {
				e.errorf(t, "%s, health check %s:\nkube-proxy:\n%s\ndsproxy:\n%s", run, what, kpHealth[i], dsHealth[i])
			}
		}
	}
	for _, run := range runs {
		mode, _, _ := strings.Cut(run, "+")
		// The same run in nftables mode, for deviations "as kube-proxy's nftables mode".
		nftRun := "nftables" + strings.TrimPrefix(run, mode)
		same, deviations, skipped := 0, 0, 0
		for _, pr := range x.probes {
			if skip[run+familySave(pr.dst.Addr())] {
				skipped++
				continue
			}
			k := pr.key()
			kp, ds := kpOuts[run][k], dsOuts[run][k]
			if settled(pr, kp) == settled(pr, ds) {
				if os.Getenv("DSPROXY_E2E_PARITY_LOG") == "1" {
					t.Logf("%s, %s: %s", run, k, kp)
				}
				same++
				continue
			}
			if why := parityDeviation(mode, pr, kp, ds, kpOuts[nftRun][k]); why != "" {
				deviations++
				t.Logf("%s, %s: kube-proxy: %s; dsproxy: %s: %s", run, k, kp, ds, why)
				continue
			}
			e.errorf(t, "%s, %s: kube-proxy: %s (%d dials); dsproxy: %s (%d dials)", run, k, kp, kp.dials, ds, ds.dials)
		}
		t.Logf("%s: %d of %d probes end alike, %d differ as intended, %d not compared", run, same, len(x.probes), deviations, skipped)
		if base, ok := kpOuts[mode]; ok && run != mode {
			// The option must change something in kube-proxy, or the run
			// compared the base mode again.
			changed := 0
			for _, pr := range x.probes {
				if settled(pr, base[pr.key()]) != settled(pr, kpOuts[run][pr.key()]) {
					changed++
				}
			}
			t.Logf("%s: kube-proxy's outcome differs from %s in %d probes", run, mode, changed)
			if changed == 0 {
				e.errorf(t, "%s: kube-proxy ended every probe as in %s: the option had no effect", run, mode)
			}
		}
	}
	e.mu.Lock()
	e.args = nil
	e.mu.Unlock()
	e.checkAlive(t)
}

// parityDeviation says why dsproxy's outcome ds may differ from kube-proxy's
// kp in mode, or "" if it may not; kpNFT is kube-proxy's in nftables mode.
func parityDeviation(mode string, pr parityProbe, kp, ds, kpNFT parityOutcome) string {
	switch {
	case mode == "ipvs" && strings.HasPrefix(pr.name, "par-itp-local ") && settled(pr, ds) == "dropped" && len(kp.servers) == 0:
		// kube-proxy's IPVS mode keeps a virtual server without real servers
		// (refused); dsproxy drops, as kube-proxy's other modes do.
		return "internal traffic policy Local without local endpoints drops, as kube-proxy's other modes"
	case mode == "ipvs" && strings.HasPrefix(pr.name, "par-remote-local ") && strings.HasSuffix(pr.name, " from external") && settled(pr, ds) == "dropped":
		// At the NodePort and the load-balancer IP, kube-proxy's IPVS mode
		// forwards it to other nodes' endpoints with the client's address as
		// source, whose replies then usually miss this node; dsproxy drops it,
		// as kube-proxy's other modes do.
		return "outside traffic to external traffic policy Local without local endpoints drops, as kube-proxy's other modes"
	case mode == "ipvs" && strings.HasPrefix(pr.name, "ServiceCIDR unallocated") && settled(pr, ds) == "dropped":
		// kube-proxy's IPVS mode has no rule for these: they leave by the
		// default route; dsproxy drops them in every mode.
		return "unallocated ServiceCIDR addresses drop, as in kube-proxy's nftables mode"
	case mode == "iptables" && (strings.Contains(pr.name, "unknown-port") || strings.HasPrefix(pr.name, "ServiceCIDR unallocated")) &&
		settled(pr, ds) == settled(pr, kpNFT):
		// kube-proxy's iptables mode has no rule for these: the packets leave by
		// the default route. dsproxy's refuses unknown ports of Service
		// addresses and drops unallocated ServiceCIDR addresses in every mode.
		return "as kube-proxy's nftables mode"
	}
	return ""
}

// settled is o with a send refused by the node's output path (EPERM) counted
// as dropped, and without a timeout beside another failure of an IPv6 TCP probe:
// an ICMPv6 error that arrives while connect() holds the socket lock is
// dropped, and the first dial times out before the SYN retransmission. That
// is why kube-proxy's refusals of IPv6 TCP often begin with a timeout, and
// dsproxy's, a TCP reset, never do; such outcomes count as alike.
func settled(pr parityProbe, o parityOutcome) string {
	if o.fails["operation not permitted"] {
		// A UDP send that a DROP or REJECT on the node's own output path
		// refused (EPERM): dropped as surely as a packet dropped later.
		o.fails = maps.Clone(o.fails)
		delete(o.fails, "operation not permitted")
		o.fails["dropped"] = true
	}
	if pr.proto != netns.TCP || !pr.dst.Addr().Is6() || len(o.servers) > 0 || !o.fails["dropped"] || len(o.fails) != 2 {
		return o.String()
	}
	o.fails = maps.Clone(o.fails)
	delete(o.fails, "dropped")
	return o.String()
}

func newParityFixture(t *testing.T, e *env) *parityFixture {
	t.Helper()
	x := &parityFixture{e: e, nodeIPs: map[netip.Addr]bool{}}
	out, err := netns.Exec(e.c.Node, "ip", "-o", "addr", "show")
	if err != nil {
		t.Fatalf("ip addr: %v", err)
	}
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "inet" || f[i] == "inet6" {
				if p, err := netip.ParsePrefix(f[i+1]); err == nil {
					x.nodeIPs[p.Addr()] = true
				}
			}
		}
	}

	// Pods: q1, q2 ready on the node, q3 not ready, qr ready on a remote node.
	remoteNode := e.node + "-remote"
	if _, err := e.cp.CreateNode(remoteNode, netns.RemoteNodeIPv4.String(), netns.RemoteNodeIPv6.String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.cp.Client.CoreV1().Nodes().Delete(context.Background(), remoteNode, metav1.DeleteOptions{})
	})
	// Zones for trafficDistribution: this node in zone-a, the remote one in zone-b.
	for node, zone := range map[string]string{e.node: "zone-a", remoteNode: "zone-b"} {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, corev1.LabelTopologyZone, zone)
		if _, err := e.cp.Client.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("zone label on %s: %v", node, err)
		}
	}
	x.remote = e.c.AddRemotePod("qr")
	x.remote.Serve(netns.TCP, podPort)
	x.remote.Serve(netns.UDP, podPort)
	label := func(kv ...string) map[string]string {
		m := map[string]string{"parity": "yes"}
		for _, s := range kv {
			m[s] = "yes"
		}
		return m
	}
	e.addPods(t, label("web", "lb", "sticky", "local"), true, "q1")
	e.addPods(t, label("web", "lb", "sticky"), true, "q2")
	e.addPods(t, label("unready"), false, "q3")
	e.addPods(t, label("term"), true, "q4")
	if _, err := e.cp.CreatePodWithIPs(e.ns, "qr", remoteNode, []string{x.remote.IPv4.String(), x.remote.IPv6.String()},
		label("local", "remote"), true); err != nil {
		t.Fatal(err)
	}

	sel := func(k string) map[string]string { return map[string]string{k: "yes"} }
	svcs := map[string]*corev1.Service{}
	mk := func(name string, typ corev1.ServiceType, selector map[string]string, mod func(*corev1.Service)) {
		svc := service(name, typ, nil, selector, tcpHTTP, udpHTTP)
		if mod != nil {
			mod(svc)
		}
		svcs[name] = e.createService(t, svc)
	}
	local := func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal }
	extIPs := map[corev1.IPFamily]netip.Addr{
		corev1.IPv4Protocol: netip.MustParseAddr("203.0.113.40"), corev1.IPv6Protocol: netip.MustParseAddr("2001:db8:e::40"),
	}
	lbIP := map[corev1.IPFamily]netip.Addr{
		corev1.IPv4Protocol: netip.MustParseAddr("203.0.113.41"), corev1.IPv6Protocol: netip.MustParseAddr("2001:db8:e::41"),
	}
	lbLocal := map[corev1.IPFamily]netip.Addr{
		corev1.IPv4Protocol: netip.MustParseAddr("203.0.113.43"), corev1.IPv6Protocol: netip.MustParseAddr("2001:db8:e::43"),
	}
	lbProxy := map[corev1.IPFamily]netip.Addr{
		corev1.IPv4Protocol: netip.MustParseAddr("203.0.113.42"), corev1.IPv6Protocol: netip.MustParseAddr("2001:db8:e::42"),
	}
	extLocal := map[corev1.IPFamily]netip.Addr{
		corev1.IPv4Protocol: netip.MustParseAddr("203.0.113.44"), corev1.IPv6Protocol: netip.MustParseAddr("2001:db8:e::44"),
	}
	lbRemoteLocal := map[corev1.IPFamily]netip.Addr{
		corev1.IPv4Protocol: netip.MustParseAddr("203.0.113.45"), corev1.IPv6Protocol: netip.MustParseAddr("2001:db8:e::45"),
	}
	mk("par-web", corev1.ServiceTypeNodePort, sel("web"), nil)
	mk("par-local", corev1.ServiceTypeLoadBalancer, sel("local"), local)
	mk("par-remote-local", corev1.ServiceTypeLoadBalancer, sel("remote"), local)
	svcs["par-remote-local"] = e.setLoadBalancerIPs(t, "par-remote-local", lbRemoteLocal[corev1.IPv4Protocol], lbRemoteLocal[corev1.IPv6Protocol])
	// ExternalIPs with traffic policy Local, a local and a remote endpoint.
	mk("par-ext-local", corev1.ServiceTypeClusterIP, sel("local"), func(s *corev1.Service) {
		local(s)
		s.Spec.ExternalIPs = []string{extLocal[corev1.IPv4Protocol].String(), extLocal[corev1.IPv6Protocol].String()}
	})
	// Single-stack: only the IPv4 side serves its health check node port.
	svcs["par-local-v4"] = e.createService(t, func() *corev1.Service {
		svc := service("par-local-v4", corev1.ServiceTypeLoadBalancer, []corev1.IPFamily{corev1.IPv4Protocol}, sel("local"), tcpHTTP)
		local(svc)
		return svc
	}())
	mk("par-itp-local", corev1.ServiceTypeClusterIP, sel("remote"), func(s *corev1.Service) {
		p := corev1.ServiceInternalTrafficPolicyLocal
		s.Spec.InternalTrafficPolicy = &p
	})
	mk("par-empty", corev1.ServiceTypeNodePort, sel("nothing"), nil)
	mk("par-lb", corev1.ServiceTypeLoadBalancer, sel("lb"), func(s *corev1.Service) {
		s.Spec.ExternalIPs = []string{extIPs[corev1.IPv4Protocol].String(), extIPs[corev1.IPv6Protocol].String()}
		s.Spec.LoadBalancerSourceRanges = []string{netns.ExternalCIDRs[0].String(), netns.ExternalCIDRs[1].String()}
	})
	svcs["par-lb"] = e.setLoadBalancerIPs(t, "par-lb", lbIP[corev1.IPv4Protocol], lbIP[corev1.IPv6Protocol])
	mk("par-sticky", corev1.ServiceTypeClusterIP, sel("sticky"), func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	})
	mk("par-unready", corev1.ServiceTypeClusterIP, sel("unready"), nil)
	mk("par-pnr", corev1.ServiceTypeClusterIP, sel("unready"), func(s *corev1.Service) { s.Spec.PublishNotReadyAddresses = true })

	svcs["par-local"] = e.setLoadBalancerIPs(t, "par-local", lbLocal[corev1.IPv4Protocol], lbLocal[corev1.IPv6Protocol])
	// Another proxy's Service: neither proxy touches it.
	mk("par-other-proxy", corev1.ServiceTypeClusterIP, sel("web"), func(s *corev1.Service) {
		s.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": "someone-else"}
	})
	// Topology: both prefer the endpoint in the node's zone (q1) over the remote one.
	mk("par-close", corev1.ServiceTypeNodePort, sel("local"), func(s *corev1.Service) {
		d := corev1.ServiceTrafficDistributionPreferClose
		s.Spec.TrafficDistribution = &d
	})
	mk("par-same-node", corev1.ServiceTypeClusterIP, sel("local"), func(s *corev1.Service) {
		d := "PreferSameNode"
		s.Spec.TrafficDistribution = &d
	})
	// A load balancer that proxies (ipMode Proxy): its IP is not short-circuited.
	mk("par-lb-proxy", corev1.ServiceTypeLoadBalancer, sel("lb"), nil)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc, err := e.cp.Client.CoreV1().Services(e.ns).Get(context.Background(), "par-lb-proxy", metav1.GetOptions{})
		if err != nil {
			return err
		}
		proxy := corev1.LoadBalancerIPModeProxy
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{
			{IP: lbProxy[corev1.IPv4Protocol].String(), IPMode: &proxy}, {IP: lbProxy[corev1.IPv6Protocol].String(), IPMode: &proxy}}
		svcs["par-lb-proxy"], err = e.cp.Client.CoreV1().Services(e.ns).UpdateStatus(context.Background(), svc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("par-lb-proxy status: %v", err)
	}
	// Only a terminating endpoint (q4, deleted with a grace period no kubelet
	// ends): both fall back to it, for internal and external traffic.
	mk("par-term", corev1.ServiceTypeNodePort, sel("term"), local)
	if err := e.cp.Client.CoreV1().Pods(e.ns).Delete(context.Background(), "q4", metav1.DeleteOptions{GracePeriodSeconds: new(int64(3600))}); err != nil {
		t.Fatalf("deleting q4 gracefully: %v", err)
	}
	t.Cleanup(func() { _ = e.cp.DeletePod(e.ns, "q4") })
	for _, f := range families {
		terminating := func(slices []discoveryv1.EndpointSlice) bool {
			for _, sl := range slices {
				for _, ep := range sl.Endpoints {
					if ep.Conditions.Terminating != nil && *ep.Conditions.Terminating {
						return true
					}
				}
			}
			return false
		}
		if _, err := e.cp.WaitForEndpointSlicesFunc(e.ns, "par-term", f, terminating); err != nil {
			t.Fatalf("par-term: no terminating %s endpoint: %v", f, err)
		}
		hinted := func(slices []discoveryv1.EndpointSlice) bool {
			n := 0
			for _, sl := range slices {
				for _, ep := range sl.Endpoints {
					if ep.Hints == nil || len(ep.Hints.ForZones) == 0 {
						return false
					}
					n++
				}
			}
			return n == 2
		}
		if _, err := e.cp.WaitForEndpointSlicesFunc(e.ns, "par-close", f, hinted); err != nil {
			t.Fatalf("par-close: %s endpoints without zone hints: %v", f, err)
		}
	}

	q1 := e.pods["q1"]
	unallocated := map[corev1.IPFamily]netip.Addr{
		corev1.IPv4Protocol: netip.MustParseAddr("10.96.255.200"), corev1.IPv6Protocol: netip.MustParseAddr("fd00:96::ffc8"),
	}
	for _, f := range families {
		for _, proto := range []netns.Proto{netns.TCP, netns.UDP} {
			port := strings.ToLower(string(proto))
			add := func(svc, target string, from *netns.NS, dst netip.AddrPort) {
				x.probes = append(x.probes, parityProbe{name: svc + " " + target + " from " + from.Name, from: from, proto: proto, dst: dst})
			}
			cip := func(name string) netip.AddrPort {
				a, _ := clusterIP(svcs[name], f, svcPort)
				return a
			}
			np := func(name string) netip.AddrPort {
				return netip.AddrPortFrom(nodeIP(f), nodePort(svcs[name], port))
			}
			for _, from := range []*netns.NS{e.c.Node, e.client, q1} {
				add("par-web", "ClusterIP", from, cip("par-web"))
			}
			for _, from := range []*netns.NS{e.external, e.c.Node, e.client} {
				add("par-web", "NodePort", from, np("par-web"))
			}
			add("par-web", "ClusterIP-unknown-port", e.client, netip.AddrPortFrom(cip("par-web").Addr(), svcPort+1))
			add("par-web", "NodePort-unknown", e.external, netip.AddrPortFrom(nodeIP(f), 32766))
			loopback := netip.MustParseAddr("127.0.0.1")
			if f == corev1.IPv6Protocol {
				loopback = netip.IPv6Loopback()
			}
			add("par-web", "localhost-NodePort", e.c.Node, netip.AddrPortFrom(loopback, nodePort(svcs["par-web"], port)))
			for _, name := range []string{"par-local", "par-remote-local"} {
				add(name, "ClusterIP", e.client, cip(name))
				for _, from := range []*netns.NS{e.external, e.c.Node, e.client} {
					add(name, "NodePort", from, np(name))
				}
			}
			for _, from := range []*netns.NS{e.client, e.c.Node} {
				add("par-itp-local", "ClusterIP", from, cip("par-itp-local"))
				add("par-empty", "ClusterIP", from, cip("par-empty"))
				add("ServiceCIDR", "unallocated", from, netip.AddrPortFrom(unallocated[f], svcPort))
			}
			add("par-empty", "NodePort", e.external, np("par-empty"))
			for _, from := range []*netns.NS{e.external, e.client, e.c.Node} {
				add("par-lb", "ExternalIP", from, netip.AddrPortFrom(extIPs[f], svcPort))
				add("par-lb", "LoadBalancerIP", from, netip.AddrPortFrom(lbIP[f], svcPort))
			}
			add("par-lb", "LoadBalancerIP-unknown-port", e.external, netip.AddrPortFrom(lbIP[f], svcPort+1))
			add("par-lb", "NodePort", e.external, np("par-lb"))
			x.probes = append(x.probes, parityProbe{name: "par-sticky ClusterIP from client", from: e.client, proto: proto, dst: cip("par-sticky"), sticky: true})
			for _, from := range []*netns.NS{e.external, e.client} {
				add("par-local", "LoadBalancerIP", from, netip.AddrPortFrom(lbLocal[f], svcPort))
				add("par-lb-proxy", "LoadBalancerIP", from, netip.AddrPortFrom(lbProxy[f], svcPort))
			}
			add("par-lb-proxy", "LoadBalancerIP", e.c.Node, netip.AddrPortFrom(lbProxy[f], svcPort))
			for _, from := range []*netns.NS{e.external, e.client, e.c.Node} {
				add("par-ext-local", "ExternalIP", from, netip.AddrPortFrom(extLocal[f], svcPort))
				add("par-remote-local", "LoadBalancerIP", from, netip.AddrPortFrom(lbRemoteLocal[f], svcPort))
			}
			add("par-other-proxy", "ClusterIP", e.client, cip("par-other-proxy"))
			for _, from := range []*netns.NS{e.client, e.c.Node} {
				add("par-close", "ClusterIP", from, cip("par-close"))
				add("par-same-node", "ClusterIP", from, cip("par-same-node"))
			}
			add("par-close", "NodePort", e.external, np("par-close"))
			add("par-term", "ClusterIP", e.client, cip("par-term"))
			add("par-term", "NodePort", e.external, np("par-term"))
			add("par-unready", "ClusterIP", e.client, cip("par-unready"))
			add("par-pnr", "ClusterIP", e.client, cip("par-pnr"))
		}
		hc := func(name string) uint16 { return uint16(svcs[name].Spec.HealthCheckNodePort) }
		// From outside on the node IP; the IPv4-only Service's port on IPv6 too
		// (kube-proxy's IPv6 server has no such Service: refused).
		for _, name := range []string{"par-local", "par-remote-local", "par-local-v4"} {
			x.health = append(x.health, healthProbe{e.external, netip.AddrPortFrom(nodeIP(f), hc(name))})
		}
		// From the node on loopback: the ports listen on the --nodeport-addresses
		// matches ("primary", the nftables mode's default: the node IP only) or
		// every address (the other modes' default).
		loopback := netip.MustParseAddr("127.0.0.1")
		if f == corev1.IPv6Protocol {
			loopback = netip.IPv6Loopback()
		}
		x.health = append(x.health, healthProbe{e.c.Node, netip.AddrPortFrom(loopback, hc("par-local"))})
	}
	return x
}

func healthNames(hs []healthProbe) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h.String())
	}
	return out
}

// waitServing waits until the proxy serves the fixture: every Service with a
// ready endpoint answers on its ClusterIP from the client pod (only on the
// ClusterIPs that which selects, if not nil).
func (x *parityFixture) waitServing(t *testing.T, who string, which func(netip.Addr) bool) {
	t.Helper()
	for _, pr := range x.probes {
		if (which != nil && !which(pr.dst.Addr())) || pr.proto != netns.TCP || !strings.HasSuffix(pr.name, " ClusterIP from client") ||
			strings.Contains(pr.name, "empty") || strings.Contains(pr.name, "unready") || strings.Contains(pr.name, "itp-local") ||
			strings.Contains(pr.name, "other-proxy") {
			continue
		}
		if _, err := reach(pr.from, pr.proto, pr.dst, 30*time.Second); err != nil {
			x.e.fatalf(t, "%s does not serve %s: %v", who, pr.name, err)
		}
	}
}

// run dials every probe, 8 at a time, and returns the outcomes by key. With
// want (kube-proxy's outcomes), a probe goes on dialling until it has seen all
// that want saw, or 40 dials: a random choice of endpoints must not decide.
func (x *parityFixture) run(want map[string]parityOutcome) map[string]parityOutcome {
	out := map[string]parityOutcome{}
	var mu sync.Mutex
	work := make(chan parityProbe)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for pr := range work {
				w, ok := want[pr.key()]
				o := x.probe(pr, w, ok && !pr.sticky)
				mu.Lock()
				out[pr.key()] = o
				mu.Unlock()
			}
		})
	}
	for _, pr := range x.probes {
		work <- pr
	}
	close(work)
	wg.Wait()
	return out
}

// probe dials pr: a failing probe is settled after 3 failed dials, a served one
// after 24, or with want after 12 once it has seen what want saw (at most 40).
// A dial that times out is dialled again at once before it counts as dropped.
func (x *parityFixture) probe(pr parityProbe, want parityOutcome, haveWant bool) parityOutcome {
	o := parityOutcome{servers: map[string]bool{}, srcs: map[string]bool{}, fails: map[string]bool{}}
	failed := 0
	for o.dials < 40 {
		timeout := dialTimeout
		if failed > 0 {
			timeout = negTimeout
		}
		r, err := netns.Dial(pr.from, pr.proto, pr.dst, timeout)
		o.dials++
		if netns.IsTimeout(err) {
			// A timeout counts only when a dial right after it times out
			// too: under emulation a loaded guest stalled one of 24 dials
			// of a NodePort kube-proxy served. A port that drops, even one
			// endpoint in two, still shows it within the probe's dials.
			r, err = netns.Dial(pr.from, pr.proto, pr.dst, negTimeout)
		}
		switch {
		case err == nil:
			o.servers[r.Server] = true
			o.srcs[x.classify(pr.from, r.ObservedSrc.Addr())] = true
		case netns.IsRefused(err):
			o.fails["refused"] = true
			failed++
		case netns.IsTimeout(err):
			o.fails["dropped"] = true
			failed++
		case netns.IsUnreachable(err):
			o.fails["unreachable"] = true
			failed++
		default:
			// The errno alone: the message names the random source port.
			msg := err.Error()
			o.fails[msg[strings.LastIndex(msg, ": ")+2:]] = true
			failed++
		}
		if failed >= 3 && len(o.servers) == 0 {
			break
		}
		// kube-proxy's outcome is the reference: 24 dials leave a choice of two
		// endpoints unseen once in 8 million.
		if (haveWant && o.dials >= 12 && o.covers(want)) || (!haveWant && o.dials >= 24) {
			break
		}
	}
	if pr.sticky && len(o.servers) > 0 {
		o.servers = map[string]bool{fmt.Sprintf("sticky %v", len(o.servers) == 1): true}
	}
	return o
}

// classify names the source address a server saw: the client's own, the node's,
// or the address itself.
func (x *parityFixture) classify(from *netns.NS, a netip.Addr) string {
	a = a.Unmap()
	switch {
	case from != x.e.c.Node && (a == from.IPv4 || a == from.IPv6):
		return "client's own"
	case x.nodeIPs[a]:
		return "node " + a.String()
	}
	return a.String()
}

// fetchHealth GETs every health check node port and returns the status line, the
// headers a load balancer reads, and the body; or curl's exit status (7: refused,
// 28: timed out).
func (x *parityFixture) fetchHealth(t *testing.T) []string {
	t.Helper()
	var res []string
	for _, h := range x.health {
		out, err := netns.Exec(h.from, "curl", "-si", "--max-time", "2", fmt.Sprintf("http://%s/", h.dst))
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			res = append(res, fmt.Sprintf("curl exit status %d", ee.ExitCode()))
			continue
		} else if err != nil {
			res = append(res, fmt.Sprintf("error: %v", err))
			continue
		}
		head, body, _ := strings.Cut(strings.ReplaceAll(out, "\r\n", "\n"), "\n\n")
		var keep []string
		for i, line := range strings.Split(head, "\n") {
			name, _, _ := strings.Cut(strings.ToLower(line), ":")
			if i == 0 || name == "content-type" || name == "x-content-type-options" || name == "x-load-balancing-endpoint-weight" {
				keep = append(keep, line)
			}
		}
		slices.Sort(keep[1:])
		res = append(res, strings.Join(keep, "\n")+"\n\n"+body)
	}
	return res
}

// proxyHealth GETs a proxy's /healthz and /livez in the node and returns, for
// each, the status line, Content-Type and the JSON body's fields with their
// values' types (the timestamps differ) and nodeEligible's value.
func proxyHealth(t *testing.T, e *env, addr string) []string {
	t.Helper()
	var res []string
	for _, path := range []string{"/healthz", "/livez"} {
		out, err := netns.Exec(e.c.Node, "curl", "-si", "--max-time", "2", "http://"+addr+path)
		if err != nil {
			res = append(res, fmt.Sprintf("error: %v", err))
			continue
		}
		head, body, _ := strings.Cut(strings.ReplaceAll(out, "\r\n", "\n"), "\n\n")
		lines := strings.Split(head, "\n")
		desc := []string{lines[0]}
		for _, line := range lines[1:] {
			if name, _, _ := strings.Cut(strings.ToLower(line), ":"); name == "content-type" {
				desc = append(desc, line)
			}
		}
		var fields map[string]any
		if err := json.Unmarshal([]byte(body), &fields); err != nil {
			desc = append(desc, "body not JSON: "+body)
		}
		for _, k := range slices.Sorted(maps.Keys(fields)) {
			v := fmt.Sprintf("%T", fields[k])
			if k == "nodeEligible" {
				v = fmt.Sprint(fields[k])
			}
			desc = append(desc, k+": "+v)
		}
		res = append(res, strings.Join(desc, "\n"))
	}
	return res
}

// familySave is the iptables-save command of a's family.
func familySave(a netip.Addr) string {
	if a.Is4() {
		return "iptables-save"
	}
	return "ip6tables-save"
}

// waitHealthy polls a proxy's /healthz in the node until it answers 200.
func waitHealthy(e *env, addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		out, err := netns.Exec(e.c.Node, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2", "http://"+addr+"/healthz")
		if err == nil && strings.TrimSpace(out) == "200" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("/healthz on %s answers %q (%v), not 200, after %v", addr, out, err, within)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// rezone takes the node's zone label away and gives it back, and returns when
// kube-proxy handed the zone to its proxier again. kube-proxy v1.36 adds its
// topology handler to the Node informer its NodeManager already runs, and
// registers its proxier with that handler a moment later
// (cmd/kube-proxy/app/server.go). When the informer replays the node in
// between, kube-proxy records the zone without calling its proxier, and it
// calls it only for a change of zone after that: a missing zone is one, and
// giving it back is the second.
func (x *parityFixture) rezone(t *testing.T, kp *kubeProxyProc) (at time.Time, ok bool) {
	t.Helper()
	calls := 0 // already logged
	for ; ; calls++ {
		if _, ok := kp.topologyChange(0, calls+1); !ok {
			break
		}
	}
	for i, zone := range []string{"null", `"zone-a"`} {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, corev1.LabelTopologyZone, zone)
		if _, err := x.e.cp.Client.CoreV1().Nodes().Patch(context.Background(), x.e.node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("zone label %s on %s: %v", zone, x.e.node, err)
		}
		if at, ok = kp.topologyChange(time.Minute, calls+i+1); !ok {
			return at, false
		}
	}
	return at, true
}

// TestTopologyChangeTime checks that topologyChange finds the topology
// handler's call in a kube-proxy log and reads its klog time.
func TestTopologyChangeTime(t *testing.T) {
	kp := &kubeProxyProc{log: filepath.Join(t.TempDir(), "kube-proxy.log")}
	now := time.Now()
	at := now.Add(-90 * time.Second).Truncate(time.Microsecond)
	log := at.Add(-time.Second).Format("I0102 15:04:05.000000") + `   42 config.go:328] "Calling handler.OnNodeChange"` + "\n" +
		at.Format("I0102 15:04:05.000000") + `   42 config.go:528] "Calling handler.OnTopologyChange"` + "\n"
	if err := os.WriteFile(kp.log, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	got, ok := kp.topologyChange(0, 1)
	if !ok || !got.Equal(at) {
		t.Fatalf("topologyChange = %v, %v; want %v, true", got, ok, at)
	}
	// The second call, after the zone was taken away and given back.
	again := at.Add(3 * time.Second)
	log += again.Add(-time.Second).Format("I0102 15:04:05.000000") + `   42 config.go:528] "Calling handler.OnTopologyChange"` + "\n" +
		again.Format("I0102 15:04:05.000000") + `   42 config.go:528] "Calling handler.OnTopologyChange"` + "\n"
	if err := os.WriteFile(kp.log, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, ok := kp.topologyChange(0, 3); !ok || !got.Equal(again) {
		t.Fatalf("topologyChange(n=3) = %v, %v; want %v, true", got, ok, again)
	}
	if got, ok := kp.topologyChange(0, 4); ok {
		t.Fatalf("topologyChange(n=4) of three calls = %v, true; want false", got)
	}
	if err := os.WriteFile(kp.log, []byte(at.Format("I0102 15:04:05.000000")+`   42 config.go:328] "Calling handler.OnNodeChange"`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, ok := kp.topologyChange(0, 1); ok {
		t.Fatalf("topologyChange without the handler's line = %v, true; want false", got)
	}
}
