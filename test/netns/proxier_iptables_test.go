//go:build netns

package netns

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/nfacct"
)

// TestIPTablesRepairAndCleanup is TestProxierRepairAndCleanup for the iptables
// backend, with the nf_tables and the legacy binaries: a full sync on an
// untouched kernel repairs nothing; after someone deletes the jump from nat
// PREROUTING, traffic breaks and the next full sync fixes it (the missing jump
// counted as a repair); after someone flushes DSPROXY-SERVICES, deletes a rule
// of DSPROXY-NODEPORTS, or reloads the firewall (every table emptied), the next
// periodic check sync notices (a dispatch chain's rule count, or the canary
// chain gone) and resyncs everything; Cleanup removes every DSPROXY- chain
// and jump in both families and leaves other rules alone.
func TestIPTablesRepairAndCleanup(t *testing.T) {
	for _, mode := range []string{modeIPTables, modeIPTablesLegacy} {
		t.Run(mode, func(t *testing.T) { testIPTablesRepairAndCleanup(t, mode) })
	}
}

func testIPTablesRepairAndCleanup(t *testing.T, mode string) {
	e := newProxyNodeMode(t, mode)
	pods := []*NS{e.c.AddPod("pod-a"), e.c.AddPod("pod-b")}
	client := e.c.AddPod("client")
	for _, n := range pods {
		n.Serve(TCP, pxPodPort)
		n.Serve(UDP, pxPodPort)
	}
	s := svcSpec{name: "web", n: 30, typ: "NodePort", nodePort: 30300, eps: pods}
	e.apply(s)
	e.sync(false)
	vip := func(f *family.Family) netip.AddrPort { return netip.AddrPortFrom(testaddr.Svc(f, s.n), pxSvcPort) }
	nodePort := func(f *family.Family) netip.AddrPort { return netip.AddrPortFrom(e.c.Node.IP(f), s.nodePortOf(TCP)) }
	works := func(t *testing.T, f *family.Family) {
		t.Helper()
		for _, p := range []Proto{TCP, UDP} {
			e.expectServed(t, client, p, vip(f), client.IP(f), pods...)
			e.expectServed(t, e.c.External, p, netip.AddrPortFrom(e.c.Node.IP(f), s.nodePortOf(p)), e.c.Node.IP(f), pods...)
		}
	}
	broken := func(t *testing.T, f *family.Family, what string) {
		t.Helper()
		if r, err := Dial(client, TCP, vip(f), pxDropWait); err == nil {
			e.fatalf(t, "%s: the ClusterIP still answers (%v) after %s", f, r, what)
		}
	}
	nodePortBroken := func(t *testing.T, f *family.Family, what string) {
		t.Helper()
		if r, err := Dial(e.c.External, TCP, nodePort(f), pxDropWait); err == nil {
			e.fatalf(t, "%s: the TCP NodePort still answers (%v) after %s", f, r, what)
		}
	}
	e.expectNoRepairs(t, "on an untouched kernel")
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			works(t, f)
			ipt := iptCommand(mode, f, "")
			// 1. Someone deletes the jump from nat PREROUTING.
			if out, err := Exec(e.c.Node, ipt, "-t", "nat", "-D", "PREROUTING", "-m", "comment", "--comment", "dsproxy service portals", "-j", "DSPROXY-SERVICES"); err != nil {
				e.fatalf(t, "deleting the jump: %v %s", err, out)
			}
			e.expectRepair(t, f, "deleting the PREROUTING jump", true, broken, works)
			// 2. Someone flushes a dispatch chain, or deletes one rule of one:
			// the periodic check (a sync with nothing to do) counts its rules.
			if out, err := Exec(e.c.Node, ipt, "-t", "nat", "-F", "DSPROXY-SERVICES"); err != nil {
				e.fatalf(t, "flushing DSPROXY-SERVICES: %v %s", err, out)
			}
			e.expectRepair(t, f, "flushing DSPROXY-SERVICES", false, broken, works)
			if out, err := Exec(e.c.Node, ipt, "-t", "nat", "-D", "DSPROXY-NODEPORTS", "1"); err != nil {
				e.fatalf(t, "deleting a rule of DSPROXY-NODEPORTS: %v %s", err, out)
			}
			e.expectRepair(t, f, "deleting a NodePort rule", false, func(t *testing.T, f *family.Family, what string) {
				t.Helper()
				// The rule deleted is the first: TCP's or UDP's NodePort.
				tcp, errT := Dial(e.c.External, TCP, nodePort(f), pxDropWait)
				udp, errU := Dial(e.c.External, UDP, netip.AddrPortFrom(e.c.Node.IP(f), s.nodePortOf(UDP)), pxDropWait)
				if errT == nil && errU == nil {
					e.fatalf(t, "%s: both NodePorts still answer (%v, %v) after %s", f, tcp, udp, what)
				}
			}, works)
			// 3. A firewall reload: every table of the family emptied, chains and
			// all. The canary is gone.
			if out, err := ExecStdin(e.c.Node, strings.NewReader("*mangle\nCOMMIT\n*nat\nCOMMIT\n*filter\nCOMMIT\n"), iptCommand(mode, f, "-restore")); err != nil {
				e.fatalf(t, "emptying the tables: %v %s", err, out)
			}
			e.expectRepair(t, f, "a firewall reload", false, broken, works)
		})
	}
	t.Run("cleanup", func(t *testing.T) {
		e.cleanupKeepsForeignRules(t, "DSPROXY", func(f *family.Family) error { return e.fam[f].ib.Cleanup(context.Background()) })
		for _, f := range family.All {
			broken(t, f, "cleanup")
			nodePortBroken(t, f, "cleanup")
		}
	})
}

