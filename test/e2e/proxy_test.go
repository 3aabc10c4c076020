//go:build e2e && netns

// Package e2e runs the dsproxy binary in a node network namespace against a
// real control plane (hack/controlplane: etcd, kube-apiserver,
// kube-controller-manager v1.36) and checks Services with real connections
// over both families. EndpointSlices come from kube-controller-manager, built
// from Pods whose status the test writes with the pod namespaces' addresses.
//
//	go test -tags e2e,netns -count=1 -v ./test/e2e/...
//
// Root only. Environment: DSPROXY_E2E_BIN (a prebuilt dsproxy instead of go
// build), DSPROXY_E2E_ADMIN=1 (run dsproxy as cluster admin instead of the
// deploy/rbac.yaml ServiceAccount), DSPROXY_E2E_KEEP_LOGS=1, and the
// framework's DSPROXY_CP_KEEP=1.
package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/dsproxy/dsproxy/test/e2e/framework"
	"github.com/dsproxy/dsproxy/test/netns"
)

func TestMain(m *testing.M) { framework.Main(m) }

// TestProxy runs the scenarios in order on one node and one dsproxy (restarted
// by DsproxyRestart); each scenario has its own Services and pods.
func TestProxy(t *testing.T) {
	e := newEnv(t,
		"web-a", "web-b", // Services
		"s1", "s2", "s3", "s4", // Scaling
		"f1",             // FamilyPolicy
		"d1",             // Delete
		"r1", "r2", "r3", // DsproxyRestart
		"m1", "m2", "m3", // ModeSwitch
		"w1",                         // ConfigFileUpdated
		"n1",                         // NodeWithoutAddresses
		"t1", "t2", "t3", "t4", "t5", // KubeProxyTakeover
		"q1", "q2", "q3", "q4", // KubeProxyParity
		"k1", "k2", // APIServerRestart
	)
	t.Run("Services", func(t *testing.T) { testServices(t, e) })
	t.Run("StartingEvent", func(t *testing.T) { testStartingEvent(t, e) })
	t.Run("Scaling", func(t *testing.T) { testScaling(t, e) })
	t.Run("FamilyPolicy", func(t *testing.T) { testFamilyPolicy(t, e) })
	t.Run("Delete", func(t *testing.T) { testDelete(t, e) })
	t.Run("DsproxyRestart", func(t *testing.T) { testDsproxyRestart(t, e) })
	t.Run("ServiceCIDRsForbidden", func(t *testing.T) { testServiceCIDRsForbidden(t, e) })
	t.Run("BindAddressHardFail", func(t *testing.T) { testBindAddressHardFail(t, e) })
	t.Run("ModeSwitch", func(t *testing.T) { testModeSwitch(t, e) })
	t.Run("ConfigFileUpdated", func(t *testing.T) { testConfigFileUpdated(t, e) })
	t.Run("NodeWithoutAddresses", func(t *testing.T) { testNodeWithoutAddresses(t, e) })
	t.Run("KubeProxyTakeover", func(t *testing.T) { testKubeProxyTakeover(t, e) })
	t.Run("KubeProxyParity", func(t *testing.T) { testKubeProxyParity(t, e) })
	t.Run("FeatureGates", func(t *testing.T) { testFeatureGates(t, e) })
	// Before APIServerRestart: a restarted kube-apiserver briefly answers
	// "forbidden" to everyone until its RBAC authorizer has caught up.
	t.Run("Manifests", func(t *testing.T) { testManifests(t, e) })
	t.Run("APIServerRestart", func(t *testing.T) { testAPIServerRestart(t, e) })
}

// testServices: ClusterIP, NodePort and LoadBalancer Services, dual-stack and
// single-stack of each family, over TCP and UDP. Each answers on its families
// (ClusterIP from the node and from a pod, NodePort on the node IP from the node
// and from outside, load-balancer IP from outside and from the node) and a
// single-stack one does not answer on the other family: its NodePort is refused
// on the other family's node IP, and a load-balancer ingress IP of the other
// family in its status is ignored.
func testServices(t *testing.T, e *env) {
	sel := map[string]string{"app": "web"}
	e.addPods(t, sel, true, "web-a", "web-b")
	backends := []string{"web-a", "web-b"}
	v4, v6 := []corev1.IPFamily{corev1.IPv4Protocol}, []corev1.IPFamily{corev1.IPv6Protocol}
	cases := []struct {
		name string
		typ  corev1.ServiceType
		fams []corev1.IPFamily // nil: RequireDualStack
		lb   []netip.Addr
	}{
		{"cip-dual", corev1.ServiceTypeClusterIP, nil, nil},
		{"cip-v4", corev1.ServiceTypeClusterIP, v4, nil},
		{"cip-v6", corev1.ServiceTypeClusterIP, v6, nil},
		{"np-dual", corev1.ServiceTypeNodePort, nil, nil},
		{"np-v4", corev1.ServiceTypeNodePort, v4, nil},
		{"np-v6", corev1.ServiceTypeNodePort, v6, nil},
		{"lb-dual", corev1.ServiceTypeLoadBalancer, nil, []netip.Addr{lbIPs[corev1.IPv4Protocol][0], lbIPs[corev1.IPv6Protocol][0]}},
		// Single-stack with an ingress IP of each family: the other family's is ignored.
		{"lb-v4", corev1.ServiceTypeLoadBalancer, v4, []netip.Addr{lbIPs[corev1.IPv4Protocol][1], lbIPs[corev1.IPv6Protocol][1]}},
		{"lb-v6", corev1.ServiceTypeLoadBalancer, v6, []netip.Addr{lbIPs[corev1.IPv6Protocol][2], lbIPs[corev1.IPv4Protocol][2]}},
	}
	svcs := map[string]*corev1.Service{}
	for _, tc := range cases {
		svcs[tc.name] = e.createService(t, service(tc.name, tc.typ, tc.fams, sel, tcpHTTP, udpHTTP))
		if tc.lb != nil {
			svcs[tc.name] = e.setLoadBalancerIPs(t, tc.name, tc.lb...)
		}
	}
	start := time.Now()
	// The first check waits for the EndpointSlices and dsproxy's sync.
	first := 15 * time.Second
	protos := []netns.Proto{netns.TCP, netns.UDP}
	checks := 0
	for _, tc := range cases {
		svc := svcs[tc.name]
		for _, f := range families {
			for _, proto := range protos {
				portName := strings.ToLower(string(proto))
				vip, has := clusterIP(svc, f, svcPort)
				if !has {
					// Single-stack of the other family: no ClusterIP here, and the
					// NodePort must not open on this family's node IP.
					if tc.typ != corev1.ServiceTypeClusterIP {
						dst := netip.AddrPortFrom(nodeIP(f), nodePort(svc, portName))
						if err := unreachable(e.c.Node, proto, dst, converge, true); err != nil {
							e.errorf(t, "%s (%v only): NodePort on the %s node IP: %v", tc.name, tc.fams, f, err)
						}
						checks++
					}
					for _, ip := range tc.lb {
						if familyOf(ip) != f {
							continue
						}
						dst := netip.AddrPortFrom(ip, svcPort)
						if err := unreachable(e.external, proto, dst, converge, false); err != nil {
							e.errorf(t, "%s (%v only): load-balancer IP %s of the other family: %v", tc.name, tc.fams, ip, err)
						}
						checks++
					}
					continue
				}
				dsts := []probeTarget{{e.c.Node, vip}, {e.client, vip}}
				if tc.typ != corev1.ServiceTypeClusterIP {
					np := netip.AddrPortFrom(nodeIP(f), nodePort(svc, portName))
					dsts = append(dsts, probeTarget{e.c.Node, np}, probeTarget{e.external, np})
				}
				for _, ip := range tc.lb {
					if familyOf(ip) == f {
						lb := netip.AddrPortFrom(ip, svcPort)
						dsts = append(dsts, probeTarget{e.external, lb}, probeTarget{e.c.Node, lb})
					}
				}
				for _, d := range dsts {
					if _, err := reach(d.from, proto, d.dst, first, backends...); err != nil {
						e.errorf(t, "%s: %v", tc.name, err)
					}
					first = converge
					checks++
				}
			}
		}
	}
	t.Logf("%d services, %d reachability checks in %v", len(cases), checks, time.Since(start).Round(time.Millisecond))
	e.checkAlive(t)
}

// testScaling: endpoints added, deleted and flipped between ready and not
// ready; new connections reach exactly the ready set within 5s, and none
// (refused) when no endpoint is ready.
func testScaling(t *testing.T, e *env) {
	sel := map[string]string{"app": "scale"}
	e.addPods(t, sel, true, "s1")
	svc := e.createService(t, service("scale", corev1.ServiceTypeClusterIP, nil, sel, tcpHTTP))
	var vips []netip.AddrPort
	for _, f := range families {
		vip, _ := clusterIP(svc, f, svcPort)
		vips = append(vips, vip)
	}
	if took, err := waitBackends(e.c.Node, vips, []string{"s1"}, 15*time.Second); err != nil {
		e.fatalf(t, "initial: %v", err)
	} else {
		t.Logf("initial {s1}: %v", took.Round(time.Millisecond))
	}
	steps := []struct {
		what string
		do   func()
		want []string
	}{
		{"add s2, s3 (ready)", func() { e.addPods(t, sel, true, "s2", "s3") }, []string{"s1", "s2", "s3"}},
		{"s2 not ready", func() { e.setReady(t, false, "s2") }, []string{"s1", "s3"}},
		{"delete s1", func() { e.deletePods(t, "s1") }, []string{"s3"}},
		{"s2 ready, add s4 (not ready)", func() { e.setReady(t, true, "s2"); e.addPods(t, sel, false, "s4") }, []string{"s2", "s3"}},
		{"s4 ready", func() { e.setReady(t, true, "s4") }, []string{"s2", "s3", "s4"}},
		{"none ready", func() { e.setReady(t, false, "s2", "s3", "s4") }, nil},
		{"s3 ready", func() { e.setReady(t, true, "s3") }, []string{"s3"}},
		{"delete s2, s3, s4", func() { e.deletePods(t, "s2", "s3", "s4") }, nil},
	}
	for _, s := range steps {
		s.do()
		start := time.Now() // the API write is done
		if _, err := waitBackends(e.c.Node, vips, s.want, converge); err != nil {
			e.fatalf(t, "%s: %v", s.what, err)
		}
		t.Logf("%-30s -> %v in %v (from the API write)", s.what, s.want, time.Since(start).Round(time.Millisecond))
	}
	e.checkAlive(t)
}

