//go:build netns

package netns

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/ipvs"
	ipvsbackend "github.com/dsproxy/dsproxy/pkg/proxier/ipvs"
)

// ipvsKernel opens the node's IPVS for f, for the tests' own inspection and
// sabotage.
func (e *proxyNode) ipvsKernel(t *testing.T, f *family.Family) *ipvs.Kernel {
	t.Helper()
	k, err := ipvs.Open(f, e.c.Node.Path(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	return k
}

// TestIPVSRepairAndCleanup is TestIPTablesRepairAndCleanup for the IPVS
// backend: a full sync on an untouched kernel repairs nothing; after someone
// deletes a virtual server or its real servers, unbinds a Service address or
// flushes an ipset,
// traffic breaks and the next periodic check notices and resyncs (kube-proxy's
// IPVS mode reconciles them at every sync); so does it after someone deletes
// the nat POSTROUTING jump, flushes the nat table, reloads the firewall or
// deletes the dummy link. Cleanup removes dsproxy's virtual servers, addresses, link, ipsets
// and chains in both families and leaves others' alone.
func TestIPVSRepairAndCleanup(t *testing.T) {
	e := newProxyNodeMode(t, modeIPVS)
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
	nodePort := func(f *family.Family, p Proto) netip.AddrPort {
		return netip.AddrPortFrom(e.c.Node.IP(f), s.nodePortOf(p))
	}
	works := func(t *testing.T, f *family.Family) {
		t.Helper()
		for _, p := range []Proto{TCP, UDP} {
			e.expectServed(t, client, p, vip(f), client.IP(f), pods...)
			e.expectServed(t, e.c.External, p, nodePort(f, p), e.c.Node.IP(f), pods...)
		}
	}
	brokenVIP := func(t *testing.T, f *family.Family, what string) {
		t.Helper()
		if r, err := Dial(client, TCP, vip(f), pxDropWait); err == nil {
			e.fatalf(t, "%s: the ClusterIP still answers (%v) after %s", f, r, what)
		}
	}
	e.expectNoRepairs(t, "on an untouched kernel")
	// The periodic check finds nothing to repair on an untouched kernel: what
	// it reads back (virtual servers, addresses, ipsets, iptables-save) reads
	// the same twice, or every check would be a full sync.
	for _, f := range family.All {
		for i := range 2 {
			if e.flushed(t, e.fam[f].vb) {
				e.fatalf(t, "%s: the periodic check (%d) wants a full sync on an untouched kernel", f, i)
			}
		}
	}
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			k := e.ipvsKernel(t, f)
			works(t, f)
			// 1. Someone deletes the ClusterIP's virtual server (ipvsadm -D).
			if err := k.DelService(ipvs.Key{Addr: vip(f).Addr(), Proto: 6, Port: pxSvcPort}); err != nil {
				e.fatalf(t, "deleting the virtual server: %v", err)
			}
			e.expectRepair(t, f, "deleting the virtual server", false, brokenVIP, works)
			// 1b. Someone deletes its real servers (ipvsadm -d).
			vsKey := ipvs.Key{Addr: vip(f).Addr(), Proto: 6, Port: pxSvcPort}
			ds, err := k.Dests(vsKey)
			if err != nil || len(ds) != len(pods) {
				e.fatalf(t, "real servers of %s: %v (%v), want %d", vsKey, ds, err, len(pods))
			}
			for _, d := range ds {
				if err := k.DelDest(vsKey, d); err != nil {
					e.fatalf(t, "deleting real server %v: %v", d, err)
				}
			}
			e.expectRepair(t, f, "deleting the real servers", false, brokenVIP, works)
			// 1c. Someone changes its settings (ipvsadm -E -p 300): it serves
			// on, but the periodic check notices, as kube-proxy's IPVS mode sets
			// them back at every sync.
			if err := k.UpdateService(ipvs.Service{Key: vsKey, Scheduler: "rr", Persistent: true, Timeout: 300}); err != nil {
				e.fatalf(t, "changing the virtual server: %v", err)
			}
			noticed := func(t *testing.T, f *family.Family, what string) {
				t.Helper()
				if !e.flushed(t, e.fam[f].vb) {
					e.fatalf(t, "%s: the periodic check missed %s", f, what)
				}
			}
			e.expectRepair(t, f, "changing the virtual server's persistence", false, noticed, works)
			// 1d. Someone changes a real server's weight (ipvsadm -e -w 5).
			if ds, err = k.Dests(vsKey); err != nil || len(ds) == 0 {
				e.fatalf(t, "real servers of %s: %v (%v)", vsKey, ds, err)
			}
			d := ds[0]
			d.Weight = 5
			if err := k.UpdateDest(vsKey, d); err != nil {
				e.fatalf(t, "changing the real server's weight: %v", err)
			}
			e.expectRepair(t, f, "changing a real server's weight", false, noticed, works)
			// 2. Someone unbinds the ClusterIP from the dummy link.
			if err := k.DelAddr(vip(f).Addr()); err != nil {
				e.fatalf(t, "unbinding the ClusterIP: %v", err)
			}
			e.expectRepair(t, f, "unbinding the ClusterIP", false, brokenVIP, works)
			// 3. Someone flushes the set of ClusterIPs: new connections to the
			// address are refused as to an unknown port.
			set := ipvsbackend.Prefix + "CLUSTER-IP"
			if f.BitLen == 128 {
				set = ipvsbackend.Prefix6 + "CLUSTER-IP"
			}
			if out, err := Exec(e.c.Node, "ipset", "flush", set); err != nil {
				e.fatalf(t, "ipset flush %s: %v %s", set, err, out)
			}
			e.expectRepair(t, f, "flushing "+set, false, brokenVIP, works)
			unmasqueraded := func(t *testing.T, f *family.Family, what string) {
				t.Helper()
				if r, err := Dial(e.c.External, TCP, nodePort(f, TCP), pxDropWait); err == nil && r.ObservedSrc.Addr() == e.c.Node.IP(f) {
					e.fatalf(t, "%s: the NodePort is still masqueraded (%v) after %s", f, r, what)
				}
			}
			// 4. Someone deletes the jump to the masquerading chain: NodePort
			// replies no longer come back through the node. The periodic
			// check reads the rules back (kube-proxy's IPVS mode writes them
			// again at every sync).
			if out, err := Exec(e.c.Node, f.IPTablesCommand, "-t", "nat", "-D", "POSTROUTING", "-m", "comment", "--comment", "dsproxy ipvs", "-j", ipvsbackend.Prefix+"POSTROUTING"); err != nil {
				e.fatalf(t, "deleting the POSTROUTING jump: %v %s", err, out)
			}
			e.expectRepair(t, f, "deleting the POSTROUTING jump", false, unmasqueraded, works)
			// 5. Someone flushes dsproxy's masquerading chain, then every chain
			// of the nat table: dsproxy's chains are still there, empty.
			if out, err := Exec(e.c.Node, f.IPTablesCommand, "-t", "nat", "-F", ipvsbackend.Prefix+"POSTROUTING"); err != nil {
				e.fatalf(t, "flushing the masquerading chain: %v %s", err, out)
			}
			e.expectRepair(t, f, "flushing the masquerading chain", false, unmasqueraded, works)
			if out, err := Exec(e.c.Node, f.IPTablesCommand, "-t", "nat", "-F"); err != nil {
				e.fatalf(t, "flushing the nat table: %v %s", err, out)
			}
			e.expectRepair(t, f, "flushing the nat table", false, unmasqueraded, works)
			// 6. A firewall reload empties the family's tables: the next periodic
			// check notices the chains gone.
			if out, err := ExecStdin(e.c.Node, strings.NewReader("*nat\nCOMMIT\n*filter\nCOMMIT\n"), f.IPTablesCommand+"-restore"); err != nil {
				e.fatalf(t, "emptying the tables: %v %s", err, out)
			}
			e.expectRepair(t, f, "a firewall reload", false, unmasqueraded, works)
			// 7. Someone deletes the dummy link: the next periodic check notices.
			if out, err := Exec(e.c.Node, "ip", "link", "del", ipvs.LinkName); err != nil {
				e.fatalf(t, "deleting %s: %v %s", ipvs.LinkName, err, out)
			}
			e.expectRepair(t, f, "deleting "+ipvs.LinkName, false, brokenVIP, works)
			// The other family's addresses went with the link: its own check
			// sync puts them back.
			e.sync(false)
		})
	}
	t.Run("cleanup", func(t *testing.T) {
		// Someone else's virtual server, which cleanup must keep (and rule: cleanupKeepsForeignRules).
		foreign := map[*family.Family]ipvs.Key{}
		for _, f := range family.All {
			foreign[f] = ipvs.Key{Addr: testaddr.Ext(f, 9), Proto: 6, Port: 22}
			if err := e.ipvsKernel(t, f).AddService(ipvs.Service{Key: foreign[f], Scheduler: "rr"}); err != nil {
				e.fatalf(t, "%s: adding a foreign virtual server: %v", f, err)
			}
		}
		e.cleanupKeepsForeignRules(t, "DSIPVS", func(f *family.Family) error { return e.fam[f].vb.Cleanup(context.Background()) })
		for _, f := range family.All {
			svcs, err := e.ipvsKernel(t, f).Services()
			if err != nil || len(svcs) != 1 || svcs[0].Key != foreign[f] {
				e.fatalf(t, "%s: virtual servers after cleanup: %v (%v), want only the foreign %s", f, svcs, err, foreign[f])
			}
			brokenVIP(t, f, "cleanup")
		}
		if out, err := Exec(e.c.Node, "ipset", "list", "-n"); err != nil || strings.Contains(out, "DSIPVS") {
			e.fatalf(t, "ipsets after cleanup: %v\n%s", err, out)
		}
		if out, err := Exec(e.c.Node, "ip", "link", "show", ipvs.LinkName); err == nil {
			e.fatalf(t, "%s left after cleanup:\n%s", ipvs.LinkName, out)
		}
	})
}

