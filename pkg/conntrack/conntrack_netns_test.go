//go:build netns

package conntrack

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/family"
	nstest "github.com/dsproxy/dsproxy/test/netns"
)

const (
	svcPort  = 80
	podPort  = 8080
	nodePort = 30080
)

// ctEnv is a cluster whose node DNATs two service IPs and a NodePort to two pods
// with nftables (the nft binary is used by the test only).
type ctEnv struct {
	c    *nstest.Cluster
	a, b *nstest.NS
}

func svc1(f *family.Family) netip.Addr { return testaddr.Svc(f, 10) }
func svc2(f *family.Family) netip.Addr { return testaddr.Svc(f, 11) }

func newCTEnv(t *testing.T) *ctEnv {
	t.Helper()
	c := nstest.New(t)
	e := &ctEnv{c: c, a: c.AddPod("pod-a"), b: c.AddPod("pod-b")}
	for _, p := range []*nstest.NS{e.a, e.b} {
		p.Serve(nstest.UDP, podPort)
		p.Serve(nstest.TCP, podPort)
	}
	var rules strings.Builder
	rules.WriteString("table inet ct_test {\n\tchain pre {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n")
	for _, f := range family.All {
		ip := f.NFTFamilyName
		ep := func(n *nstest.NS) string { return netip.AddrPortFrom(n.IP(f), podPort).String() }
		fmt.Fprintf(&rules, "\t\t%s daddr %s udp dport %d dnat %s to %s\n", ip, svc1(f), svcPort, ip, ep(e.a))
		fmt.Fprintf(&rules, "\t\t%s daddr %s udp dport %d dnat %s to %s\n", ip, svc2(f), svcPort, ip, ep(e.b))
		fmt.Fprintf(&rules, "\t\t%s daddr %s udp dport %d dnat %s to %s\n", ip, c.Node.IP(f), nodePort, ip, ep(e.b))
		fmt.Fprintf(&rules, "\t\t%s daddr %s sctp dport %d dnat %s to %s\n", ip, svc1(f), svcPort, ip, ep(e.a))
	}
	rules.WriteString("\t}\n}\n")
	if out, err := nstest.ExecStdin(c.Node, strings.NewReader(rules.String()), "nft", "-f", "-"); err != nil {
		t.Fatalf("nft: %v\n%s\n%s", err, out, rules.String())
	}
	// SCTP entries created by a lone INIT sit in COOKIE_WAIT, which times out in 3s.
	if err := nstest.RunIn(c.Node, func() error {
		return os.WriteFile("/proc/sys/net/netfilter/nf_conntrack_sctp_timeout_cookie_wait", []byte("120"), 0)
	}); err != nil {
		t.Fatal(err)
	}
	return e
}

// udp sends one UDP exchange from the external client and returns its source port.
func (e *ctEnv) udp(t *testing.T, dst netip.Addr, port uint16, wantServer *nstest.NS) uint16 {
	t.Helper()
	r, err := nstest.Dial(e.c.External, nstest.UDP, netip.AddrPortFrom(dst, port), 3*time.Second)
	if err != nil {
		t.Fatalf("%v\n%s", err, nstest.Debug(e.c.Node))
	}
	if r.Server != wantServer.Name {
		t.Fatalf("udp %s:%d answered by %s, want %s", dst, port, r.Server, wantServer.Name)
	}
	return r.Local.Port()
}

// key identifies a flow by its tuples, as the vishvananda/netlink parser sees it.
type key struct {
	proto              uint8
	origSrc, origDst   netip.AddrPort
	replySrc, replyDst netip.AddrPort
}

func (k key) String() string {
	return fmt.Sprintf("%d %s->%s reply %s->%s", k.proto, k.origSrc, k.origDst, k.replySrc, k.replyDst)
}

func ap(ip net.IP, port uint16) netip.AddrPort {
	a, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port)
}

