package conntrack

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/family"
)

func udpFlow(f *family.Family, client int, svc netip.Addr, port uint16, ep netip.Addr, epPort uint16) Flow {
	src := netip.AddrPortFrom(testaddr.Ext(f, client), 40000+uint16(client))
	return Flow{
		Protocol: UDP,
		OrigSrc:  src,
		OrigDst:  netip.AddrPortFrom(svc, port),
		ReplySrc: netip.AddrPortFrom(ep, epPort),
		ReplyDst: src,
	}
}

func TestFilterMatch(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			svc, other := testaddr.Svc(f, 1), testaddr.Svc(f, 2)
			ep1, ep2 := testaddr.Pod(f, 1), testaddr.Pod(f, 2)
			toEp1 := udpFlow(f, 1, svc, 53, ep1, 5353)
			toEp2 := udpFlow(f, 2, svc, 53, ep2, 5353)
			nodePort := udpFlow(f, 3, testaddr.Node(f, 1), 30053, ep1, 5353)
			tcp := toEp1
			tcp.Protocol = TCP
			cases := []struct {
				name   string
				filter Filter
				want   []Flow
			}{
				{"ip", ForIP(UDP, svc), []Flow{toEp1, toEp2}},
				{"other ip", ForIP(UDP, other), nil},
				{"port", ForPort(UDP, 30053), []Flow{nodePort}},
				{"nat", ForNAT(UDP, svc, ep2), []Flow{toEp2}},
				{"port nat", ForPortNAT(UDP, 30053, ep1), []Flow{nodePort}},
				{"port nat other ep", ForPortNAT(UDP, 30053, ep2), nil},
				{"stale keeps serving", ForStaleEndpoints(UDP, svc, 53, []netip.AddrPort{netip.AddrPortFrom(ep1, 5353)}), []Flow{toEp2}},
				{"stale compares ports", ForStaleEndpoints(UDP, svc, 53, []netip.AddrPort{netip.AddrPortFrom(ep1, 5354)}), []Flow{toEp1, toEp2}},
				{"stale nodeport", ForStaleEndpoints(UDP, netip.Addr{}, 30053, nil), []Flow{nodePort}},
				{"tcp", ForIP(TCP, svc), []Flow{tcp}},
				{"reply port", Filter{Protocol: UDP, ReplySrc: ep1, ReplySrcPort: 5353}, []Flow{toEp1, nodePort}},
			}
			all := []Flow{toEp1, toEp2, nodePort, tcp}
			for _, tc := range cases {
				if err := tc.filter.Validate(f); err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				var got []Flow
				for _, fl := range all {
					if tc.filter.Match(fl) {
						got = append(got, fl)
					}
				}
				if len(got) != len(tc.want) {
					t.Errorf("%s: %v matched %v, want %v", tc.name, tc.filter, got, tc.want)
					continue
				}
				for i := range got {
					if got[i] != tc.want[i] {
						t.Errorf("%s: matched %v, want %v", tc.name, got, tc.want)
					}
				}
			}
		})
	}
}

func TestFilterValidate(t *testing.T) {
	v4, v6 := testaddr.Svc(family.IPv4, 1), testaddr.Svc(family.IPv6, 1)
	bad := []struct {
		f    Filter
		want string
	}{
		{Filter{OrigDst: v4}, "no protocol"},
		{Filter{Protocol: UDP}, "matches every"},
		{Filter{Protocol: UDP, Keep: []netip.AddrPort{netip.AddrPortFrom(v4, 1)}}, "matches every"},
		{ForIP(UDP, v6), "not IPv4"},
		{ForNAT(UDP, v4, v6), "not IPv4"},
		{ForStaleEndpoints(UDP, v4, 53, []netip.AddrPort{netip.AddrPortFrom(v6, 53)}), "not IPv4"},
	}
	for _, tc := range bad {
		err := tc.f.Validate(family.IPv4)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%v) = %v, want error containing %q", tc.f, err, tc.want)
		}
	}
	if err := ForPort(SCTP, 30000).Validate(family.IPv6); err != nil {
		t.Errorf("port filter: %v", err)
	}
}