// TestIPVSDrain: when an endpoint goes, its real server keeps its open TCP
// connections at weight 0 while new connections go to the others; once they
// end, a periodic check deletes it. Its UDP and SCTP real servers go at once,
// flows or not, as in kube-proxy.
func TestIPVSDrain(t *testing.T) {
	e := newProxyNodeMode(t, modeIPVS)
	a, b := e.c.AddPod("pod-a"), e.c.AddPod("pod-b")
	client := e.c.AddPod("client")
	for _, n := range []*NS{a, b} {
		n.Serve(TCP, pxPodPort)
		n.Serve(UDP, pxPodPort)
		n.Serve(SCTP, pxPodPort)
	}
	serveEcho(t, echoPort, a, b)
	s := svcSpec{name: "drain", n: 32, eps: []*NS{a}, extraPorts: []int32{echoPort}}
	e.apply(s)
	e.sync(false)
	conns := e.echoConns(t, client, s.n)
	// realServer reports pod n's real server in virtual server key, if any.
	realServer := func(f *family.Family, key ipvs.Key, n *NS) (ipvs.Dest, bool) {
		ds, err := e.ipvsKernel(t, f).Dests(key)
		if err != nil {
			e.fatalf(t, "%s: real servers of %s: %v", f, key, err)
		}
		for _, d := range ds {
			if d.Addr == n.IP(f) {
				return d, true
			}
		}
		return ipvs.Dest{}, false
	}
	// A UDP and an SCTP flow to a: IPVS keeps both on its real servers after
	// the reply (the SCTP association, shut down, for its CLOSED timeout).
	type flow struct {
		f   *family.Family
		p   Proto
		key ipvs.Key
	}
	var flows []flow
	for _, f := range family.All {
		for _, p := range []Proto{UDP, SCTP} {
			key := ipvs.Key{Addr: testaddr.Svc(f, s.n), Proto: 17, Port: pxSvcPort}
			if p == SCTP {
				key.Proto = 132
			}
			e.expectServed(t, client, p, netip.AddrPortFrom(key.Addr, pxSvcPort), client.IP(f), a)
			if d, ok := realServer(f, key, a); !ok || d.Active+d.Inactive == 0 {
				e.fatalf(t, "%s %s: pod-a's real server %+v (present %v) counts no flow after a reply", f, p, d, ok)
			}
			flows = append(flows, flow{f, p, key})
		}
	}
	s.eps = []*NS{b}
	e.apply(s)
	e.sync(false)
	for _, fl := range flows {
		f := fl.f
		if d, ok := realServer(f, fl.key, a); ok {
			e.fatalf(t, "%s %s: the removed endpoint's real server with a flow is still there (%+v), want deleted at once", f, fl.p, d)
		}
		e.expectServed(t, client, fl.p, netip.AddrPortFrom(fl.key.Addr, pxSvcPort), client.IP(f), b)
	}
	for _, f := range family.All {
		e.expectEchoes(t, f, conns[f], "the connection to the removed endpoint")
		for range 5 {
			e.expectServed(t, client, TCP, netip.AddrPortFrom(testaddr.Svc(f, s.n), pxSvcPort), client.IP(f), b)
		}
		key := ipvs.Key{Addr: testaddr.Svc(f, s.n), Proto: 6, Port: echoPort}
		weight := func() (int, bool) {
			d, ok := realServer(f, key, a)
			return d.Weight, ok
		}
		if w, ok := weight(); !ok || w != 0 {
			e.fatalf(t, "%s: the removed endpoint's real server: present %v weight %d, want present at weight 0", f, ok, w)
		}
		// End the connection with a reset: IPVS forgets it within seconds
		// (a FIN would keep it in TIME_WAIT for two minutes).
		if tc, ok := conns[f].(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		conns[f].Close()
		deadline := time.Now().Add(40 * time.Second)
		for {
			e.syncFamily(f, false) // a check sync: nothing changed
			if _, ok := weight(); !ok {
				break
			}
			if time.Now().After(deadline) {
				e.fatalf(t, "%s: the drained real server is still there 40 s after its connection ended", f)
			}
			time.Sleep(time.Second)
		}
	}
}

// TestIPVSAdopt: a dsproxy that starts where another program's IPVS mode
// serves the same Services (kube-proxy's: its virtual servers, their addresses
// on its own link kube-ipvs0, none of dsproxy's ipsets members) adopts the
// virtual servers without turning away one new connection. A client dials the
// lowest ClusterIP of each family through the first sync, whose window between
// an address joining the set of Service addresses and its ports joining theirs
// is the widest (with the INPUT rules refusing the first without the second).
func TestIPVSAdopt(t *testing.T) {
	e := newProxyNodeMode(t, modeIPVS)
	pods := []*NS{e.c.AddPod("pod-a"), e.c.AddPod("pod-b")}
	client := e.c.AddPod("client")
	for _, n := range pods {
		n.Serve(TCP, pxPodPort)
	}
	const first, count = 100, 100
	var batch strings.Builder
	batch.WriteString("link add kube-ipvs0 type dummy\n")
	for _, f := range family.All {
		k := e.ipvsKernel(t, f)
		for n := first; n < first+count; n++ {
			key := ipvs.Key{Addr: testaddr.Svc(f, n), Proto: 6, Port: pxSvcPort}
			if err := k.AddService(ipvs.Service{Key: key, Scheduler: "rr"}); err != nil {
				e.fatalf(t, "kube-proxy's virtual server %s: %v", key, err)
			}
			for _, p := range pods {
				if err := k.AddDest(key, ipvs.Dest{Addr: p.IP(f), Port: pxPodPort, Weight: 1}); err != nil {
					e.fatalf(t, "kube-proxy's real server in %s: %v", key, err)
				}
			}
			fmt.Fprintf(&batch, "addr add %s dev kube-ipvs0\n", netip.PrefixFrom(key.Addr, f.BitLen))
		}
	}
	if out, err := ExecStdin(e.c.Node, strings.NewReader(batch.String()), "ip", "-batch", "-"); err != nil {
		e.fatalf(t, "kube-ipvs0: %v %s", err, out)
	}
	for n := first; n < first+count; n++ {
		e.apply(svcSpec{name: fmt.Sprintf("adopt-%d", n), n: n, eps: pods})
	}
	vips := map[*family.Family]netip.AddrPort{}
	for _, f := range family.All {
		vips[f] = netip.AddrPortFrom(testaddr.Svc(f, first), pxSvcPort)
		e.expectServed(t, client, TCP, vips[f], client.IP(f), pods...)
	}

	pr := startProber(client, vips, time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	for _, f := range family.All {
		e.fam[f] = e.startProxier(f) // a dsproxy starting: its first sync is a full one
	}
	start := time.Now()
	e.sync(false)
	t.Logf("first sync of both families over %d adopted virtual servers each took %v", count, time.Since(start))
	time.Sleep(100 * time.Millisecond)
	pr.check(t, e, "the first sync, adopting the virtual servers", 10)
	// The other program's link goes (as --cleanup-kube-proxy removes it): the
	// addresses are dsproxy's own now.
	if out, err := Exec(e.c.Node, "ip", "link", "del", "kube-ipvs0"); err != nil {
		e.fatalf(t, "deleting kube-ipvs0: %v %s", err, out)
	}
	for _, f := range family.All {
		e.expectServed(t, client, TCP, vips[f], client.IP(f), pods...)
	}
	e.expectNoRepairs(t, "after the adoption")
}

// TestIPVSLastEndpointDrains: when a port's last endpoint goes, its open TCP
// connections go on (its virtual server stays with the real server at weight
// 0, as kube-proxy keeps the virtual server of a port without endpoints) while
// new connections are refused; once they end, a periodic check deletes both.
func TestIPVSLastEndpointDrains(t *testing.T) {
	e := newProxyNodeMode(t, modeIPVS)
	a := e.c.AddPod("pod-a")
	client := e.c.AddPod("client")
	a.Serve(TCP, pxPodPort)
	serveEcho(t, echoPort, a)
	s := svcSpec{name: "last", n: 33, eps: []*NS{a}, extraPorts: []int32{echoPort}}
	e.apply(s)
	e.sync(false)
	conns := e.echoConns(t, client, s.n)
	s.eps = nil
	e.apply(s)
	e.sync(false)
	for _, f := range family.All {
		e.expectEchoes(t, f, conns[f], "the connection to the last endpoint")
		// New connections are refused, on the kept virtual server's port too
		// (the node's own get IPVS's ICMP error there while it drains, as from
		// every virtual server without real servers in kube-proxy's IPVS mode).
		e.expectRefused(t, client, TCP, netip.AddrPortFrom(testaddr.Svc(f, s.n), pxSvcPort))
		e.expectRefused(t, client, TCP, netip.AddrPortFrom(testaddr.Svc(f, s.n), echoPort))
		key := ipvs.Key{Addr: testaddr.Svc(f, s.n), Proto: 6, Port: echoPort}
		present := func() bool {
			svcs, err := e.ipvsKernel(t, f).Services()
			if err != nil {
				e.fatalf(t, "%s: virtual servers: %v", f, err)
			}
			return slices.ContainsFunc(svcs, func(v ipvs.Service) bool { return v.Key == key })
		}
		if !present() {
			e.fatalf(t, "%s: the virtual server of the port without endpoints went with a connection open", f)
		}
		if tc, ok := conns[f].(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		conns[f].Close()
		deadline := time.Now().Add(40 * time.Second)
		for present() {
			if time.Now().After(deadline) {
				e.fatalf(t, "%s: the drained virtual server is still there 40 s after its connection ended", f)
			}
			time.Sleep(time.Second)
			e.syncFamily(f, false) // a check sync: nothing changed
		}
	}
}

// echoConns opens a long-lived TCP connection per family from client to the
// echo port of ClusterIP n, closed at the test's end.
func (e *proxyNode) echoConns(t *testing.T, client *NS, n int) map[*family.Family]net.Conn {
	t.Helper()
	conns := map[*family.Family]net.Conn{}
	for _, f := range family.All {
		c, err := openConn(client, "tcp", netip.AddrPortFrom(testaddr.Svc(f, n), echoPort))
		if err != nil {
			e.fatalf(t, "%s long-lived connection: %v", f, err)
		}
		t.Cleanup(func() { c.Close() })
		conns[f] = c
	}
	return conns
}

// expectEchoes checks that c still carries data: three lines echoed.
func (e *proxyNode) expectEchoes(t *testing.T, f *family.Family, c net.Conn, what string) {
	t.Helper()
	rd := bufio.NewReader(c)
	for i := range 3 {
		msg := fmt.Sprintf("ping %d\n", i)
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte(msg)); err != nil {
			e.fatalf(t, "%s: %s broke: %v", f, what, err)
		}
		if got, err := rd.ReadString('\n'); err != nil || got != msg {
			e.fatalf(t, "%s: %s: %q, %v", f, what, got, err)
		}
	}
}