// kernelFlows lists the node's entries with vishvananda/netlink, independently of
// the package's own parser. (That parser reports SCTP ports as 0.)
func (e *ctEnv) kernelFlows(t *testing.T, f *family.Family) map[key]bool {
	t.Helper()
	var flows []*netlink.ConntrackFlow
	if err := nstest.RunIn(e.c.Node, func() error {
		var err error
		flows, err = netlink.ConntrackTableList(netlink.ConntrackTable, netlink.InetFamily(f.NFProto))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	m := map[key]bool{}
	for _, fl := range flows {
		m[key{fl.Forward.Protocol, ap(fl.Forward.SrcIP, fl.Forward.SrcPort), ap(fl.Forward.DstIP, fl.Forward.DstPort),
			ap(fl.Reverse.SrcIP, fl.Reverse.SrcPort), ap(fl.Reverse.DstIP, fl.Reverse.DstPort)}] = true
	}
	return m
}

// udpKey is the entry of a UDP exchange from the external client.
func (e *ctEnv) udpKey(f *family.Family, sport uint16, dst netip.Addr, dport uint16, ep *nstest.NS) key {
	src := netip.AddrPortFrom(e.c.External.IP(f), sport)
	return key{uint8(UDP), src, netip.AddrPortFrom(dst, dport), netip.AddrPortFrom(ep.IP(f), podPort), src}
}

func (e *ctEnv) expect(t *testing.T, f *family.Family, present, gone []key) {
	t.Helper()
	have := e.kernelFlows(t, f)
	for _, k := range present {
		if !have[k] {
			t.Errorf("%s: entry %v missing; table:\n%s", f, k, dumpKeys(have))
		}
	}
	for _, k := range gone {
		if have[k] {
			t.Errorf("%s: entry %v still present", f, k)
		}
	}
}

func dumpKeys(m map[key]bool) string {
	var s []string
	for k := range m {
		s = append(s, "  "+k.String())
	}
	slices.Sort(s)
	return strings.Join(s, "\n")
}

func mustClear(t *testing.T, cl Cleaner, f *family.Family, want int, filters ...Filter) {
	t.Helper()
	n, err := cl.Clear(f, filters...)
	if err != nil {
		t.Fatalf("Clear(%s, %v): %v", f, filters, err)
	}
	if n != want {
		t.Fatalf("Clear(%s, %v) deleted %d entries, want %d", f, filters, n, want)
	}
}

func countProto(m map[key]bool, proto uint8) int {
	n := 0
	for k := range m {
		if k.proto == proto {
			n++
		}
	}
	return n
}

func TestClearUDP(t *testing.T) {
	e := newCTEnv(t)
	cl := NewAt(e.c.Node.Handle())

	type flows struct {
		svc1a, svc1b, svc2, np, direct key
	}
	made := map[*family.Family]flows{}
	for _, f := range family.All {
		var fl flows
		fl.svc1a = e.udpKey(f, e.udp(t, svc1(f), svcPort, e.a), svc1(f), svcPort, e.a)
		fl.svc1b = e.udpKey(f, e.udp(t, svc1(f), svcPort, e.a), svc1(f), svcPort, e.a)
		fl.svc2 = e.udpKey(f, e.udp(t, svc2(f), svcPort, e.b), svc2(f), svcPort, e.b)
		fl.np = e.udpKey(f, e.udp(t, e.c.Node.IP(f), nodePort, e.b), e.c.Node.IP(f), nodePort, e.b)
		// Not NATed: straight to the pod.
		fl.direct = e.udpKey(f, e.udp(t, e.a.IP(f), podPort, e.a), e.a.IP(f), podPort, e.a)
		// A TCP connection, which UDP filters must leave alone.
		if _, err := nstest.Dial(e.c.External, nstest.TCP, netip.AddrPortFrom(e.a.IP(f), podPort), 3*time.Second); err != nil {
			t.Fatal(err)
		}
		made[f] = fl
		e.expect(t, f, []key{fl.svc1a, fl.svc1b, fl.svc2, fl.np, fl.direct}, nil)
	}

	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			fl := made[f]
			tcpBefore := countProto(e.kernelFlows(t, f), uint8(TCP))
			if tcpBefore == 0 {
				t.Fatalf("no TCP entry to survive")
			}

			// The package's own List agrees with vishvananda/netlink on UDP.
			listed, err := cl.List(f)
			if err != nil {
				t.Fatal(err)
			}
			mine := map[key]bool{}
			for _, x := range listed {
				if x.Protocol == UDP {
					mine[key{uint8(x.Protocol), x.OrigSrc, x.OrigDst, x.ReplySrc, x.ReplyDst}] = true
				}
			}
			for k := range e.kernelFlows(t, f) {
				if k.proto == uint8(UDP) && !mine[k] {
					t.Errorf("List misses %v; it has:\n%s", k, dumpKeys(mine))
				}
			}

			// Wrong endpoint: nothing.
			mustClear(t, cl, f, 0, ForNAT(UDP, svc2(f), e.a.IP(f)))
			// Service IP gained an endpoint: both svc1 flows go.
			mustClear(t, cl, f, 2, ForIP(UDP, svc1(f)))
			e.expect(t, f, []key{fl.svc2, fl.np, fl.direct}, []key{fl.svc1a, fl.svc1b})

			// NodePort flows DNATed to b.
			mustClear(t, cl, f, 1, ForPortNAT(UDP, nodePort, e.b.IP(f)))
			e.expect(t, f, []key{fl.svc2, fl.direct}, []key{fl.np})

			// A batch in one dump: re-create the svc1 and NodePort flows, then drop
			// svc1's flows to a (endpoint gone) and NodePort flows, keep svc2's flow
			// (its endpoint b still serves).
			s1 := e.udpKey(f, e.udp(t, svc1(f), svcPort, e.a), svc1(f), svcPort, e.a)
			np := e.udpKey(f, e.udp(t, e.c.Node.IP(f), nodePort, e.b), e.c.Node.IP(f), nodePort, e.b)
			mustClear(t, cl, f, 2,
				ForNAT(UDP, svc1(f), e.a.IP(f)),
				ForStaleEndpoints(UDP, svc2(f), svcPort, []netip.AddrPort{netip.AddrPortFrom(e.b.IP(f), podPort)}),
				ForPort(UDP, nodePort),
				ForIP(SCTP, svc2(f)), // other protocol: matches nothing here
			)
			e.expect(t, f, []key{fl.svc2, fl.direct}, []key{s1, np})

			// svc2's serving set no longer contains b: its flow is stale.
			mustClear(t, cl, f, 1, ForStaleEndpoints(UDP, svc2(f), svcPort, []netip.AddrPort{netip.AddrPortFrom(e.a.IP(f), podPort)}))
			e.expect(t, f, []key{fl.direct}, []key{fl.svc2})

			if n := countProto(e.kernelFlows(t, f), uint8(TCP)); n != tcpBefore {
				t.Errorf("TCP entries: %d, want %d untouched", n, tcpBefore)
			}
			// The other family is untouched until its own subtest.
			if f == family.IPv4 {
				o := made[family.IPv6]
				e.expect(t, family.IPv6, []key{o.svc1a, o.svc1b, o.svc2, o.np, o.direct}, nil)
			}
		})
	}
}