func TestFake(t *testing.T) {
	f4, f6 := family.IPv4, family.IPv6
	a := udpFlow(f4, 1, testaddr.Svc(f4, 1), 53, testaddr.Pod(f4, 1), 53)
	b := udpFlow(f4, 2, testaddr.Svc(f4, 2), 53, testaddr.Pod(f4, 2), 53)
	c := udpFlow(f6, 1, testaddr.Svc(f6, 1), 53, testaddr.Pod(f6, 1), 53)
	fake := NewFake(a, b, c)

	if n, err := fake.Clear(f4); n != 0 || err != nil || len(fake.Calls()) != 0 {
		t.Fatalf("empty Clear: %d %v %v", n, err, fake.Calls())
	}
	if _, err := fake.Clear(f4, Filter{Protocol: UDP}); err == nil {
		t.Fatal("Clear accepted a match-everything filter")
	}
	// A port filter must not reach into the other family.
	n, err := fake.Clear(f4, ForPort(UDP, 53), ForIP(UDP, testaddr.Svc(f4, 9)))
	if err != nil || n != 2 {
		t.Fatalf("Clear = %d, %v; want 2", n, err)
	}
	if got := fake.Flows(); len(got) != 1 || got[0] != c {
		t.Fatalf("left %v, want only %v", got, c)
	}
	if l, _ := fake.List(f4); len(l) != 0 {
		t.Fatalf("List(IPv4) = %v", l)
	}
	if l, _ := fake.List(f6); len(l) != 1 {
		t.Fatalf("List(IPv6) = %v", l)
	}
	calls := fake.Calls()
	if len(calls) != 1 || calls[0].Family != f4 || len(calls[0].Filters) != 2 || calls[0].Deleted != 2 {
		t.Fatalf("calls %+v", calls)
	}
	fake.Reset()
	fake.Err = errTest
	if _, err := fake.Clear(f6, ForIP(UDP, testaddr.Svc(f6, 1))); err != errTest {
		t.Fatalf("Err not returned: %v", err)
	}
	if len(fake.Flows()) != 1 || len(fake.Calls()) != 1 {
		t.Fatalf("failed Clear changed the table or was not recorded")
	}
}

type testError struct{}

func (testError) Error() string { return "test error" }

var errTest error = testError{}

func TestProtocolFor(t *testing.T) {
	for k8s, want := range map[string]Protocol{"TCP": TCP, "UDP": UDP, "SCTP": SCTP} {
		got, ok := ProtocolFor(v1.Protocol(k8s))
		if !ok || got != want || got.String() != strings.ToLower(k8s) {
			t.Errorf("ProtocolFor(%s) = %v, %v", k8s, got, ok)
		}
	}
	if _, ok := ProtocolFor("ICMP"); ok {
		t.Error("ICMP accepted")
	}
}

// ForStaleEndpoints over many serving endpoints, given in any order: a flow to any
// of them (also one the kernel reports IPv4-mapped) is kept, every other matched.
func TestStaleEndpointsManyServing(t *testing.T) {
	f := family.IPv4
	svc := testaddr.Svc(f, 1)
	var serving []netip.AddrPort
	for i := 4000; i > 0; i-- { // descending, with a duplicate
		serving = append(serving, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 64, byte(i >> 8), byte(i)}), 8080))
	}
	serving = append(serving, serving[7])
	filter := ForStaleEndpoints(UDP, svc, 53, serving)
	if err := filter.Validate(f); err != nil {
		t.Fatal(err)
	}
	for i, ap := range serving {
		fl := udpFlow(f, 1, svc, 53, ap.Addr(), ap.Port())
		if filter.Match(fl) {
			t.Fatalf("flow to serving endpoint %d (%s) matched", i, ap)
		}
		fl.ReplySrc = netip.AddrPortFrom(netip.AddrFrom16(ap.Addr().As16()), ap.Port())
		if filter.Match(fl) {
			t.Fatalf("flow to serving endpoint %s, IPv4-mapped, matched", ap)
		}
	}
	for _, gone := range []netip.AddrPort{
		netip.MustParseAddrPort("10.64.0.1:8081"),   // serving address, other port
		netip.MustParseAddrPort("10.64.200.1:8080"), // not serving
		netip.MustParseAddrPort("10.63.255.255:8080"),
	} {
		if !filter.Match(udpFlow(f, 1, svc, 53, gone.Addr(), gone.Port())) {
			t.Errorf("flow to %s, not serving, not matched", gone)
		}
	}
}
