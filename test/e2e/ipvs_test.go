//go:build e2e && netns

package e2e

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dsproxy/dsproxy/internal/netnstest"
	"github.com/dsproxy/dsproxy/pkg/ipvs"
	"github.com/dsproxy/dsproxy/test/netns"
)

// TestIPVSMode runs the real binary in IPVS mode against the real control
// plane: a dual-stack NodePort Service is served on both families' ClusterIPs
// (TestProxy's fixture checks every pod is reached, through dsproxy-ipvs0 and
// IPVS), follows a scale-up and an endpoint going unready, and a restart in
// nftables mode replaces IPVS without failing a new connection from a pod or
// from outside, and removes the IPVS mode's state. The node's own connections
// to a ClusterIP are dialled across the switch too but may fail: one in flight
// as the ClusterIP leaves dsproxy-ipvs0 took it as its source address, and loses
// its reply (README: leaving IPVS mode). They must work after it. The machine's
// kernel has no IPVS: make test-ipvs runs this in a guest kernel that has it.
func TestIPVSMode(t *testing.T) {
	netnstest.RequireIPVS(t)
	e := newEnvArgs(t, []string{"--proxy-mode", "ipvs"}, "v1", "v2", "v3")
	sel := map[string]string{"app": "ipvs"}
	vips, targets, _ := e.trafficFixture(t, sel, corev1.ServiceTypeNodePort, "v1", "v2")
	// ipvsState reports the node's IPVS virtual servers and whether dsproxy-ipvs0
	// exists, and whether dsproxy's nftables tables do.
	ipvsState := func() (vs int, link, nftTables bool) {
		out, _ := netns.Exec(e.c.Node, "cat", "/proc/net/ip_vs")
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "TCP ") || strings.HasPrefix(l, "UDP ") {
				vs++
			}
		}
		_, err := netns.Exec(e.c.Node, "ip", "link", "show", ipvs.LinkName)
		out, _ = netns.Exec(e.c.Node, "nft", "list", "tables")
		return vs, err == nil, strings.Contains(out, "dsproxy")
	}
	if vs, link, nft := ipvsState(); vs == 0 || !link || nft {
		e.fatalf(t, "in IPVS mode: %d virtual servers, %s present %v, nftables tables present %v", vs, ipvs.LinkName, link, nft)
	}
	e.addPods(t, sel, true, "v3")
	took, err := waitBackends(e.c.Node, vips, []string{"v1", "v2", "v3"}, converge)
	if err != nil {
		e.fatalf(t, "IPVS mode does not follow a scale-up: %v", err)
	}
	t.Logf("IPVS mode followed a scale-up in %v", took.Round(time.Millisecond))
	e.setReady(t, false, "v1")
	if _, err := waitBackends(e.c.Node, vips, []string{"v2", "v3"}, converge); err != nil {
		e.fatalf(t, "IPVS mode does not follow an endpoint going unready: %v", err)
	}

	// New connections survive the switch to nftables mode. Connections IPVS
	// carries do not: their translation is IPVS's state, which the switch
	// removes (kube-proxy's switch from IPVS mode drops them too).
	strict, fromNode := splitFrom(targets, e.c.Node)
	pr := startProber(20*time.Millisecond, strict, nil)
	prNode := startProber(20*time.Millisecond, fromNode, nil)
	time.Sleep(300 * time.Millisecond)
	if err := e.cur().stop(); err != nil {
		e.errorf(t, "dsproxy on SIGTERM: %v", err)
	}
	e.mu.Lock()
	e.args = nil
	e.mu.Unlock()
	p := e.startDsproxy(t)
	if err := p.waitLog(60*time.Second, `"Synced" ipFamily="IPv4"`, `"Synced" ipFamily="IPv6"`); err != nil {
		e.errorf(t, "dsproxy in nftables mode: %v", err)
	}
	// The other mode's state goes once both families are programmed; give it
	// long, for the guest kernel runs under software emulation.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		vs, link, nft := ipvsState()
		if vs == 0 && !link && nft {
			break
		}
		if time.Now().After(deadline) {
			e.errorf(t, "after the switch to nftables mode: %d virtual servers, %s present %v, nftables tables present %v", vs, ipvs.LinkName, link, nft)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	dials, failures := pr.finish()
	nodeDials, nodeFailures := prNode.finish()
	t.Logf("%d dials from pods and outside across the switch; from the node %d, %d failed:\n%s", dials, nodeDials, len(nodeFailures), strings.Join(nodeFailures, "\n"))
	if nodeDials < 3*len(fromNode) || len(nodeFailures) > nodeDials/10 {
		e.errorf(t, "from the node: %d dials, %d failed across the switch", nodeDials, len(nodeFailures))
	}
	if len(failures) > 0 {
		e.errorf(t, "%d of %d new connections failed across the switch from IPVS mode:\n%s", len(failures), dials, strings.Join(failures, "\n"))
	}
	if _, err := waitBackends(e.c.Node, vips, []string{"v2", "v3"}, converge); err != nil {
		e.errorf(t, "after the switch: %v", err)
	}
	e.checkAlive(t)
}

// TestIPVSParity is KubeProxyParity for the IPVS mode, also with masqueradeAll: the real kube-proxy
// v1.36 in IPVS mode is the oracle for dsproxy's. Guest kernel only (make
// test-ipvs).
func TestIPVSParity(t *testing.T) {
	netnstest.RequireIPVS(t)
	e := newEnvArgs(t, []string{"--proxy-mode", "ipvs"}, "q1", "q2", "q3", "q4")
	kubeProxyParity(t, e, "ipvs", "ipvs+masquerade-all")
}

// TestIPVSTakeover is KubeProxyTakeover from kube-proxy's IPVS mode, to dsproxy's
// IPVS mode (the connections kube-proxy's virtual servers carry keep going: the
// same virtual and real servers are dsproxy's now) and to its nftables mode.
// Guest kernel only (make test-ipvs).
func TestIPVSTakeover(t *testing.T) {
	netnstest.RequireIPVS(t)
	e := newEnvArgs(t, []string{"--proxy-mode", "ipvs"}, "t1", "t2", "t3", "t4")
	kubeProxyTakeover(t, e, []takeoverPath{{kp: "ipvs", ds: "ipvs"}, {kp: "ipvs", ds: "nftables", ipvsLeaves: true}})
}