// TestClearInCurrentNamespace uses New (the calling thread's namespace) from inside
// RunIn, the way a proxier runs its netlink calls in the harness.
func TestClearInCurrentNamespace(t *testing.T) {
	e := newCTEnv(t)
	for _, f := range family.All {
		s := e.udpKey(f, e.udp(t, svc1(f), svcPort, e.a), svc1(f), svcPort, e.a)
		var n int
		if err := nstest.RunIn(e.c.Node, func() error {
			var err error
			n, err = New().Clear(f, ForIP(UDP, svc1(f)))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("%s: deleted %d, want 1", f, n)
		}
		e.expect(t, f, nil, []key{s})
	}
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sctpInit returns an SCTP packet holding a single INIT chunk.
func sctpInit(sport, dport uint16, tag uint32) []byte {
	b := make([]byte, 32)
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	// b[4:8] verification tag 0 (required for INIT), b[8:12] checksum below.
	b[12] = 1                                  // chunk type INIT
	binary.BigEndian.PutUint16(b[14:], 20)     // chunk length
	binary.BigEndian.PutUint32(b[16:], tag)    // initiate tag
	binary.BigEndian.PutUint32(b[20:], 65535)  // a_rwnd
	binary.BigEndian.PutUint16(b[24:], 1)      // outbound streams
	binary.BigEndian.PutUint16(b[26:], 1)      // inbound streams
	binary.BigEndian.PutUint32(b[28:], 0x1000) // initial TSN
	// CRC32c over the packet, stored as the kernel does (little-endian on the wire).
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b, castagnoli))
	return b
}