// testFamilyPolicy: a SingleStack IPv4 NodePort Service is upgraded to
// PreferDualStack (kubectl patch) and downgraded again (client update): the
// IPv6 ClusterIP and NodePort appear, then disappear; IPv4 keeps working.
func testFamilyPolicy(t *testing.T, e *env) {
	sel := map[string]string{"app": "fam"}
	e.addPods(t, sel, true, "f1")
	svc := e.createService(t, service("fam", corev1.ServiceTypeNodePort, []corev1.IPFamily{corev1.IPv4Protocol}, sel, tcpHTTP))
	v4, _ := clusterIP(svc, corev1.IPv4Protocol, svcPort)
	np := nodePort(svc, "tcp")
	np4, np6 := netip.AddrPortFrom(netns.NodeIPv4, np), netip.AddrPortFrom(netns.NodeIPv6, np)
	for _, dst := range []netip.AddrPort{v4, np4} {
		if _, err := reach(e.c.Node, netns.TCP, dst, 15*time.Second, "f1"); err != nil {
			e.fatalf(t, "SingleStack IPv4: %v", err)
		}
	}
	if err := unreachable(e.c.Node, netns.TCP, np6, converge, true); err != nil {
		e.errorf(t, "SingleStack IPv4: %v", err)
	}

	start := time.Now()
	if out, err := e.cp.Kubectl("-n", e.ns, "patch", "service", "fam", "--type=merge",
		"-p", `{"spec":{"ipFamilyPolicy":"PreferDualStack"}}`); err != nil {
		t.Fatalf("kubectl patch: %v\n%s", err, out)
	}
	svc, err := e.cp.Client.CoreV1().Services(e.ns).Get(context.Background(), "fam", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v6, ok := clusterIP(svc, corev1.IPv6Protocol, svcPort)
	if !ok {
		t.Fatalf("PreferDualStack: no IPv6 ClusterIP: %v %v", svc.Spec.ClusterIPs, svc.Spec.IPFamilies)
	}
	for _, dst := range []netip.AddrPort{v6, np6} {
		if _, err := reach(e.c.Node, netns.TCP, dst, converge, "f1"); err != nil {
			e.errorf(t, "PreferDualStack: %v", err)
		}
	}
	t.Logf("PreferDualStack: IPv6 ClusterIP %s and NodePort reachable %v after the patch", v6.Addr(), time.Since(start).Round(time.Millisecond))

	start = time.Now()
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := e.cp.Client.CoreV1().Services(e.ns).Get(context.Background(), "fam", metav1.GetOptions{})
		if err != nil {
			return err
		}
		single := corev1.IPFamilyPolicySingleStack
		s.Spec.IPFamilyPolicy = &single
		s.Spec.IPFamilies = s.Spec.IPFamilies[:1]
		s.Spec.ClusterIPs = s.Spec.ClusterIPs[:1]
		_, err = e.cp.Client.CoreV1().Services(e.ns).Update(context.Background(), s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("downgrade to SingleStack: %v", err)
	}
	if err := unreachable(e.c.Node, netns.TCP, v6, converge, false); err != nil {
		e.errorf(t, "SingleStack again: old IPv6 ClusterIP: %v", err)
	}
	if err := unreachable(e.c.Node, netns.TCP, np6, converge, true); err != nil {
		e.errorf(t, "SingleStack again: IPv6 NodePort: %v", err)
	}
	for _, dst := range []netip.AddrPort{v4, np4} {
		if _, err := reach(e.c.Node, netns.TCP, dst, time.Second, "f1"); err != nil {
			e.errorf(t, "SingleStack again: %v", err)
		}
	}
	t.Logf("SingleStack again: IPv6 gone in %v", time.Since(start).Round(time.Millisecond))
	e.checkAlive(t)
}

// testDelete: after a Service is deleted its ClusterIPs stop answering and its
// NodePorts are refused, on both families.
func testDelete(t *testing.T, e *env) {
	sel := map[string]string{"app": "del"}
	e.addPods(t, sel, true, "d1")
	svc := e.createService(t, service("del", corev1.ServiceTypeNodePort, nil, sel, tcpHTTP, udpHTTP))
	type target struct {
		proto   netns.Proto
		dst     netip.AddrPort
		refused bool
	}
	var targets []target
	for _, f := range families {
		vip, _ := clusterIP(svc, f, svcPort)
		targets = append(targets,
			target{netns.TCP, vip, false}, target{netns.UDP, vip, false},
			target{netns.TCP, netip.AddrPortFrom(nodeIP(f), nodePort(svc, "tcp")), true},
			target{netns.UDP, netip.AddrPortFrom(nodeIP(f), nodePort(svc, "udp")), true})
	}
	for _, tg := range targets {
		if _, err := reach(e.c.Node, tg.proto, tg.dst, 15*time.Second, "d1"); err != nil {
			e.fatalf(t, "before delete: %v", err)
		}
	}
	start := time.Now()
	if err := e.cp.Client.CoreV1().Services(e.ns).Delete(context.Background(), "del", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tg := range targets {
		if err := unreachable(e.c.Node, tg.proto, tg.dst, converge, tg.refused); err != nil {
			e.errorf(t, "after delete: %v", err)
		}
	}
	t.Logf("deleted service unreachable on both families within %v", time.Since(start).Round(time.Millisecond))
	e.checkAlive(t)
}

// testDsproxyRestart: dsproxy gets SIGTERM and a new process starts while
// connections to a ClusterIP are opened every 20ms from the node and from a pod
// and long-lived connections (one per family) exchange data: none fails, the
// rules stay in place while no dsproxy runs, and the new process takes over
// (it follows an endpoint change).
func testDsproxyRestart(t *testing.T, e *env) {
	sel := map[string]string{"app": "restart"}
	vips, targets, echoes := e.trafficFixture(t, sel, corev1.ServiceTypeClusterIP, "r1", "r2")

	old := e.cur()
	pr := startProber(20*time.Millisecond, targets, echoes)
	time.Sleep(300 * time.Millisecond)
	stopStart := time.Now()
	err := old.stop()
	stopped := time.Since(stopStart)
	if err != nil {
		e.errorf(t, "dsproxy (pid %d) on SIGTERM: %v", old.pid, err)
	}
	if err := old.waitLog(0, "rules left in place"); err != nil {
		e.errorf(t, "old dsproxy: %v", err)
	}
	// No dsproxy at all for a while: the rules keep serving.
	time.Sleep(time.Second)
	restart := time.Now()
	p := e.startDsproxy(t)
	if err := p.waitLog(30*time.Second, `"Synced" ipFamily="IPv4"`, `"Synced" ipFamily="IPv6"`); err != nil {
		e.errorf(t, "new dsproxy: %v", err)
	}
	synced := time.Since(restart)
	// The new process owns the rules: it follows a change.
	e.addPods(t, sel, true, "r3")
	took, err := waitBackends(e.c.Node, vips, []string{"r1", "r2", "r3"}, converge)
	if err != nil {
		e.errorf(t, "new dsproxy does not follow the endpoint change: %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	ticks := pr.ticks()
	dials, failures := pr.finish()
	t.Logf("old pid %d stopped in %v; new pid %d synced %v after start, followed a change in %v; %d dials, %d long-lived pings",
		old.pid, stopped.Round(time.Millisecond), p.pid, synced.Round(time.Millisecond), took.Round(time.Millisecond),
		dials, echoes[0].n+echoes[1].n)
	if len(failures) > 0 {
		e.errorf(t, "%d of %d connections failed across the restart:\n%s", len(failures), dials, strings.Join(failures, "\n"))
	}
	// The window is the no-dsproxy second plus the restart: ~100 ticks, fewer
	// as dsproxy starts faster, so the prober is held to its own ticks (nine in
	// ten dialled, as the former fixed 100 of ~105).
	if dials < ticks*9/10 {
		t.Errorf("only %d dials in %d ticks of %v during the restart; the prober did not keep up", dials, ticks, pr.interval)
	}
	for _, ec := range echoes {
		if err := ec.ping(); err != nil {
			e.errorf(t, "long-lived connection after the restart: %v", err)
		}
	}
	e.checkAlive(t)
}

// testServiceCIDRsForbidden: with deploy/rbac.yaml's ClusterRole lacking
// servicecidrs, a restarted dsproxy still programs both families (kube-proxy's
// proxiers never wait for ServiceCIDRs) and says why it has no drop of
// unallocated service addresses; once the permission is back, that drop follows
// without a restart.
func testServiceCIDRsForbidden(t *testing.T, e *env) {
	if !e.saRBAC {
		t.Skip("dsproxy runs as cluster admin (DSPROXY_E2E_ADMIN=1)")
	}
	ctx := context.Background()
	roles := e.cp.Client.RbacV1().ClusterRoles()
	orig, err := roles.Get(ctx, "dsproxy", metav1.GetOptions{})
	if err != nil {
		e.fatalf(t, "ClusterRole dsproxy: %v", err)
	}
	// allowed waits until the API server's authorizer answers want for the
	// ServiceAccount listing ServiceCIDRs.
	allowed := func(want bool) {
		t.Helper()
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   "system:serviceaccount:kube-system:dsproxy",
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Group: "networking.k8s.io", Resource: "servicecidrs", Verb: "list"}}}
		deadline := time.Now().Add(30 * time.Second)
		for {
			got, err := e.cp.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			if err == nil && got.Status.Allowed == want {
				return
			}
			if time.Now().After(deadline) {
				e.fatalf(t, "listing servicecidrs still allowed=%v after 30 s (%v)", !want, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	setRules := func(rules []rbacv1.PolicyRule) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := roles.Get(ctx, "dsproxy", metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Rules = rules
			_, err = roles.Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			e.fatalf(t, "updating ClusterRole dsproxy: %v", err)
		}
	}
	restored := false
	defer func() {
		if !restored {
			setRules(orig.Rules)
		}
	}()
	setRules(slices.DeleteFunc(slices.Clone(orig.Rules), func(r rbacv1.PolicyRule) bool {
		return slices.Contains(r.Resources, "servicecidrs")
	}))
	allowed(false)
	// unallocatedDrops counts the drop rules of the control plane's service
	// CIDRs (hack/controlplane: 10.96.0.0/16, fd00:96::/112), per family.
	unallocatedDrops := func() (v4, v6 int) {
		out, _ := netns.Exec(e.c.Node, "nft", "list", "ruleset")
		return strings.Count(out, "unallocated ClusterIP in 10.96.0.0/16"), strings.Count(out, "unallocated ClusterIP in fd00:96::/112")
	}

	if err := e.cur().stop(); err != nil {
		e.errorf(t, "stopping dsproxy: %v", err)
	}
	start := time.Now()
	p := e.startDsproxy(t)
	e.mu.Lock()
	p.forbiddenOK = "servicecidrs" // for Manifests' check of deploy/rbac.yaml
	e.mu.Unlock()
	if err := p.waitLog(30*time.Second, "Starting without ServiceCIDRs", `"Synced" ipFamily="IPv4"`, `"Synced" ipFamily="IPv6"`); err != nil {
		e.fatalf(t, "dsproxy without the right to list ServiceCIDRs: %v", err)
	}
	t.Logf("without ServiceCIDRs: both families synced %v after start", time.Since(start).Round(time.Millisecond))
	if v4, v6 := unallocatedDrops(); v4+v6 != 0 {
		e.errorf(t, "%d and %d unallocated-ClusterIP drop rules (IPv4, IPv6) without ServiceCIDRs, want none", v4, v6)
	}

	setRules(orig.Rules)
	restored = true
	allowed(true)
	start = time.Now()
	// The reflector's retries back off to 30 s (up to 60 s with its jitter);
	// here, seconds after the restart, they are a few seconds apart.
	deadline := start.Add(90 * time.Second)
	for v4, v6 := unallocatedDrops(); v4 == 0 || v6 == 0; v4, v6 = unallocatedDrops() {
		if time.Now().After(deadline) {
			e.fatalf(t, "no unallocated-ClusterIP drop in both families 90 s after servicecidrs were allowed again")
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("the drop of unallocated ClusterIPs followed %v after servicecidrs were allowed again", time.Since(start).Round(time.Millisecond))
	e.checkAlive(t)
}

// testModeSwitch restarts dsproxy in iptables mode and then back in nftables
// mode while clients keep dialling a dual-stack Service's ClusterIPs (from the
// node and a pod) and NodePorts (from outside), and long-lived connections keep
// exchanging data: no connection may fail. In iptables mode dsproxy follows an
// endpoint change; each mode, once it has programmed both families, removes the
// other mode's rules.
func testModeSwitch(t *testing.T, e *env) {
	sel := map[string]string{"app": "mode"}
	vips, targets, echoes := e.trafficFixture(t, sel, corev1.ServiceTypeNodePort, "m1", "m2")
	// kernelState reports whether dsproxy's nftables tables and its iptables
	// chains are in the node.
	kernelState := func() (nftTables, iptChains bool) {
		out, _ := netns.Exec(e.c.Node, "nft", "list", "tables")
		nftTables = strings.Contains(out, "dsproxy")
		for _, save := range []string{"iptables-save", "ip6tables-save"} {
			out, _ := netns.Exec(e.c.Node, save)
			iptChains = iptChains || strings.Contains(out, "DSPROXY-SERVICES")
		}
		return nftTables, iptChains
	}
	waitKernel := func(wantNFT, wantIPT bool) {
		t.Helper()
		deadline := time.Now().Add(converge)
		for {
			n, i := kernelState()
			if n == wantNFT && i == wantIPT {
				return
			}
			if time.Now().After(deadline) {
				e.errorf(t, "dsproxy nftables tables present %v (want %v), DSPROXY- iptables chains present %v (want %v)", n, wantNFT, i, wantIPT)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	switchTo := func(mode string, args ...string) {
		t.Helper()
		old := e.cur()
		if err := old.stop(); err != nil {
			e.errorf(t, "dsproxy (pid %d) on SIGTERM: %v", old.pid, err)
		}
		e.mu.Lock()
		e.args = args
		e.mu.Unlock()
		start := time.Now()
		p := e.startDsproxy(t)
		if err := p.waitLog(30*time.Second, `"Synced" ipFamily="IPv4"`, `"Synced" ipFamily="IPv6"`); err != nil {
			e.errorf(t, "dsproxy in %s mode: %v", mode, err)
		}
		t.Logf("dsproxy (pid %d) in %s mode synced %v after start", p.pid, mode, time.Since(start).Round(time.Millisecond))
	}

	pr := startProber(20*time.Millisecond, targets, echoes)
	time.Sleep(300 * time.Millisecond)
	switchTo("iptables", "--proxy-mode", "iptables")
	waitKernel(false, true)
	e.addPods(t, sel, true, "m3")
	took, err := waitBackends(e.c.Node, vips, []string{"m1", "m2", "m3"}, converge)
	if err != nil {
		e.errorf(t, "iptables mode does not follow the endpoint change: %v", err)
	}
	t.Logf("iptables mode followed an endpoint change in %v", took.Round(time.Millisecond))
	checkNFAcctMetrics(t, e, targets)
	switchTo("nftables")
	waitKernel(true, false)
	if _, err := waitBackends(e.c.Node, vips, []string{"m1", "m2", "m3"}, converge); err != nil {
		e.errorf(t, "back in nftables mode: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	dials, failures := pr.finish()
	t.Logf("%d dials, %d long-lived pings across both switches", dials, echoes[0].n+echoes[1].n)
	if dials < 3*len(targets) {
		e.errorf(t, "only %d dials across the switches; the prober did not keep up", dials)
	}
	if len(failures) > 0 {
		e.errorf(t, "%d of %d connections failed across the mode switches:\n%s", len(failures), dials, strings.Join(failures, "\n"))
	}
	for _, ec := range echoes {
		if err := ec.ping(); err != nil {
			e.errorf(t, "long-lived connection after the switches: %v", err)
		}
	}
	e.checkAlive(t)
}

// testStartingEvent: as kube-proxy, dsproxy reports its start with a Starting
// Event about its Node (events.k8s.io/v1, reporting controller dsproxy).
func testStartingEvent(t *testing.T, e *env) {
	e.waitNodeEvent(t, "Starting", corev1.EventTypeNormal, "", 15*time.Second)
}

// waitNodeEvent waits for an Event dsproxy reported about the node with reason,
// type and a note containing note.
func (e *env) waitNodeEvent(t *testing.T, reason, typ, note string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		list, err := e.cp.Client.EventsV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			e.fatalf(t, "listing Events: %v", err)
		}
		for _, ev := range list.Items {
			if ev.Regarding.Kind == "Node" && ev.Regarding.Name == e.node && ev.Reason == reason &&
				ev.ReportingController == "dsproxy" && ev.Type == typ && strings.Contains(ev.Note, note) {
				t.Logf("Event: %s %s %s: %s", ev.Type, ev.Reason, ev.Regarding.Name, ev.Note)
				return
			}
		}
		if time.Now().After(deadline) {
			e.fatalf(t, "no %s %s Event about node %s (note with %q) among %d Events", typ, reason, e.node, note, len(list.Items))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// testBindAddressHardFail runs the binary as kube-proxy's --bind-address-hard-fail
// is run: with the metrics port, then the healthz port, held by another program,
// dsproxy must exit with an error naming the server and the address, and post
// kube-proxy's Event for it on the Node. Without the flag it must keep serving,
// and open the port once it is free (retrying every 5 s, as kube-proxy). The rules
// of the stopped dsproxy serve meanwhile; the subtest ends with dsproxy running as
// before.
func testBindAddressHardFail(t *testing.T, e *env) {
	hold := func(addr string) net.Listener {
		t.Helper()
		var l net.Listener
		if err := netns.RunIn(e.c.Node, func() (err error) {
			l, err = net.Listen("tcp", addr)
			return err
		}); err != nil {
			e.fatalf(t, "holding %s in the node: %v", addr, err)
		}
		return l
	}
	defer func() {
		e.mu.Lock()
		e.args = nil
		e.mu.Unlock()
	}()
	for _, c := range []struct{ server, addr, reason string }{
		{"metrics", "127.0.0.1:10249", "FailedToStartMetricServer"},
		{"healthz", "0.0.0.0:10256", "FailedToStartProxierHealthcheck"},
	} {
		if err := e.cur().stop(); err != nil {
			e.fatalf(t, "stopping dsproxy: %v", err)
		}
		l := hold(c.addr)
		e.mu.Lock()
		e.args = []string{"--bind-address-hard-fail"}
		e.mu.Unlock()
		p := e.startDsproxy(t)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			l.Close()
			e.fatalf(t, "dsproxy --bind-address-hard-fail still runs 30 s after start with %s (%s) held", c.server, c.addr)
		}
		var ee *exec.ExitError
		if !errors.As(p.err, &ee) || ee.ExitCode() == 0 {
			e.errorf(t, "dsproxy --bind-address-hard-fail with %s held: exit %v, want a failure status", c.addr, p.err)
		}
		want := fmt.Sprintf("%s server on %s", c.server, c.addr)
		if err := p.waitLog(0, want, "address already in use"); err != nil {
			e.errorf(t, "%v", err)
		}
		e.waitNodeEvent(t, c.reason, corev1.EventTypeWarning, want, 15*time.Second)

		// Without the flag: dsproxy serves, and the server opens once the port is free.
		e.mu.Lock()
		e.args = nil
		e.mu.Unlock()
		p = e.startDsproxy(t)
		if err := p.waitLog(30*time.Second, `"Synced" ipFamily="IPv4"`, `"Synced" ipFamily="IPv6"`, "Server failed; retrying"); err != nil {
			l.Close()
			e.fatalf(t, "dsproxy with %s held: %v", c.addr, err)
		}
		l.Close()
		path := "/metrics"
		if c.server == "healthz" {
			path = "/healthz"
		}
		url := "http://" + strings.Replace(c.addr, "0.0.0.0", "127.0.0.1", 1) + path
		deadline := time.Now().Add(15 * time.Second)
		for {
			out, err := netns.Exec(e.c.Node, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2", url)
			if err == nil && out == "200" {
				break
			}
			if time.Now().After(deadline) {
				e.fatalf(t, "%s not served 15 s after the port was freed: %q %v", url, out, err)
			}
			time.Sleep(500 * time.Millisecond)
		}
		e.checkAlive(t)
	}
}

// testConfigFileUpdated: kube-proxy v1.36 exits when its --config file is
// written or renamed, so that its DaemonSet restarts it with the new file, and
// goes on when a ConfigMap volume's update replaces the file (the kubelet swaps
// the volume's ..data link and removes the old directory). The real kube-proxy
// (nftables mode) is the oracle, then dsproxy must do the same; each leaves its
// rules serving when it exits.
func testConfigFileUpdated(t *testing.T, e *env) {
	sel := map[string]string{"app": "cfgwatch"}
	vips, _, _ := e.trafficFixture(t, sel, corev1.ServiceTypeClusterIP, "w1")
	const cidrs = "10.64.0.0/16,fd00:64::/56"
	const updated = "content of the proxy server's configuration file was updated"
	serves := func(who, when string) {
		t.Helper()
		if _, err := waitBackends(e.c.Node, vips, []string{"w1"}, converge); err != nil {
			e.errorf(t, "%s %s: %v", who, when, err)
		}
	}
	// volume lays content out as the kubelet lays out a ConfigMap volume; update
	// swaps in a copy as the kubelet's atomic writer does; change writes the
	// file in place.
	volume := func(content string) (path string, update, change func()) {
		dir := t.TempDir()
		gen := 0
		put := func() string {
			gen++
			ts := fmt.Sprintf("..2026_11_29_%d", gen)
			if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, ts, "config.conf"), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			return ts
		}
		if err := os.Symlink(put(), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		path = filepath.Join(dir, "config.conf")
		if err := os.Symlink("..data/config.conf", path); err != nil {
			t.Fatal(err)
		}
		update = func() {
			old, err := os.Readlink(filepath.Join(dir, "..data"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(put(), filepath.Join(dir, "..data_tmp")); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
				t.Fatal(err)
			}
		}
		change = func() {
			f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteString("# changed\n"); err != nil {
				t.Fatal(err)
			}
		}
		return path, update, change
	}
	// A started proxy: its exit channel and status, its log, and SIGTERM.
	type started struct {
		done    <-chan struct{}
		exitErr func() error
		log     func() string
		stop    func() error
	}
	read := func(file string) func() string {
		return func() string { data, _ := os.ReadFile(file); return string(data) }
	}
	// check: written in place, the file ends the proxy with a failure status and
	// the message; started again, the volume's update changes nothing (the file
	// it watched is gone, so a later write is not seen either). Its rules serve
	// all along.
	check := func(who string, start func() started, update, change func()) {
		t.Helper()
		p := start()
		serves(who, "before its configuration file was written")
		change()
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			e.fatalf(t, "%s still runs 15 s after its configuration file was written", who)
		}
		var ee *exec.ExitError
		if !errors.As(p.exitErr(), &ee) || ee.ExitCode() <= 0 {
			e.errorf(t, "%s after its configuration file was written: exit %v, want a failure status", who, p.exitErr())
		}
		if !strings.Contains(p.log(), updated) {
			e.errorf(t, "%s's log has no %q:\n%s", who, updated, framework.Tail(p.log(), 20))
		}
		serves(who, "after it exited")

		p = start()
		serves(who, "started again")
		update()
		change()
		select {
		case <-p.done:
			e.fatalf(t, "%s exited after the ConfigMap volume's update: %v\n%s", who, p.exitErr(), framework.Tail(p.log(), 20))
		case <-time.After(2 * time.Second):
		}
		if err := p.stop(); err != nil {
			e.errorf(t, "%s on SIGTERM: %v", who, err)
		}
	}

	if err := e.cur().stop(); err != nil {
		e.fatalf(t, "stopping dsproxy: %v", err)
	}
	if out, err := netns.Exec(e.c.Node, e.bin, "--cleanup"); err != nil {
		e.fatalf(t, "dsproxy --cleanup: %v\n%s", err, out)
	}
	path, update, change := volume(framework.KubeProxyConfig(e.cp.LinkKubeconfig, e.node, "nftables", cidrs, "127.0.0.1:10349", "127.0.0.1:10356"))
	check("kube-proxy", func() started {
		kp := startKubeProxyFile(t, e, "nftables", path)
		// Its watch is on once its flags are logged (-v=2): before, the rules of
		// an earlier run may serve and the volume's update race the watch.
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(read(kp.log)(), "FLAG: --config=") {
			if time.Now().After(deadline) {
				e.fatalf(t, "kube-proxy logged no flags 30 s after start:\n%s", kp.tail())
			}
			time.Sleep(50 * time.Millisecond)
		}
		return started{kp.done, func() error { return kp.err }, read(kp.log), kp.stop}
	}, update, change)

	path, update, change = volume(framework.KubeProxyConfig(e.kubecfg, e.node, "nftables", cidrs, "127.0.0.1:10249", "0.0.0.0:10256"))
	defer func() {
		e.mu.Lock()
		e.args = nil
		e.mu.Unlock()
	}()
	first := true
	check("dsproxy", func() started {
		e.mu.Lock()
		e.args = []string{"--config", path}
		if first { // kube-proxy's rules are still there
			e.args = append(e.args, "--cleanup-kube-proxy")
		}
		e.mu.Unlock()
		p := e.startDsproxy(t)
		want := `"Synced" ipFamily="IPv4"`
		if first {
			want = `"Removed kube-proxy's state" errors=false`
		}
		first = false
		if err := p.waitLog(30*time.Second, want); err != nil {
			e.fatalf(t, "dsproxy --config: %v", err)
		}
		return started{p.done, func() error { return p.err }, read(p.log), p.stop}
	}, update, change)

	e.mu.Lock()
	e.args = nil
	e.mu.Unlock()
	p := e.startDsproxy(t)
	if err := p.waitLog(30*time.Second, `"Synced" ipFamily="IPv4"`, `"Synced" ipFamily="IPv6"`); err != nil {
		e.fatalf(t, "dsproxy restarted: %v", err)
	}
	e.checkAlive(t)
}

// testNodeWithoutAddresses: the proxy's Node lists no addresses (a cloud node
// before its cloud controller sets them). kube-proxy waits 30 s for them, then
// takes loopback as each family's node IP, so its "primary" NodePort addresses
// (the nftables default) are every local address; dsproxy must do the same and
// serve the NodePort on every address of the node (it took the node IPs from an
// interface before, at once, and served NodePorts on that address alone). Once
// the Node lists its addresses, dsproxy narrows NodePorts to the primary ones
// (kube-proxy keeps what it started with until restarted).
func testNodeWithoutAddresses(t *testing.T, e *env) {
	sel := map[string]string{"app": "noaddr"}
	e.addPods(t, sel, true, "n1")
	svc := e.createService(t, service("noaddr", corev1.ServiceTypeNodePort, nil, sel, tcpHTTP))
	np := nodePort(svc, "tcp")
	out, err := netns.Exec(e.c.Node, "ip", "-o", "addr", "show", "scope", "global")
	if err != nil {
		e.fatalf(t, "node addresses: %v: %s", err, out)
	}
	var primary, others []netip.AddrPort
	seen := map[netip.Addr]bool{}
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] != "inet" && f[i] != "inet6" {
				continue
			}
			p, err := netip.ParsePrefix(f[i+1])
			if err != nil || seen[p.Addr()] { // the node IPs are on every pod's link
				continue
			}
			seen[p.Addr()] = true
			dst := netip.AddrPortFrom(p.Addr(), np)
			if p.Addr() == nodeIP(familyOf(p.Addr())) {
				primary = append(primary, dst)
			} else {
				others = append(others, dst)
			}
		}
	}
	if len(primary) != 2 || len(others) < 2 {
		e.fatalf(t, "node addresses: want both node IPs and others; got %v and %v from\n%s", primary, others, out)
	}

	node := e.node + "-noaddr"
	if _, err := e.cp.Client.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.cp.Client.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{})
	})
	if err := e.cur().stop(); err != nil {
		e.fatalf(t, "stopping dsproxy: %v", err)
	}
	e.mu.Lock()
	e.args = []string{"--hostname-override", node}
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.args = nil
		e.mu.Unlock()
	}()
	p := e.startDsproxy(t)
	if err := p.waitLog(70*time.Second, "Timed out waiting for node to be assigned IPs", `"Synced" ipFamily="IPv4"`, `"Synced" ipFamily="IPv6"`, "Can't determine this node's IP, assuming loopback"); err != nil {
		e.fatalf(t, "dsproxy on a Node without addresses: %v", err)
	}
	all := append(slices.Clone(primary), others...)
	if _, err := waitBackends(e.external, all, []string{"n1"}, converge); err != nil {
		e.errorf(t, "NodePort on every node address, the Node listing none: %v", err)
	}

	patch := fmt.Sprintf(`{"status":{"addresses":[{"type":"InternalIP","address":%q},{"type":"InternalIP","address":%q}]}}`,
		netns.NodeIPv4, netns.NodeIPv6)
	if _, err := e.cp.Client.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	if _, err := waitBackends(e.external, others, nil, converge); err != nil {
		e.errorf(t, "NodePort on addresses other than the node IPs, once the Node lists them: %v", err)
	}
	if _, err := waitBackends(e.external, primary, []string{"n1"}, converge); err != nil {
		e.errorf(t, "NodePort on the node IPs, once the Node lists them: %v", err)
	}

	e.mu.Lock()
	e.args = nil
	e.mu.Unlock()
	if err := p.stop(); err != nil {
		e.errorf(t, "dsproxy on SIGTERM: %v", err)
	}
	p = e.startDsproxy(t)
	if err := p.waitLog(30*time.Second, `"Synced" ipFamily="IPv4"`, `"Synced" ipFamily="IPv6"`); err != nil {
		e.fatalf(t, "dsproxy restarted: %v", err)
	}
	e.checkAlive(t)
}

// testKubeProxyTakeover is the migration from kube-proxy, for its iptables and
// nftables modes: the real kube-proxy v1.36 serves a Service, then stops as
// when its DaemonSet is deleted (its rules stay and keep serving), and dsproxy
// starts with --cleanup-kube-proxy while clients keep dialling the ClusterIPs
// and a NodePort, and connections kube-proxy translated keep exchanging data.
// No connection may fail; once dsproxy has programmed both families, nothing of
// kube-proxy is left in the kernel while the kubelet's and another program's
// KUBE- chains stay, and dsproxy follows an endpoint change. (TestIPVSTakeover,
// in the guest, does the same from kube-proxy's IPVS mode.)
func testKubeProxyTakeover(t *testing.T, e *env) {
	kubeProxyTakeover(t, e, []takeoverPath{{kp: "iptables", ds: "nftables"}, {kp: "iptables", ds: "iptables"}, {kp: "nftables", ds: "nftables"}})
}

// takeoverPath is one migration: kube-proxy in mode kp, then dsproxy in mode ds.
type takeoverPath struct {
	kp, ds string
	// ipvsLeaves: the takeover removes IPVS's translation of the connections
	// kube-proxy's virtual servers carry (dsproxy leaves IPVS mode): those
	// connections end, and the node's own dials may lose one in flight as the
	// ClusterIPs leave kube-ipvs0 (README: leaving IPVS mode). New connections
	// from pods and outside must still all succeed.
	ipvsLeaves bool
}

func kubeProxyTakeover(t *testing.T, e *env, paths []takeoverPath) {
	sel := map[string]string{"app": "takeover"}
	vips, targets, _ := e.trafficFixture(t, sel, corev1.ServiceTypeNodePort, "t1", "t2")
	pods := []string{"t1", "t2"}
	within := converge
	for _, path := range paths {
		if path.kp == "ipvs" || path.ds == "ipvs" {
			within = 2 * time.Minute // the guest, under emulation
		}
	}
	kubeProxyState := func() (state string) {
		if out, _ := netns.Exec(e.c.Node, "nft", "list", "tables"); strings.Contains(out, "kube-proxy") {
			state += " nftables table kube-proxy;"
		}
		for _, save := range []string{"iptables-save", "ip6tables-save"} {
			if out, _ := netns.Exec(e.c.Node, save); strings.Contains(out, "KUBE-SERVICES") {
				state += " " + save + " KUBE-SERVICES;"
			}
		}
		if _, err := netns.Exec(e.c.Node, "ip", "link", "show", "kube-ipvs0"); err == nil {
			state += " link kube-ipvs0;"
		}
		if out, _ := netns.Exec(e.c.Node, "ipset", "list", "-n"); strings.Contains(out, "KUBE-") {
			state += " ipsets KUBE-*;"
		}
		return state
	}
	// The kubelet's chains and another program's KUBE- chain (kube-router's
	// network policy) are not kube-proxy's: the takeover must leave them.
	others := `*mangle
:KUBE-IPTABLES-HINT - [0:0]
:KUBE-KUBELET-CANARY - [0:0]
COMMIT
*filter
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-ROUTER-INPUT - [0:0]
-A INPUT -m comment --comment "kube-router netpol" -j KUBE-ROUTER-INPUT
-A KUBE-ROUTER-INPUT -p tcp -m tcp --dport 22 -j ACCEPT
COMMIT
`
	for _, restore := range []string{"iptables-restore", "ip6tables-restore"} {
		if out, err := netns.ExecStdin(e.c.Node, strings.NewReader(others), restore, "--noflush"); err != nil {
			e.fatalf(t, "%s: %v\n%s", restore, err, out)
		}
	}
	othersLeft := func(after string) {
		t.Helper()
		for _, save := range []string{"iptables-save", "ip6tables-save"} {
			out, _ := netns.Exec(e.c.Node, save)
			want := []string{":KUBE-IPTABLES-HINT", ":KUBE-KUBELET-CANARY", "-j KUBE-ROUTER-INPUT", "-A KUBE-ROUTER-INPUT -p tcp"}
			if after == "iptables" {
				// kube-proxy's iptables mode makes the kubelet's KUBE-FIREWALL
				// too, and its own cleanup leaves it.
				want = append(want, "-A INPUT -j KUBE-FIREWALL")
			}
			for _, w := range want {
				if !strings.Contains(out, w) {
					e.errorf(t, "%s after the takeover from kube-proxy's %s mode: %q is gone; it is not kube-proxy's", save, after, w)
				}
			}
		}
	}
	for i, path := range paths {
		mode := path.kp
		// Hand the node to kube-proxy alone.
		if err := e.cur().stop(); err != nil {
			e.fatalf(t, "stopping dsproxy: %v", err)
		}
		if out, err := netns.Exec(e.c.Node, e.bin, "--cleanup"); err != nil {
			e.fatalf(t, "dsproxy --cleanup: %v\n%s", err, out)
		}
		kp := startKubeProxy(t, e, mode)
		if _, err := waitBackends(e.c.Node, vips, pods, within); err != nil {
			kp.stop()
			e.fatalf(t, "kube-proxy %s mode does not serve: %v\n%s", mode, err, kp.tail())
		}
		if mode == "ipvs" {
			// Its virtual servers serve before its first sync has written its
			// iptables rules (minutes under emulation): hand over a node with both.
			if missing := waitKubeProxyIPVSRules(e, 4*time.Minute); len(missing) > 0 {
				t.Logf("kube-proxy %s mode has no rules in %v's KUBE-SERVICES after 4 min; taking over without them; its errors:\n%s", mode, missing, kp.errors())
			}
		}
		kpMetrics := metricFamilies(t, e, "127.0.0.1:10349")
		kpPages := metricsPortPages(t, e, "127.0.0.1:10349")
		if err := kp.stop(); err != nil {
			e.fatalf(t, "kube-proxy on SIGTERM: %v", err)
		}
		if kubeProxyState() == "" {
			e.fatalf(t, "kube-proxy %s mode left nothing in the kernel", mode)
		}
		var echoes, ipvsEchoes []*echoConn
		for _, vip := range vips {
			echo := netip.AddrPortFrom(vip.Addr(), echoPort)
			ec, err := openEcho(e.c.Node, echo)
			if err != nil {
				e.fatalf(t, "long-lived connection to %s through kube-proxy's rules: %v", echo, err)
			}
			defer ec.c.Close()
			if path.ipvsLeaves {
				ipvsEchoes = append(ipvsEchoes, ec) // pinged once, after
			} else {
				echoes = append(echoes, ec)
			}
		}
		strict, fromNode := targets, []probeTarget(nil)
		if path.ipvsLeaves {
			strict, fromNode = splitFrom(targets, e.c.Node)
		}
		pr := startProber(20*time.Millisecond, strict, echoes)
		var prNode *prober
		if len(fromNode) > 0 {
			prNode = startProber(20*time.Millisecond, fromNode, nil)
		}
		time.Sleep(300 * time.Millisecond)
		e.mu.Lock()
		e.args = []string{"--cleanup-kube-proxy", "--proxy-mode", path.ds}
		e.mu.Unlock()
		start := time.Now()
		p := e.startDsproxy(t)
		if err := p.waitLog(within, `"Removed kube-proxy's state" errors=false`); err != nil {
			e.errorf(t, "after kube-proxy %s mode: %v", mode, err)
		}
		t.Logf("dsproxy in %s mode removed kube-proxy %s mode's state %v after start", path.ds, mode, time.Since(start).Round(time.Millisecond))
		if left := kubeProxyState(); left != "" {
			e.errorf(t, "kube-proxy state left after dsproxy took over from its %s mode:%s", mode, left)
		}
		othersLeft(mode)
		checkMetricParity(t, e, kpMetrics, metricFamilies(t, e, "127.0.0.1:10249"), path.kp == path.ds)
		checkPagesParity(t, e, kpPages, metricsPortPages(t, e, "127.0.0.1:10249"))
		added := fmt.Sprintf("t%d", i+3)
		e.addPods(t, sel, true, added)
		pods = append(pods, added)
		if _, err := waitBackends(e.c.Node, vips, pods, within); err != nil {
			e.errorf(t, "dsproxy after kube-proxy %s mode does not follow an endpoint change: %v", mode, err)
		}
		time.Sleep(300 * time.Millisecond)
		dials, failures := pr.finish()
		pings := 0
		for _, ec := range echoes {
			pings += ec.n
		}
		t.Logf("kube-proxy %s mode to dsproxy %s mode: %d dials, %d long-lived pings across the takeover", mode, path.ds, dials, pings)
		if dials < 3*len(strict) {
			e.errorf(t, "only %d dials across the takeover; the prober did not keep up", dials)
		}
		if len(failures) > 0 {
			e.errorf(t, "%d of %d connections failed while dsproxy took over from kube-proxy's %s mode:\n%s", len(failures), dials, mode, strings.Join(failures, "\n"))
		}
		if prNode != nil {
			nodeDials, nodeFailures := prNode.finish()
			t.Logf("from the node: %d dials, %d failed across the takeover:\n%s", nodeDials, len(nodeFailures), strings.Join(nodeFailures, "\n"))
			if nodeDials < 3*len(fromNode) || len(nodeFailures) > nodeDials/10 {
				e.errorf(t, "from the node: %d dials, %d failed across the takeover", nodeDials, len(nodeFailures))
			}
			if _, err := waitBackends(e.c.Node, vips, pods, within); err != nil {
				e.errorf(t, "from the node after the takeover: %v", err)
			}
		}
		for _, ec := range echoes {
			if err := ec.ping(); err != nil {
				e.errorf(t, "connection kube-proxy translated, after the takeover: %v", err)
			}
		}
		for _, ec := range ipvsEchoes {
			// Expected to end with IPVS's state; logged, not required.
			t.Logf("connection kube-proxy's virtual server carried, after dsproxy left IPVS: ping error %v", ec.ping())
		}
	}
	e.mu.Lock()
	e.args = nil
	e.mu.Unlock()
	e.checkAlive(t)
}

// splitFrom splits targets into those dialled from elsewhere and those dialled
// from ns.
func splitFrom(targets []probeTarget, ns *netns.NS) (others, from []probeTarget) {
	for _, tg := range targets {
		if tg.from == ns {
			from = append(from, tg)
		} else {
			others = append(others, tg)
		}
	}
	return others, from
}

// waitKubeProxyIPVSRules waits, up to within per family, until kube-proxy's IPVS
// mode has written its iptables rules (KUBE-SERVICES in nat), and returns the
// iptables-save commands of the families still without them.
func waitKubeProxyIPVSRules(e *env, within time.Duration) (missing []string) {
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		deadline := time.Now().Add(within)
		out, _ := netns.Exec(e.c.Node, save, "-t", "nat")
		for !strings.Contains(out, "-A KUBE-SERVICES ") && time.Now().Before(deadline) {
			time.Sleep(2 * time.Second)
			out, _ = netns.Exec(e.c.Node, save, "-t", "nat")
		}
		if !strings.Contains(out, "-A KUBE-SERVICES ") {
			missing = append(missing, save)
		}
	}
	return missing
}

// waitKubeProxyCaughtUp waits until, in each family, kube-proxy (metrics on
// 127.0.0.1:10349 in the node) has ended a sync after the last one it queued:
// kubeproxy_sync_proxy_rules_last_timestamp_seconds at or past
// kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds, and at or after
// after (zero: any). Its first sync can run without the node's zone: a Node
// event during a sync queues another, which the timestamps show, but one not
// delivered yet queues nothing, so the caller passes the time the zone was
// handed over (kubeProxyProc.topologyChange). Under the guest's emulation an
// IPVS sync takes minutes. It returns the families ("iptables-save",
// "ip6tables-save", as waitKubeProxyIPVSRules) still behind after within.
func waitKubeProxyCaughtUp(e *env, after time.Time, within time.Duration) (behind []string) {
	value := regexp.MustCompile(`(?m)^kubeproxy_sync_proxy_rules_last_(queued_)?timestamp_seconds\{ip_family="(IPv[46])"\} (\S+)$`)
	caughtUp := func() map[string]bool {
		out, err := netns.Exec(e.c.Node, "curl", "-sf", "--max-time", "5", "http://127.0.0.1:10349/metrics")
		if err != nil {
			return nil
		}
		synced, queued := map[string]float64{}, map[string]float64{}
		for _, m := range value.FindAllStringSubmatch(out, -1) {
			v, err := strconv.ParseFloat(m[3], 64)
			if err != nil {
				continue
			}
			if m[1] == "" {
				synced[m[2]] = v
			} else {
				queued[m[2]] = v
			}
		}
		ok := map[string]bool{}
		for f, q := range queued {
			if s, has := synced[f]; has && s >= q && s >= float64(after.UnixMicro())/1e6 {
				ok[f] = true
			}
		}
		return ok
	}
	deadline := time.Now().Add(within)
	ok := caughtUp()
	for (!ok["IPv4"] || !ok["IPv6"]) && time.Now().Before(deadline) {
		time.Sleep(time.Second)
		ok = caughtUp()
	}
	if !ok["IPv4"] {
		behind = append(behind, "iptables-save")
	}
	if !ok["IPv6"] {
		behind = append(behind, "ip6tables-save")
	}
	return behind
}

// metricFamily is one metric family on a /metrics page: its type and the
// label names its samples carry (a histogram's "le" left out).
type metricFamily struct {
	typ    string
	labels string // sorted, comma-separated
}

// metricFamilies scrapes a proxy's /metrics in the node.
func metricFamilies(t *testing.T, e *env, addr string) map[string]metricFamily {
	t.Helper()
	out, err := netns.Exec(e.c.Node, "curl", "-sf", "http://"+addr+"/metrics")
	if err != nil {
		e.fatalf(t, "scraping %s/metrics: %v: %s", addr, err, out)
	}
	m := map[string]metricFamily{}
	labelName := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			m[f[2]] = metricFamily{typ: f[3]}
			continue
		}
		name, labels, ok := strings.Cut(strings.TrimSpace(line), "{")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
			mf, ok := m[strings.TrimSuffix(name, suffix)]
			if !ok || (suffix != "" && mf.typ != "histogram") {
				continue
			}
			var names []string
			for _, l := range labelName.FindAllStringSubmatch(labels[:strings.LastIndex(labels, "}")], -1) {
				if l[1] != "le" {
					names = append(names, l[1])
				}
			}
			slices.Sort(names)
			mf.labels = strings.Join(names, ",")
			m[strings.TrimSuffix(name, suffix)] = mf
			break
		}
	}
	return m
}

// metricsPortPaths are the metrics port's paths whose answers
// checkPagesParity compares; bodyChecked are those whose body it compares too.
var (
	metricsPortPaths = []string{"/healthz", "/healthz?verbose", "/healthz?verbose&exclude=ping&exclude=nope", "/healthz/ping",
		"/metrics/slis", "/flagz", "/statusz", "/configz", "/proxyMode", "/livez", "/readyz", "/debug/pprof", "/debug/pprof/",
		"/debug/flags/v", "/nothing-here",
		// path, a space, then the Accept header to send
		"/flagz application/json", flagzJSON,
		"/statusz text/plain", statuszJSON}
	flagzJSON   = "/flagz application/json;as=Flagz;v=v1beta1;g=config.k8s.io"
	statuszJSON = "/statusz application/json;as=Statusz;v=v1beta1;g=config.k8s.io"
	bodyChecked = []string{"/healthz", "/healthz?verbose", "/healthz?verbose&exclude=ping&exclude=nope", "/healthz/ping"}
)

// metricsPortPages asks a proxy's metrics port for each of metricsPortPaths, in
// order (so /metrics/slis follows a /healthz), and returns the status code and
// body of each; for /metrics/slis the body is its kubernetes_healthcheck line.
func metricsPortPages(t *testing.T, e *env, addr string) map[string]string {
	t.Helper()
	pages := map[string]string{}
	for _, p := range metricsPortPaths {
		args := []string{"-s", "--max-time", "5", "-w", "\n%{http_code}"}
		path, accept, ok := strings.Cut(p, " ")
		if ok {
			args = append(args, "-H", "Accept: "+accept)
		}
		out, err := netns.Exec(e.c.Node, "curl", append(args, "http://"+addr+path)...)
		if err != nil {
			e.fatalf(t, "GET %s%s: %v: %s", addr, p, err, out)
		}
		i := strings.LastIndex(out, "\n")
		body, code := out[:i], out[i+1:]
		switch {
		case slices.Contains(bodyChecked, p):
			pages[p] = code + " " + body
		case p == flagzJSON:
			// The status, and the names of the flags listed (the text form's
			// separator is random), but for those only one of the proxies has:
			// dsproxy's own, and kube-proxy's cobra "help".
			var flagz struct {
				Flags map[string]string `json:"flags"`
			}
			if err := json.Unmarshal([]byte(body), &flagz); err != nil {
				e.fatalf(t, "GET %s%s: %v: %s", addr, p, err, body)
			}
			var names []string
			for name := range flagz.Flags {
				if !slices.Contains([]string{"node-ip", "cleanup-kube-proxy", "help"}, name) {
					names = append(names, name)
				}
			}
			slices.Sort(names)
			pages[p] = code + " " + strings.Join(names, " ")
		case p == statuszJSON:
			// The status, the fields, the paths listed and the emulation version.
			var statusz map[string]any
			if err := json.Unmarshal([]byte(body), &statusz); err != nil {
				e.fatalf(t, "GET %s%s: %v: %s", addr, p, err, body)
			}
			pages[p] = fmt.Sprintf("%s %v paths=%v emulationVersion=%v", code, slices.Sorted(maps.Keys(statusz)), statusz["paths"], statusz["emulationVersion"])
		case p == "/metrics/slis":
			line := ""
			for l := range strings.Lines(body) {
				if strings.HasPrefix(l, "kubernetes_healthcheck{") {
					line = strings.TrimSpace(l)
				}
			}
			pages[p] = code + " " + line
		default:
			pages[p] = code
		}
	}
	return pages
}

// checkPagesParity: dsproxy's metrics port answers each path as kube-proxy's
// did: the same status, the health pages the same body, /metrics/slis the same
// health check line, and /flagz the same flags.
func checkPagesParity(t *testing.T, e *env, kp, ds map[string]string) {
	t.Helper()
	for _, p := range metricsPortPaths {
		if kp[p] != ds[p] {
			e.errorf(t, "metrics port %s: kube-proxy answered %q, dsproxy %q", p, kp[p], ds[p])
		}
	}
	t.Logf("metrics port pages, as kube-proxy's: %v", kp)
}

// checkMetricParity: the metric families kube-proxy exported before the
// takeover (kp) that dashboards and alerts use are on dsproxy's /metrics (ds)
// with the same type and label names: kube-proxy's own (kubeproxy_*, when both
// ran in one mode, as the set depends on the mode), client-go's rest_client_*,
// the Go runtime's and the process's, and kubernetes_build_info. Not exported,
// and logged: component-base's bookkeeping of its own metrics
// (registered_metrics_total, ...), kubernetes_feature_enabled, the go_godebug_*
// counters, and apiserver_* and aggregator_* that kube-proxy's binary links in.
func checkMetricParity(t *testing.T, e *env, kp, ds map[string]metricFamily, sameMode bool) {
	t.Helper()
	var skipped []string
	checked := 0
	for _, name := range slices.Sorted(maps.Keys(kp)) {
		want := kp[name]
		switch {
		case strings.HasPrefix(name, "kubeproxy_") && !sameMode:
			continue
		case strings.HasPrefix(name, "go_godebug_"),
			!slices.ContainsFunc([]string{"kubeproxy_", "rest_client_", "go_", "process_", "kubernetes_build_info"},
				func(p string) bool { return strings.HasPrefix(name, p) }):
			if _, ok := ds[name]; !ok {
				skipped = append(skipped, name)
			}
			continue
		}
		checked++
		got, ok := ds[name]
		switch {
		case !ok:
			e.errorf(t, "kube-proxy exports %s (%s), dsproxy does not", name, want.typ)
		case got.typ != want.typ:
			e.errorf(t, "%s: kube-proxy's is a %s, dsproxy's a %s", name, want.typ, got.typ)
		case want.labels != "" && got.labels != "" && got.labels != want.labels:
			e.errorf(t, "%s: kube-proxy's labels are {%s}, dsproxy's {%s}", name, want.labels, got.labels)
		}
	}
	t.Logf("%d of kube-proxy's %d metric families checked on dsproxy's /metrics; %d not exported: %s",
		checked, len(kp), len(skipped), strings.Join(skipped, " "))
}

// kubeProxyProc is a kube-proxy process in the node.
type kubeProxyProc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error // Wait's result, after done
}

