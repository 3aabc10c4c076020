//go:build netns

package netns

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/proxier/nftables"
)

const echoPort = 9000

// TestProxierRestartWithoutDrop replaces both family proxiers (new proxier, new
// backend, new netlink connection, as a restarted dsproxy) while clients keep
// opening TCP connections to a ClusterIP every 20 ms and one long-lived connection
// keeps exchanging data: not one connection may fail and the long-lived one must
// survive the table swap.
func TestProxierRestartWithoutDrop(t *testing.T) {
	for _, mode := range proxyModes {
		t.Run(mode, func(t *testing.T) { testRestartWithoutDrop(t, mode) })
	}
}

func testRestartWithoutDrop(t *testing.T, mode string) {
	e := newProxyNodeMode(t, mode)
	a, b := e.c.AddPod("pod-a"), e.c.AddPod("pod-b")
	client := e.c.AddPod("client")
	for _, n := range []*NS{a, b} {
		n.Serve(TCP, pxPodPort)
		n.Serve(UDP, pxPodPort)
	}
	serveEcho(t, echoPort, a, b)
	s := svcSpec{name: "restart", n: 21, eps: []*NS{a, b}, extraPorts: []int32{echoPort}}
	e.apply(s)
	e.sync(false)

	var (
		mu       sync.Mutex
		failures []string
		echoes   = map[*family.Family]int{}
		stop     = make(chan struct{})
		wg       sync.WaitGroup
		vips     = map[*family.Family]netip.AddrPort{}
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		failures = append(failures, fmt.Sprintf("%s: ", time.Now().Format("15:04:05.000"))+fmt.Sprintf(format, args...))
	}
	for _, f := range family.All {
		vips[f] = netip.AddrPortFrom(testaddr.Svc(f, s.n), pxSvcPort)
		conn, err := openConn(client, "tcp", netip.AddrPortFrom(vips[f].Addr(), echoPort))
		if err != nil {
			e.fatalf(t, "%s long-lived connection: %v", f, err)
		}
		t.Cleanup(func() { conn.Close() })
		wg.Add(1)
		go func() { // the long-lived connection
			defer wg.Done()
			rd := bufio.NewReader(conn)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				msg := fmt.Sprintf("ping %d\n", i)
				_ = conn.SetDeadline(time.Now().Add(time.Second))
				if _, err := conn.Write([]byte(msg)); err != nil {
					fail("%s long-lived connection write %d: %v", f, i, err)
					return
				}
				got, err := rd.ReadString('\n')
				if err != nil || got != msg {
					fail("%s long-lived connection echo %d: %q, %v", f, i, got, err)
					return
				}
				mu.Lock()
				echoes[f]++
				mu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	pr := startProber(client, vips, 20*time.Millisecond) // a new connection every 20 ms

	time.Sleep(300 * time.Millisecond)
	before := map[*family.Family]string{}
	for _, f := range family.All {
		if mode == modeNFTables {
			before[f] = e.fam[f].b.Table()
			// The old process is gone: its netlink socket closes, its rules stay.
			_ = e.fam[f].nl.Close()
		}
		e.fam[f] = e.startProxier(f)
	}
	restart := time.Now()
	e.sync(false)
	t.Logf("restart sync of both families took %v", time.Since(restart))
	time.Sleep(300 * time.Millisecond)
	dials, dialFailures := pr.stop()
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	failures = append(failures, dialFailures...)
	if len(failures) > 0 {
		e.fatalf(t, "%d failures across the restart:\n%s", len(failures), strings.Join(failures, "\n"))
	}
	for _, f := range family.All {
		// At 20 ms per round, 600 ms of traffic is ~25 rounds; demand a margin.
		if dials[f] < 10 || echoes[f] < 10 {
			e.fatalf(t, "%s: only %d new connections and %d echoes during the test", f, dials[f], echoes[f])
		}
		if mode != modeNFTables {
			continue
		}
		if after := e.fam[f].b.Table(); after == before[f] || after == "" {
			e.fatalf(t, "%s: live table %q before and %q after the restart, want the new backend to swap in the other name", f, before[f], after)
		}
	}
	t.Logf("new connections %v, echoes %v", dials, echoes)
	e.expectNoRepairs(t, "after the restart")
	if mode == modeNFTables {
		if n := len(dsproxyTables(t, e)); n != 2 {
			e.fatalf(t, "after the restart: %d dsproxy tables, want one per family", n)
		}
	}
}

// dsproxyTables lists the dsproxy tables in the node as "family name", read over
// netlink so that it does not depend on the nft binary decoding every set (see
// TestProxierRulesetListable).
func dsproxyTables(t *testing.T, e *proxyNode) []string {
	t.Helper()
	var tables []string
	for _, f := range family.All {
		names, err := e.fam[f].nl.ListTables(context.Background(), f)
		if err != nil {
			e.fatalf(t, "%s: list tables: %v", f, err)
		}
		for _, n := range names {
			if slices.Contains(nftables.TableNames, n) {
				tables = append(tables, f.NFTFamilyName+" "+n)
			}
		}
	}
	return tables
}

// TestProxierRepairAndCleanup: a full sync on an untouched kernel repairs nothing;
// after someone deletes an element or a base chain with nft, traffic breaks and the
// next full sync reports repairs and fixes it; after someone deletes or
// flushes the table, or flushes a base chain, the next periodic check sync does; --cleanup (Backend.Cleanup) removes every
// table and the Service stops working.
func TestProxierRepairAndCleanup(t *testing.T) {
	e := newProxyNode(t)
	pods := []*NS{e.c.AddPod("pod-a"), e.c.AddPod("pod-b"), e.c.AddPod("pod-c")}
	client := e.c.AddPod("client")
	for _, n := range pods {
		n.Serve(TCP, pxPodPort)
		n.Serve(UDP, pxPodPort)
	}
	s := svcSpec{name: "web", n: 30, typ: "NodePort", nodePort: 30300, eps: pods}
	e.apply(s)
	e.sync(false)
	works := func(t *testing.T, f *family.Family) {
		t.Helper()
		for _, p := range []Proto{TCP, UDP} {
			e.expectServed(t, client, p, netip.AddrPortFrom(testaddr.Svc(f, s.n), pxSvcPort), client.IP(f), pods...)
			e.expectServed(t, e.c.External, p, netip.AddrPortFrom(e.c.Node.IP(f), s.nodePortOf(p)), e.c.Node.IP(f), pods...)
		}
	}
	broken := func(t *testing.T, f *family.Family, what string) {
		t.Helper()
		if r, err := Dial(client, TCP, netip.AddrPortFrom(testaddr.Svc(f, s.n), pxSvcPort), pxDropWait); err == nil {
			e.fatalf(t, "%s: the ClusterIP still answers (%v) after %s", f, r, what)
		}
	}
	e.expectNoRepairs(t, "on an untouched kernel")

	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			works(t, f)
			table := e.fam[f].b.Table()
			// 1. Someone deletes the ClusterIP's element of its dispatch map (@svc-groups).
			elem := fmt.Sprintf("{ %s . tcp . %d }", testaddr.Svc(f, s.n), pxSvcPort)
			if out, err := Exec(e.c.Node, "nft", "delete", "element", f.NFTFamilyName, table, "svc-groups", elem); err != nil {
				e.fatalf(t, "nft delete element: %v %s", err, out)
			}
			e.expectRepair(t, f, "deleting its element", true, broken, works)

			// 2. Someone deletes a base chain: the NAT prerouting hook.
			script := fmt.Sprintf("flush chain %[1]s %[2]s nat-prerouting\ndelete chain %[1]s %[2]s nat-prerouting\n", f.NFTFamilyName, table)
			if out, err := ExecStdin(e.c.Node, strings.NewReader(script), "nft", "-f", "-"); err != nil {
				e.fatalf(t, "nft delete chain: %v %s", err, out)
			}
			e.expectRepair(t, f, "deleting the nat-prerouting chain", true, broken, works)

			// 3. Someone deletes the whole table, as "nft flush ruleset" (the
			// nftables service's restart) does. The next periodic check (a sync
			// with nothing to do) notices and rebuilds it.
			if out, err := Exec(e.c.Node, "nft", "delete", "table", f.NFTFamilyName, e.fam[f].b.Table()); err != nil {
				e.fatalf(t, "nft delete table: %v %s", err, out)
			}
			e.expectRepair(t, f, "deleting the table", false, broken, works)

			// 4. Someone empties the table's chains: "nft flush table" keeps the
			// table, its chains and sets. The periodic check reads the base
			// chains and rebuilds.
			if out, err := Exec(e.c.Node, "nft", "flush", "table", f.NFTFamilyName, e.fam[f].b.Table()); err != nil {
				e.fatalf(t, "nft flush table: %v %s", err, out)
			}
			e.expectRepair(t, f, "flushing the table", false, broken, works)

			// 5. Someone flushes one base chain, the NAT output hook: the node's
			// own connections to the ClusterIP break, the pods' do not.
			if out, err := Exec(e.c.Node, "nft", "flush", "chain", f.NFTFamilyName, e.fam[f].b.Table(), "nat-output"); err != nil {
				e.fatalf(t, "nft flush chain: %v %s", err, out)
			}
			fromNode := func(t *testing.T, f *family.Family, what string) {
				t.Helper()
				if r, err := Dial(e.c.Node, TCP, netip.AddrPortFrom(testaddr.Svc(f, s.n), pxSvcPort), pxDropWait); err == nil {
					e.fatalf(t, "%s: the ClusterIP still answers the node (%v) after %s", f, r, what)
				}
			}
			e.expectRepair(t, f, "flushing the nat-output chain", false, fromNode, works)
			vip := netip.AddrPortFrom(testaddr.Svc(f, s.n), pxSvcPort)
			if r, err := Dial(e.c.Node, TCP, vip, pxDialWait); err != nil || !slices.ContainsFunc(pods, func(n *NS) bool { return n.Name == r.Server }) {
				e.fatalf(t, "%s: the node's connection to the ClusterIP after the repair: %v %v", f, r, err)
			}
		})
	}

	t.Run("cleanup", func(t *testing.T) {
		for _, f := range family.All {
			if err := e.fam[f].b.Cleanup(context.Background()); err != nil {
				e.fatalf(t, "%s cleanup: %v", f, err)
			}
		}
		if tables := dsproxyTables(t, e); len(tables) != 0 {
			e.fatalf(t, "tables left after cleanup: %v", tables)
		}
		if out, err := Exec(e.c.Node, "nft", "list", "ruleset"); err != nil || strings.Contains(out, "dsproxy") {
			e.fatalf(t, "nft list ruleset after cleanup (%v):\n%s", err, out)
		}
		for _, f := range family.All {
			broken(t, f, "cleanup")
			np := netip.AddrPortFrom(e.c.Node.IP(f), s.nodePortOf(TCP))
			if r, err := Dial(e.c.External, TCP, np, pxDropWait); err == nil {
				e.fatalf(t, "%s: the NodePort still answers (%v) after cleanup", f, r)
			}
		}
	})
}