// sendSCTPInit sends an INIT from the external client with a raw IP socket, so the
// test works on kernels without SCTP sockets: conntrack and NAT handle SCTP on
// their own.
func sendSCTPInit(e *ctEnv, dst netip.Addr, sport, dport uint16) error {
	return nstest.RunIn(e.c.External, func() error {
		af := unix.AF_INET6
		var sa unix.Sockaddr = &unix.SockaddrInet6{Addr: dst.As16()}
		if dst.Is4() {
			af = unix.AF_INET
			sa = &unix.SockaddrInet4{Addr: dst.As4()}
		}
		fd, err := unix.Socket(af, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		if err != nil {
			return fmt.Errorf("raw SCTP socket: %w", err)
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, sctpInit(sport, dport, 0x5eed0000|uint32(sport)), 0, sa)
	})
}

func TestClearSCTP(t *testing.T) {
	e := newCTEnv(t)
	cl := NewAt(e.c.Node.Handle())
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			udp := e.udpKey(f, e.udp(t, svc1(f), svcPort, e.a), svc1(f), svcPort, e.a)
			for _, sport := range []uint16{40001, 40002} {
				if err := sendSCTPInit(e, svc1(f), sport, svcPort); err != nil {
					t.Fatal(err)
				}
			}
			var sctp []Flow
			deadline := time.Now().Add(2 * time.Second)
			for len(sctp) < 2 && time.Now().Before(deadline) {
				all, err := cl.List(f)
				if err != nil {
					t.Fatal(err)
				}
				sctp = sctp[:0]
				for _, x := range all {
					if x.Protocol == SCTP {
						sctp = append(sctp, x)
					}
				}
				time.Sleep(10 * time.Millisecond)
			}
			if len(sctp) != 2 {
				t.Fatalf("want 2 SCTP entries, got %v\n%s", sctp, nstest.Debug(e.c.Node))
			}
			for _, x := range sctp {
				// Ports are decoded for SCTP too, and the entry is DNATed to pod a.
				if x.OrigDst != netip.AddrPortFrom(svc1(f), svcPort) || x.ReplySrc != netip.AddrPortFrom(e.a.IP(f), podPort) ||
					x.OrigSrc.Addr() != e.c.External.IP(f) || (x.OrigSrc.Port() != 40001 && x.OrigSrc.Port() != 40002) {
					t.Fatalf("unexpected SCTP entry %v", x)
				}
			}
			// Port-based filters work for SCTP (the ports are decoded).
			mustClear(t, cl, f, 0, ForPortNAT(SCTP, svcPort, e.b.IP(f)), ForPort(SCTP, svcPort+1))
			mustClear(t, cl, f, 0, ForStaleEndpoints(SCTP, svc1(f), svcPort, []netip.AddrPort{netip.AddrPortFrom(e.a.IP(f), podPort)}))
			mustClear(t, cl, f, 2, ForStaleEndpoints(SCTP, svc1(f), svcPort, []netip.AddrPort{netip.AddrPortFrom(e.a.IP(f), podPort+1)}))
			left, err := cl.List(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range left {
				if x.Protocol == SCTP {
					t.Errorf("SCTP entry survived: %v", x)
				}
			}
			e.expect(t, f, []key{udp}, nil) // the UDP flow to the same service IP survives
		})
	}
}