// startKubeProxy runs the control plane's kube-proxy v1.36 in the node in mode,
// as the node's DaemonSet would.
func startKubeProxy(t *testing.T, e *env, mode string) *kubeProxyProc {
	t.Helper()
	return startKubeProxyConfig(t, e, mode, "")
}

// startKubeProxyConfig is startKubeProxy with more top-level fields of the
// KubeProxyConfiguration (YAML lines).
func startKubeProxyConfig(t *testing.T, e *env, mode, extra string) *kubeProxyProc {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "kube-proxy.yaml")
	y := framework.KubeProxyConfig(e.cp.LinkKubeconfig, e.node, mode, "10.64.0.0/16,fd00:64::/56", "127.0.0.1:10349", "127.0.0.1:10356") + extra
	if err := os.WriteFile(cfg, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	return startKubeProxyFile(t, e, mode, cfg)
}

// startKubeProxyFile runs kube-proxy with the configuration file cfg, whose mode
// is mode.
func startKubeProxyFile(t *testing.T, e *env, mode, cfg string) *kubeProxyProc {
	t.Helper()
	kp := &kubeProxyProc{log: filepath.Join(e.dir, "kube-proxy-"+mode+".log"), done: make(chan struct{})}
	for i := 2; ; i++ { // a later run in the same mode keeps the earlier log
		if _, err := os.Stat(kp.log); err != nil {
			break
		}
		kp.log = filepath.Join(e.dir, fmt.Sprintf("kube-proxy-%s-%d.log", mode, i))
	}
	f, err := os.Create(kp.log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// config.go at 4 logs the calls of its handlers, the node's zone among
	// them (topologyChange).
	kp.cmd = exec.Command("ip", "netns", "exec", e.c.Node.NetnsName, filepath.Join(e.cp.Bin, "kube-proxy"), "--config", cfg, "-v=2", "--vmodule=config=4")
	kp.cmd.Stdout, kp.cmd.Stderr = f, f
	if err := kp.cmd.Start(); err != nil {
		t.Fatalf("start kube-proxy: %v", err)
	}
	go func() {
		kp.err = kp.cmd.Wait()
		close(kp.done)
	}()
	t.Cleanup(func() { _ = kp.stop() })
	return kp
}

// stop sends SIGTERM and waits (SIGKILL after 15 s); kube-proxy leaves its rules.
func (kp *kubeProxyProc) stop() error {
	_ = kp.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-kp.done:
		var exit *exec.ExitError
		if errors.As(kp.err, &exit) && exit.ExitCode() == -1 {
			return nil // killed by the signal: its way of stopping
		}
		return kp.err
	case <-time.After(15 * time.Second):
		_ = kp.cmd.Process.Kill()
		<-kp.done
		return fmt.Errorf("kube-proxy ignored SIGTERM for 15s; killed")
	}
}