// TestProxierRulesetListable: an operator (and the harness's Debug) must be able to
// read the node's ruleset with "nft list ruleset" while dsproxy serves Services.
//
// At commit 266491d it fails (nft 1.0.6): the @endpoints map key ended in the
// variable-length "integer" type (pkg/proxier/nftables/layout.go, newSetTypes:
// epKey = MustConcatSetType(a, proto, svc, nftables.TypeInteger)), so nft could not
// split the concatenated keys of the map's elements and aborted with
// "mergesort.c:24: concat_expr_msort_value: Assertion `ilen > 0' failed", even for
// "nft list tables". The fix, a fixed-size 32-bit type (nftables.TypeMark, what
// numgen writes; the kernel's key is 4 bytes either way), is what this pins.
func TestProxierRulesetListable(t *testing.T) {
	e := newProxyNode(t)
	a := e.c.AddPod("pod-a")
	e.apply(svcSpec{name: "listed", n: 40, eps: []*NS{a}})
	e.sync(false)
	for _, f := range family.All {
		table := e.fam[f].b.Table()
		out, err := Exec(e.c.Node, "nft", "list", "map", f.NFTFamilyName, table, "endpoints")
		if err != nil {
			t.Errorf("%s: nft list map %s endpoints: %v", f, table, err)
			continue
		}
		if !strings.Contains(out, testaddr.Svc(f, 40).String()) {
			t.Errorf("%s: @endpoints lists no element of %s:\n%s", f, testaddr.Svc(f, 40), out)
		}
	}
	if out, err := Exec(e.c.Node, "nft", "list", "ruleset"); err != nil {
		e.fatalf(t, "nft list ruleset with one Service: %v\n%s", err, out)
	}
}
