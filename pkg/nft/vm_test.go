package nft

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// testAddrs are one family's addresses for the tracer tests.
type testAddrs struct {
	node, client, remote   netip.Addr
	svc, svcAff, svcNoEP   netip.Addr
	ep0, ep1, epAff0, epA1 netip.AddrPort
}

func addrsFor(fam *family.Family) testAddrs {
	ap := netip.MustParseAddrPort
	a := netip.MustParseAddr
	if fam == family.IPv4 {
		return testAddrs{a("192.168.0.10"), a("10.64.1.5"), a("192.168.0.99"),
			a("10.96.0.10"), a("10.96.0.11"), a("10.96.0.12"),
			ap("10.64.2.1:8080"), ap("10.64.3.1:8080"), ap("10.64.2.7:9090"), ap("10.64.3.7:9090")}
	}
	return testAddrs{a("fd00::10"), a("fd00:64:1::5"), a("fd00::99"),
		a("fd00:96::10"), a("fd00:96::11"), a("fd00:96::12"),
		ap("[fd00:64:2::1]:8080"), ap("[fd00:64:3::1]:8080"), ap("[fd00:64:2::7]:9090"), ap("[fd00:64:3::7]:9090")}
}

// newTracedFake returns a Fake holding the test ruleset for fam with a 2-endpoint
// service, an affinity service, a service without endpoints and a NodePort.
func newTracedFake(t *testing.T, fam *family.Family) (*Fake, testAddrs) {
	t.Helper()
	rs := newTestRuleset(fam)
	ad := addrsFor(fam)
	tx := NewTx(fam)
	loadTestServices(tx, rs, ad)
	f := NewFake()
	if err := f.Apply(context.Background(), tx); err != nil {
		t.Fatalf("apply: %v\n%s", err, tx)
	}
	return f, ad
}

func TestTraceTable(t *testing.T) {
	for _, fam := range family.All {
		t.Run(fam.Name, func(t *testing.T) {
			f, ad := newTracedFake(t, fam)
			node := Node{LocalAddrs: []netip.Addr{ad.node}}
			tcp := func(origin Origin, src netip.Addr, dst netip.Addr, port uint16) Packet {
				return Packet{Family: fam, Src: netip.AddrPortFrom(src, 40000), Dst: netip.AddrPortFrom(dst, port),
					Proto: unix.IPPROTO_TCP, Origin: origin, InIface: "eth0"}
			}
			type want struct {
				v     Verdict
				dnat  []netip.AddrPort
				masq  bool
				local bool
				rtype uint8
				rcode uint8
			}
			cases := []struct {
				name string
				p    Packet
				want want
			}{
				{"cluster IP from the node", tcp(OriginLocal, ad.node, ad.svc, 80),
					want{v: Accept, dnat: []netip.AddrPort{ad.ep0, ad.ep1}}},
				{"cluster IP from a pod", tcp(OriginInbound, ad.client, ad.svc, 80),
					want{v: Accept, dnat: []netip.AddrPort{ad.ep0, ad.ep1}}},
				{"other port is not a service", tcp(OriginInbound, ad.client, ad.svc, 81),
					want{v: Accept}},
				{"node port: DNAT and masquerade by mark", tcp(OriginInbound, ad.remote, ad.node, 30080),
					want{v: Accept, dnat: []netip.AddrPort{ad.ep0, ad.ep1}, masq: true}},
				{"node port on a foreign address: fib not local", tcp(OriginInbound, ad.remote, ad.remote, 30080),
					want{v: Accept}},
				{"plain traffic to the node is local", tcp(OriginInbound, ad.remote, ad.node, 22),
					want{v: Accept, local: true}},
				{"no endpoints: tcp reset", tcp(OriginInbound, ad.client, ad.svcNoEP, 80),
					want{v: Reject, rtype: unix.NFT_REJECT_TCP_RST}},
				{"no endpoints: tcp reset from the node", tcp(OriginLocal, ad.node, ad.svcNoEP, 80),
					want{v: Reject, rtype: unix.NFT_REJECT_TCP_RST}},
			}
			udp := tcp(OriginInbound, ad.client, ad.svcNoEP, 80)
			udp.Proto = unix.IPPROTO_UDP
			// The services are TCP: UDP to the no-endpoints IP misses the set.
			cases = append(cases, struct {
				name string
				p    Packet
				want want
			}{"udp is another service", udp, want{v: Accept}})
			est := tcp(OriginInbound, ad.client, ad.svc, 80)
			est.CtState = CtEstablished
			cases = append(cases, struct {
				name string
				p    Packet
				want want
			}{"established packets skip nat", est, want{v: Accept}})

			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					res, err := f.TraceAll(node, tc.p)
					if err != nil {
						t.Fatal(err)
					}
					var got []netip.AddrPort
					for _, r := range res {
						if r.Verdict != tc.want.v || r.Masquerade != tc.want.masq || r.Local != tc.want.local ||
							r.RejectType != tc.want.rtype || r.RejectCode != tc.want.rcode {
							t.Errorf("result %+v, want %+v\n%s", r, tc.want, strings.Join(r.Trace, "\n"))
						}
						if r.DNAT.IsValid() {
							got = append(got, r.DNAT)
						}
					}
					if !slices.Equal(got, tc.want.dnat) {
						t.Errorf("DNAT to %v, want %v\n%s", got, tc.want.dnat, strings.Join(res[0].Trace, "\n"))
					}
				})
			}
		})
	}
}