func (kp *kubeProxyProc) tail() string {
	data, _ := os.ReadFile(kp.log)
	return framework.Tail(string(data), 30)
}

// klogHeader is the start of a klog text line: severity, month and day, time
// of day.
var klogHeader = regexp.MustCompile(`^[IWEF](\d{4} \d{2}:\d{2}:\d{2}\.\d{6}) `)

// topologyChange waits up to within for kube-proxy to log the n-th time it
// hands the node's topology labels (its zone) to its proxier, and returns when
// it logged that. kube-proxy learns the zone from its Node informer alone,
// whose event may come after its first sync. ok is false when fewer than n
// such lines came.
func (kp *kubeProxyProc) topologyChange(within time.Duration, n int) (at time.Time, ok bool) {
	deadline := time.Now().Add(within)
	for {
		data, _ := os.ReadFile(kp.log)
		seen := 0
		for line := range strings.Lines(string(data)) {
			if !strings.Contains(line, "Calling handler.OnTopologyChange") {
				continue
			}
			m := klogHeader.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			now := time.Now()
			at, err := time.ParseInLocation("0102 15:04:05.000000", m[1], time.Local)
			if err != nil {
				continue
			}
			at = at.AddDate(now.Year(), 0, 0)
			if at.After(now.Add(time.Hour)) { // logged last year, read after New Year
				at = at.AddDate(-1, 0, 0)
			}
			if seen++; seen == n {
				return at, true
			}
		}
		if time.Now().After(deadline) {
			return time.Time{}, false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// errors returns the last 20 error lines of kube-proxy's log.
func (kp *kubeProxyProc) errors() string {
	data, _ := os.ReadFile(kp.log)
	var errs []string
	for line := range strings.Lines(string(data)) {
		if strings.HasPrefix(line, "E") {
			errs = append(errs, line)
		}
	}
	return strings.Join(errs[max(0, len(errs)-20):], "")
}

// checkNFAcctMetrics checks the iptables mode's nfacct-backed metrics
// (kube-proxy's names): a connection to the IPv4 NodePort of targets on
// 127.0.0.1 counts as an accepted localhost NodePort connection, and the
// invalid-drop counter is exported.
func checkNFAcctMetrics(t *testing.T, e *env, targets []probeTarget) {
	t.Helper()
	var np uint16
	for _, tg := range targets {
		if tg.from == e.external && tg.dst.Addr().Is4() {
			np = tg.dst.Port()
		}
	}
	scrape := func(name string) (uint64, bool) {
		t.Helper()
		out, err := netns.Exec(e.c.Node, "curl", "-sf", "http://127.0.0.1:10249/metrics")
		if err != nil {
			e.fatalf(t, "scraping dsproxy's metrics: %v: %s", err, out)
		}
		m := regexp.MustCompile(`(?m)^` + name + ` (\d+)$`).FindStringSubmatch(out)
		if m == nil {
			return 0, false
		}
		v, err := strconv.ParseUint(m[1], 10, 64)
		return v, err == nil
	}
	const localNP = "kubeproxy_iptables_localhost_nodeports_accepted_packets_total"
	before, ok := scrape(localNP)
	if !ok {
		e.errorf(t, "iptables mode exports no %s", localNP)
	}
	if _, err := netns.Dial(e.c.Node, netns.TCP, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), np), dialTimeout); err != nil {
		e.errorf(t, "NodePort %d on 127.0.0.1 in iptables mode: %v", np, err)
	}
	if after, _ := scrape(localNP); after != before+1 {
		e.errorf(t, "%s went from %d to %d over one connection, want +1", localNP, before, after)
	}
	if _, ok := scrape("kubeproxy_iptables_ct_state_invalid_dropped_packets_total"); !ok {
		e.errorf(t, "iptables mode exports no kubeproxy_iptables_ct_state_invalid_dropped_packets_total")
	}
}

// trafficFixture starts ready pods with labels sel, creates a dual-stack Service
// of typ over them (named after sel's "app") with an HTTP and an echo port, waits
// until both families' ClusterIPs reach every pod, and opens a long-lived echo
// connection from the node per family. targets are the ClusterIPs from the node
// and from a pod, and a NodePort's from outside.
func (e *env) trafficFixture(t *testing.T, sel map[string]string, typ corev1.ServiceType, pods ...string) (vips []netip.AddrPort, targets []probeTarget, echoes []*echoConn) {
	t.Helper()
	e.addPods(t, sel, true, pods...)
	svc := e.createService(t, service(sel["app"], typ, nil, sel, tcpHTTP, tcpEcho))
	for _, f := range families {
		vip, _ := clusterIP(svc, f, svcPort)
		vips = append(vips, vip)
		targets = append(targets, probeTarget{e.c.Node, vip}, probeTarget{e.client, vip})
		if typ == corev1.ServiceTypeNodePort {
			targets = append(targets, probeTarget{e.external, netip.AddrPortFrom(nodeIP(f), nodePort(svc, "tcp"))})
		}
	}
	if _, err := waitBackends(e.c.Node, vips, pods, 15*time.Second); err != nil {
		e.fatalf(t, "%s before the test: %v", sel["app"], err)
	}
	for _, f := range families {
		echo, _ := clusterIP(svc, f, echoPort)
		ec, err := openEcho(e.c.Node, echo)
		if err != nil {
			e.fatalf(t, "long-lived connection to %s: %v", echo, err)
		}
		t.Cleanup(func() { ec.c.Close() })
		echoes = append(echoes, ec)
	}
	return vips, targets, echoes
}

// testAPIServerRestart: kube-apiserver is killed and started again. dsproxy
// keeps serving its rules throughout, does not restart, and its informers
// recover: a Service and an endpoint created after the restart are programmed.
func testAPIServerRestart(t *testing.T, e *env) {
	// Other test processes sharing the control plane (e.g. the framework
	// package's tests when packages run in parallel) would see the outage.
	deadline := time.Now().Add(90 * time.Second)
	for len(e.cp.OtherLeases()) > 0 {
		if time.Now().After(deadline) {
			t.Skipf("other test processes %v still use the control plane; not restarting its API server", e.cp.OtherLeases())
		}
		time.Sleep(time.Second)
	}
	sel := map[string]string{"app": "api"}
	e.addPods(t, sel, true, "k1")
	svc := e.createService(t, service("api", corev1.ServiceTypeClusterIP, nil, sel, tcpHTTP))
	var vips []netip.AddrPort
	var targets []probeTarget
	for _, f := range families {
		vip, _ := clusterIP(svc, f, svcPort)
		vips = append(vips, vip)
		targets = append(targets, probeTarget{e.c.Node, vip})
	}
	if _, err := waitBackends(e.c.Node, vips, []string{"k1"}, 15*time.Second); err != nil {
		e.fatalf(t, "before the restart: %v", err)
	}
	p := e.cur()
	pr := startProber(50*time.Millisecond, targets, nil)
	down, err := e.cp.RestartAPIServer(context.Background())
	if err != nil {
		pr.finish()
		e.fatalf(t, "%v", err)
	}
	// Keep probing a little after the restart, while the informers reconnect.
	time.Sleep(time.Second)
	dials, failures := pr.finish()
	t.Logf("kube-apiserver down for %v; %d dials meanwhile", down.Round(time.Millisecond), dials)
	if len(failures) > 0 {
		e.errorf(t, "%d of %d connections failed while the API server restarted:\n%s", len(failures), dials, strings.Join(failures, "\n"))
	}
	if e.cur() != p || p.exited() {
		e.fatalf(t, "dsproxy (pid %d) did not survive the API server restart: %v", p.pid, p.err)
	}

	// Changes after the restart: kube-controller-manager must first notice
	// (its own informers recover), then dsproxy.
	start := time.Now()
	e.addPods(t, sel, true, "k2")
	svc2 := e.createService(t, service("api2", corev1.ServiceTypeClusterIP, nil, sel, tcpHTTP))
	for _, f := range families {
		if _, err := e.cp.WaitForEndpointSlices(e.ns, "api", f, 2); err != nil {
			t.Fatalf("kube-controller-manager after the restart: %v", err)
		}
		if _, err := e.cp.WaitForEndpointSlices(e.ns, "api2", f, 2); err != nil {
			t.Fatalf("kube-controller-manager after the restart: %v", err)
		}
	}
	kcm := time.Since(start)
	for _, f := range families {
		vip, _ := clusterIP(svc2, f, svcPort)
		vips = append(vips, vip)
	}
	// client-go's reflectors back off up to 30s between failed list/watch
	// attempts; allow one full backoff step.
	took, err := waitBackends(e.c.Node, vips, []string{"k1", "k2"}, 45*time.Second)
	if err != nil {
		e.fatalf(t, "dsproxy did not pick up changes made after the API server restart: %v", err)
	}
	t.Logf("after the restart: EndpointSlices in %v, dsproxy followed %v later", kcm.Round(time.Millisecond), took.Round(time.Millisecond))
	if e.cur() != p || p.exited() {
		e.fatalf(t, "dsproxy (pid %d) restarted or exited: %v", p.pid, p.err)
	}
}

// testFeatureGates: dsproxy accepts and refuses --feature-gates as kube-proxy
// v1.36 does, with kube-proxy's error: both binaries are run with each value
// and --write-config-to (which kube-proxy reaches only once its gates are set),
// in the node's namespace.
func testFeatureGates(t *testing.T, e *env) {
	run := func(bin, gates, out string) (string, error) {
		return netns.Exec(e.c.Node, bin, "--feature-gates="+gates, "--write-config-to="+out)
	}
	for i, gates := range []string{
		"AllowServiceExternalIPs=false",
		"AllowServiceExternalIP=false",      // unknown
		"APIServerTracing=false",            // locked to true
		"APIServerTracing=true",             // locked, at its default
		"ClusterTrustBundleProjection=true", // its dependency off
		"ClusterTrustBundleProjection=true,ClusterTrustBundle=true",
		"AllAlpha=true",
		"AllBeta=false,ComponentFlagz=true",
		"LoggingAlphaOptions=true,ContextualLogging=false",
		"NFTablesProxyMode=false", // GA: kube-proxy's own gates
		"KubeProxyDrainingTerminatingNodes=false",
	} {
		kpOut, kpErr := run(filepath.Join(e.cp.Bin, "kube-proxy"), gates, filepath.Join(e.dir, fmt.Sprintf("kp-%d.yaml", i)))
		dsOut, dsErr := run(e.bin, gates, filepath.Join(e.dir, fmt.Sprintf("ds-%d.yaml", i)))
		if (kpErr == nil) != (dsErr == nil) {
			e.fatalf(t, "--feature-gates=%s: kube-proxy: %v %s\ndsproxy: %v %s", gates, kpErr, framework.Tail(kpOut, 5), dsErr, framework.Tail(dsOut, 5))
			continue
		}
		if kpErr == nil {
			t.Logf("--feature-gates=%s: both accept", gates)
			continue
		}
		// kube-proxy: ... "command failed" err="failed complete: <message>"
		_, msg, ok := strings.Cut(kpOut, "failed complete: ")
		if !ok {
			e.fatalf(t, "--feature-gates=%s: kube-proxy failed without its gate error: %v %s", gates, kpErr, kpOut)
			continue
		}
		msg, _, _ = strings.Cut(msg, "\"\n")
		if !strings.Contains(dsOut, msg) {
			e.fatalf(t, "--feature-gates=%s: kube-proxy says %q; dsproxy: %s", gates, msg, dsOut)
		}
		t.Logf("--feature-gates=%s: both refuse: %s", gates, msg)
	}
}

// testManifests: the deploy/ manifests pass server-side validation, and (unless
// DSPROXY_E2E_ADMIN=1) dsproxy ran the whole suite as the ServiceAccount of
// deploy/rbac.yaml without a single forbidden request.
func testManifests(t *testing.T, e *env) {
	var args []string
	for _, f := range []string{"rbac.yaml", "configmap.yaml", "daemonset.yaml"} {
		args = append(args, "-f", filepath.Join(e.root, "deploy", f))
	}
	out, err := e.cp.Kubectl(append([]string{"apply", "--dry-run=server"}, args...)...)
	if err != nil {
		t.Fatalf("kubectl apply --dry-run=server: %v\n%s", err, out)
	}
	if n := strings.Count(out, "(server dry run)"); n < 5 {
		t.Errorf("kubectl apply --dry-run=server: %d objects validated, want 5:\n%s", n, out)
	}
	t.Logf("kubectl apply --dry-run=server:\n%s", strings.TrimSpace(out))
	if !e.saRBAC {
		t.Log("dsproxy ran as admin (DSPROXY_E2E_ADMIN=1): RBAC not exercised")
		return
	}
	var forbidden []string
	e.mu.Lock()
	procs := append([]*proc(nil), e.procs...)
	e.mu.Unlock()
	for _, p := range procs {
		e.mu.Lock()
		ok := p.forbiddenOK
		e.mu.Unlock()
		data, err := os.ReadFile(p.log)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(data), "\n") {
			if ok != "" && strings.Contains(l, ok) {
				continue
			}
			if strings.Contains(strings.ToLower(l), "forbidden") {
				forbidden = append(forbidden, fmt.Sprintf("pid %d: %s", p.pid, l))
			}
		}
	}
	if len(forbidden) > 0 {
		t.Errorf("dsproxy as ServiceAccount kube-system/dsproxy hit forbidden requests (deploy/rbac.yaml too narrow):\n%s",
			strings.Join(forbidden, "\n"))
	} else {
		t.Logf("dsproxy ran as system:serviceaccount:kube-system:dsproxy (deploy/rbac.yaml) with no forbidden request in %d process logs", len(procs))
	}
}