// newNodePortNode is a node in mode serving one NodePort Service over pod-a's
// TCP and UDP servers, synced.
func newNodePortNode(t *testing.T, mode string) (*proxyNode, *NS, svcSpec) {
	t.Helper()
	e := newProxyNodeMode(t, mode)
	a := e.c.AddPod("pod-a")
	a.Serve(TCP, pxPodPort)
	a.Serve(UDP, pxPodPort)
	s := svcSpec{name: "np", n: 31, typ: "NodePort", nodePort: 30310, eps: []*NS{a}}
	e.apply(s)
	e.sync(false)
	return e, a, s
}

// TestIPTablesLocalhostNodePorts: with localhostNodePorts (kube-proxy's iptables
// default) an IPv4 NodePort answers on 127.0.0.1 from the node, masqueraded so the
// endpoint can answer; IPv6 NodePorts never answer on ::1.
func TestIPTablesLocalhostNodePorts(t *testing.T) {
	e, a, s := newNodePortNode(t, modeIPTables)
	for _, p := range []Proto{TCP, UDP} {
		r := e.dial(t, e.c.Node, p, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), s.nodePortOf(p)))
		if r.Server != a.Name {
			e.fatalf(t, "%s 127.0.0.1 NodePort: answered by %s, want %s", p, r.Server, a)
		}
		if r.ObservedSrc.Addr().IsLoopback() {
			e.fatalf(t, "%s 127.0.0.1 NodePort: endpoint saw loopback source %s, want it masqueraded", p, r.ObservedSrc)
		}
	}
	if r, err := Dial(e.c.Node, TCP, netip.AddrPortFrom(netip.IPv6Loopback(), s.nodePortOf(TCP)), pxDropWait); err == nil {
		e.fatalf(t, "tcp [::1] NodePort answered (%v); IPv6 has no localhost NodePorts", r)
	}
}

// TestIPTablesNFAcct: kube-proxy's two nfacct counters, in both iptables
// flavours. Connections accepted on a localhost NodePort count once each, and
// nothing else does; packets conntrack marks invalid (a SYN+FIN) are dropped in
// the forward path and counted, in both families.
func TestIPTablesNFAcct(t *testing.T) {
	for _, mode := range []string{modeIPTables, modeIPTablesLegacy} {
		t.Run(mode, func(t *testing.T) {
			e, a, s := newNodePortNode(t, mode)
			acct := nfacct.NewAt(e.c.Node.Handle())
			count := func(name string) uint64 {
				t.Helper()
				c, err := acct.Get(name)
				if err != nil {
					e.fatalf(t, "%v", err)
				}
				return c.Packets
			}
			local, invalid := count(nfacct.LocalhostNodePortsAccepted), count(nfacct.CTStateInvalidDropped)
			lo := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), s.nodePortOf(TCP))
			for range 3 {
				if r := e.dial(t, e.c.Node, TCP, lo); r.Server != a.Name {
					e.fatalf(t, "127.0.0.1 NodePort: answered by %s, want %s", r.Server, a)
				}
			}
			// Not localhost NodePort connections: the node IP's NodePort, the ClusterIP.
			e.dial(t, e.c.Node, TCP, netip.AddrPortFrom(e.c.Node.IPv4, s.nodePortOf(TCP)))
			e.dial(t, e.c.Node, TCP, netip.AddrPortFrom(testaddr.Svc(family.IPv4, s.n), pxSvcPort))
			if got := count(nfacct.LocalhostNodePortsAccepted) - local; got != 3 {
				e.fatalf(t, "%s counted %d connections, want 3", nfacct.LocalhostNodePortsAccepted, got)
			}
			sent := 0
			for _, f := range family.All {
				for i := range 2 {
					if err := SendTCPSegment(e.c.External, netip.AddrPortFrom(a.IP(f), pxPodPort), uint16(40000+i), TCPSyn|TCPFin); err != nil {
						e.fatalf(t, "%v", err)
					}
					sent++
				}
			}
			deadline := time.Now().Add(5 * time.Second)
			for count(nfacct.CTStateInvalidDropped)-invalid < uint64(sent) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if got := count(nfacct.CTStateInvalidDropped) - invalid; got != uint64(sent) {
				e.fatalf(t, "%s counted %d packets, want %d", nfacct.CTStateInvalidDropped, got, sent)
			}
		})
	}
}

// cleanupKeepsForeignRules adds someone else's rule to each family's filter
// INPUT, runs cleanup for both families in the node, and checks that no chain
// with prefix is left and the other rule is.
func (e *proxyNode) cleanupKeepsForeignRules(t *testing.T, prefix string, cleanup func(*family.Family) error) {
	t.Helper()
	for _, f := range family.All {
		if out, err := Exec(e.c.Node, f.IPTablesCommand, "-t", "filter", "-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT"); err != nil {
			e.fatalf(t, "%s: adding a foreign rule: %v %s", f, err, out)
		}
	}
	for _, f := range family.All {
		if err := RunIn(e.c.Node, func() error { return cleanup(f) }); err != nil {
			e.fatalf(t, "%s cleanup: %v", f, err)
		}
	}
	for _, f := range family.All {
		out, err := Exec(e.c.Node, f.IPTablesCommand+"-save")
		if err != nil {
			e.fatalf(t, "%s-save: %v", f.IPTablesCommand, err)
		}
		if strings.Contains(out, prefix) {
			e.fatalf(t, "%s: %s state left after cleanup:\n%s", f, prefix, out)
		}
		if !strings.Contains(out, "-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT") {
			e.fatalf(t, "%s: cleanup removed a rule that is not dsproxy's:\n%s", f, out)
		}
	}
}