func TestTraceICMPReject(t *testing.T) {
	for _, fam := range family.All {
		f := NewFake()
		rs := newTestRuleset(fam)
		ad := addrsFor(fam)
		tx := NewTx(fam)
		rs.base(tx)
		tx.AddElements(testTable, "no-endpoints", []Element{{Key: rs.svcKeyBytes(ad.svcNoEP, unix.IPPROTO_UDP, 53)}})
		if err := f.Apply(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
		p := Packet{Family: fam, Src: netip.AddrPortFrom(ad.client, 5353), Dst: netip.AddrPortFrom(ad.svcNoEP, 53),
			Proto: unix.IPPROTO_UDP, Origin: OriginInbound, InIface: "eth0"}
		res, err := f.Trace(Node{}, p)
		if err != nil {
			t.Fatal(err)
		}
		if res.Verdict != Reject || res.RejectType != unix.NFT_REJECT_ICMP_UNREACH || res.RejectCode != fam.ICMPRejectCode {
			t.Errorf("%s: %+v", fam, res)
		}
	}
}

func TestTraceAffinity(t *testing.T) {
	for _, fam := range family.All {
		t.Run(fam.Name, func(t *testing.T) {
			f, ad := newTracedFake(t, fam)
			p := Packet{Family: fam, Src: netip.AddrPortFrom(ad.client, 40000), Dst: netip.AddrPortFrom(ad.svcAff, 80),
				Proto: unix.IPPROTO_TCP, Origin: OriginInbound, InIface: "eth0"}
			all, err := f.TraceAll(Node{}, p)
			if err != nil {
				t.Fatal(err)
			}
			if len(all) != 2 || all[0].DNAT != ad.epAff0 || all[1].DNAT != ad.epA1 {
				t.Fatalf("before any connection: %+v", all)
			}
			if els, _ := f.ListElements(context.Background(), fam, testTable, "affinity"); len(els) != 0 {
				t.Fatalf("TraceAll kept dynset updates: %v", els)
			}
			first, err := f.Trace(Node{}, p)
			if err != nil || first.DNAT != ad.epAff0 {
				t.Fatalf("first connection: %+v, %v", first, err)
			}
			// The affinity entry now pins every outcome to the first endpoint.
			all, err = f.TraceAll(Node{}, p)
			if err != nil {
				t.Fatal(err)
			}
			if len(all) != 1 || all[0].DNAT != ad.epAff0 {
				t.Fatalf("after the first connection: %+v", all)
			}
			if !strings.Contains(strings.Join(all[0].Trace, "\n"), "aff-2 rule 0") {
				t.Errorf("sticky rule not in trace:\n%s", strings.Join(all[0].Trace, "\n"))
			}
			dump := f.Dump(fam)
			wantEl := ad.client.String() + " . " + ad.svcAff.String() + " . tcp . 80 : " + ad.epAff0.Addr().String() + " . 9090"
			if !strings.Contains(dump, wantEl) {
				t.Errorf("dump lacks affinity element %q:\n%s", wantEl, dump)
			}
			// Another client is not pinned.
			p.Src = netip.AddrPortFrom(ad.remote, 40000)
			if all, _ = f.TraceAll(Node{}, p); len(all) != 2 {
				t.Errorf("other client: %+v", all)
			}
		})
	}
}

func TestTraceChainOrderAndVerdicts(t *testing.T) {
	fam := family.IPv4
	f := NewFake()
	tx := NewTx(fam)
	tx.AddTable("a")
	tx.AddTable("b")
	mark := func(v uint32) []Rule {
		return []Rule{rule("", imm(1, MarkBytes(v)), markSet(1), acceptV())}
	}
	// Table b's chain runs first (priority -10) and accepts; a's still runs.
	tx.SetChain("b", &Chain{Name: "early", Hook: hookOut(), Priority: prio(-10), Type: "filter", Rules: mark(7)})
	tx.SetChain("a", &Chain{Name: "sub", Rules: []Rule{rule("", returnV()), rule("", dropV())}})
	tx.SetChain("a", &Chain{Name: "late", Hook: hookOut(), Priority: prio(10), Type: "filter", Rules: []Rule{
		rule("", jumpV("sub")),
		rule("", metaMark(1), cmpEq(1, MarkBytes(7)), dropV()),
	}})
	if err := f.Apply(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	p := Packet{Family: fam, Src: netip.MustParseAddrPort("10.0.0.1:1"), Dst: netip.MustParseAddrPort("10.0.0.2:2"),
		Proto: unix.IPPROTO_UDP, Origin: OriginLocal}
	res, err := f.Trace(Node{}, p)
	if err != nil {
		t.Fatal(err)
	}
	if res.Verdict != Drop || res.Mark != 7 {
		t.Fatalf("got %+v\n%s", res, strings.Join(res.Trace, "\n"))
	}
	if !strings.HasPrefix(res.Trace[0], "ip b early") {
		t.Errorf("priority order: %v", res.Trace)
	}
}

func TestTraceUnknownExpression(t *testing.T) {
	fam := family.IPv4
	f := NewFake()
	tx := NewTx(fam)
	tx.AddTable("t")
	tx.SetChain("t", &Chain{Name: "out", Hook: hookOut(), Priority: prio(0), Type: "filter",
		Rules: []Rule{rule("", &expr.Log{})}})
	if err := f.Apply(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	p := Packet{Family: fam, Src: netip.MustParseAddrPort("10.0.0.1:1"), Dst: netip.MustParseAddrPort("10.0.0.2:2"),
		Proto: unix.IPPROTO_UDP, Origin: OriginLocal}
	if _, err := f.Trace(Node{}, p); err == nil || !strings.Contains(err.Error(), "not supported") {
		t.Fatalf("want unsupported error, got %v", err)
	}
	if _, err := f.Trace(Node{}, Packet{Family: fam, Src: p.Src, Dst: p.Dst}); err == nil {
		t.Fatal("packet without origin traced")
	}
}

// loadTestServices queues the base ruleset and the test services: one with two
// endpoints, one with affinity, one without endpoints, and a NodePort.
func loadTestServices(tx *Tx, rs *testRuleset, ad testAddrs) {
	rs.base(tx)
	rs.service(tx, ad.svc, 80, false, ad.ep0, ad.ep1)
	rs.service(tx, ad.svcAff, 80, true, ad.epAff0, ad.epA1)
	rs.service(tx, ad.svcNoEP, 80, false)
	rs.nodePort(tx, 30080, ad.svc, 80)
}
