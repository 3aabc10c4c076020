//go:build netns

package netns

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/dsproxy/dsproxy/pkg/family"
)

const (
	srvPort    = 8080
	dialTimout = 3 * time.Second
)

// protoSubtest runs fn as a subtest per protocol, skipping SCTP when the kernel has
// no SCTP sockets.
func protoSubtests(t *testing.T, c *Cluster, fn func(t *testing.T, p Proto)) {
	sctpErr := SCTPSupported(c.Node)
	for _, p := range Protos {
		t.Run(string(p), func(t *testing.T) {
			if p == SCTP && sctpErr != nil {
				SkipSCTP(t, sctpErr)
			}
			fn(t, p)
		})
	}
}

func serveAll(c *Cluster, sctp bool, nss ...*NS) {
	for _, n := range nss {
		n.Serve(TCP, srvPort)
		n.Serve(UDP, srvPort)
		if sctp {
			n.Serve(SCTP, srvPort)
		}
	}
}

func expectReply(t *testing.T, c *Cluster, from *NS, p Proto, dst netip.AddrPort, server string, src netip.Addr) {
	t.Helper()
	r, err := Dial(from, p, dst, dialTimout)
	if err != nil {
		t.Fatalf("%s -> %s: %v\n%s", from, dst, err, c.Debug())
	}
	if r.Server != server || r.ObservedSrc.Addr() != src {
		t.Fatalf("%s -> %s %s: got %v, want server %s and source %s", from, p, dst, r, server, src)
	}
	if r.ObservedSrc.Port() != r.Local.Port() {
		t.Errorf("%s -> %s %s: observed port %d != local port %d without NAT", from, p, dst, r.ObservedSrc.Port(), r.Local.Port())
	}
}

func TestConnectivity(t *testing.T) {
	c := New(t)
	a := c.AddPod("pod-a")
	b := c.AddPod("pod-b")
	r := c.AddRemotePod("pod-r")
	sctp := SCTPSupported(c.Node) == nil
	serveAll(c, sctp, a, b, r, c.Node)

	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			protoSubtests(t, c, func(t *testing.T, p Proto) {
				cases := []struct {
					from, to *NS
					src      netip.Addr
				}{
					{a, b, a.IP(f)},                   // pod to pod on the node
					{c.Node, a, c.Node.IP(f)},         // node to pod: the node IP
					{a, c.Node, a.IP(f)},              // pod to host-network server
					{c.External, a, c.External.IP(f)}, // outside client to pod, routed by the node
					{c.External, c.Node, c.External.IP(f)},
					{a, r, a.IP(f)}, // pod to pod on the remote node
					{r, b, r.IP(f)},
					{c.Node, r, c.Node.IP(f)},
				}
				for _, tc := range cases {
					expectReply(t, c, tc.from, p, netip.AddrPortFrom(tc.to.IP(f), srvPort), tc.to.Name, tc.src)
				}
			})
		})
	}
}

func TestRefusedIsFast(t *testing.T) {
	c := New(t)
	a := c.AddPod("pod-a")
	b := c.AddPod("pod-b")
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			protoSubtests(t, c, func(t *testing.T, p Proto) {
				for _, tc := range []struct{ from, to *NS }{{a, b}, {c.Node, a}, {c.External, b}} {
					// Several tries in a row: ICMP rate limiting must not turn refused into timeout.
					for range 5 {
						start := time.Now()
						_, err := Dial(tc.from, p, netip.AddrPortFrom(tc.to.IP(f), 9), 5*time.Second)
						if !IsRefused(err) || IsTimeout(err) {
							t.Fatalf("%s -> %s port 9: got %v, want refused", tc.from, tc.to, err)
						}
						var de *DialError
						if !errors.As(err, &de) || de.Dst.Port() != 9 {
							t.Fatalf("error %v is not a *DialError", err)
						}
						if d := time.Since(start); d > time.Second {
							t.Errorf("%s -> %s: refused dial took %v, want < 1s", tc.from, tc.to, d)
						}
					}
				}
			})
		})
	}
}

func TestTimeoutAndUnreachable(t *testing.T) {
	c := New(t)
	a := c.AddPod("pod-a")
	b := c.AddPod("pod-b")
	sctp := SCTPSupported(c.Node) == nil
	serveAll(c, sctp, b)
	// Drop forwarded traffic to b's port in the node: the client must time out.
	if out, err := ExecStdin(c.Node, strings.NewReader(`
table inet harness_drop {
	chain forward_drop {
		type filter hook forward priority 0; policy accept;
		th dport 8080 drop
	}
}`), "nft", "-f", "-"); err != nil {
		t.Fatalf("nft: %v %s", err, out)
	}
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			protoSubtests(t, c, func(t *testing.T, p Proto) {
				start := time.Now()
				_, err := Dial(a, p, netip.AddrPortFrom(b.IP(f), srvPort), 300*time.Millisecond)
				if !IsTimeout(err) || IsRefused(err) {
					t.Fatalf("dropped: got %v, want timeout", err)
				}
				if d := time.Since(start); d > 2*time.Second {
					t.Errorf("timeout of 300ms took %v", d)
				}
				// An address in the pod range without a pod: the node has no route and
				// answers ICMP net unreachable.
				nowhere := netip.AddrPortFrom(nthAddr(LocalPodCIDRs[slices.Index(family.All, f)], 200), srvPort)
				_, err = Dial(a, p, nowhere, 3*time.Second)
				if !errors.Is(err, ErrUnreachable) {
					t.Fatalf("unrouted %s: got %v, want unreachable", nowhere, err)
				}
			})
		})
	}
}

// TestMasquerade checks that the harness observes SNAT: with a masquerade rule in
// the node (added with the nft binary, test only) an external client's connections
// to a pod arrive from the node IP instead of the client's address.
func TestMasquerade(t *testing.T) {
	c := New(t)
	a := c.AddPod("pod-a")
	sctp := SCTPSupported(c.Node) == nil
	serveAll(c, sctp, a)

	check := func(t *testing.T, p Proto, f *family.Family, want netip.Addr) {
		t.Helper()
		r, err := Dial(c.External, p, netip.AddrPortFrom(a.IP(f), srvPort), dialTimout)
		if err != nil {
			t.Fatalf("%v\n%s", err, c.Debug())
		}
		if r.ObservedSrc.Addr() != want {
			t.Fatalf("%s %s: observed %s, want %s\n%s", f, p, r.ObservedSrc, want, Debug(c.Node))
		}
	}
	for _, f := range family.All {
		for _, p := range Protos {
			if p == SCTP && !sctp {
				continue
			}
			check(t, p, f, c.External.IP(f))
		}
	}
	if out, err := ExecStdin(c.Node, strings.NewReader(`
table inet harness_masq {
	chain post {
		type nat hook postrouting priority srcnat; policy accept;
		ip daddr 10.64.0.0/24 masquerade
		ip6 daddr fd00:64::/64 masquerade
	}
}`), "nft", "-f", "-"); err != nil {
		t.Fatalf("nft: %v %s", err, out)
	}
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			protoSubtests(t, c, func(t *testing.T, p Proto) {
				check(t, p, f, c.Node.IP(f))
			})
		})
	}
}

func readNetnsDir(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(netnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	// Only this test binary's namespaces: other packages' tests may run concurrently.
	prefix := fmt.Sprintf("dsp%d-", os.Getpid())
	var names []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			names = append(names, e.Name())
		}
	}
	return names
}

func hostState(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		b.WriteString(l.Attrs().Name + " ")
	}
	for _, k := range []string{
		"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding", "net/ipv6/conf/all/accept_dad",
		"net/ipv6/conf/default/accept_dad", "net/ipv4/conf/all/rp_filter", "net/ipv4/icmp_ratelimit",
		"net/ipv6/icmp/ratelimit",
	} {
		v, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(k + "=" + strings.TrimSpace(string(v)) + " ")
	}
	return b.String()
}

func TestCleanupLeavesNothing(t *testing.T) {
	before := readNetnsDir(t)
	hostBefore := hostState(t)
	threadNS, _ := os.Readlink("/proc/thread-self/ns/net")

	c := New(t)
	a := c.AddPod("pod-a")
	r := c.AddRemotePod("pod-r")
	serveAll(c, SCTPSupported(c.Node) == nil, a, r)
	if _, err := Dial(c.External, TCP, netip.AddrPortFrom(r.IPv6, srvPort), dialTimout); err != nil {
		t.Fatal(err)
	}
	during := readNetnsDir(t)
	var ours []string
	for _, n := range during {
		if strings.HasPrefix(n, c.Prefix()+"-") {
			ours = append(ours, n)
		}
	}
	if len(ours) != 5 { // node, external, pod-a, remote-node, pod-r
		t.Fatalf("namespaces during the test: %v", during)
	}
	if out, err := Exec(c.Node, "ip", "-br", "link"); err != nil || !strings.Contains(out, "ext0") {
		t.Fatalf("Exec in node: %v %q", err, out)
	}
	var nodeLinks []string
	if err := RunIn(c.Node, func() error {
		ls, err := netlink.LinkList() // a plain netlink call, in the node's namespace
		for _, l := range ls {
			nodeLinks = append(nodeLinks, l.Attrs().Name)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(nodeLinks)
	if want := []string{"ext0", "lo", "rn0", "vp0"}; !slices.Equal(nodeLinks, want) {
		t.Errorf("links in node: %v, want %v", nodeLinks, want)
	}
	if tn, _ := os.Readlink("/proc/thread-self/ns/net"); tn != threadNS {
		t.Fatalf("test thread changed namespace: %s -> %s", threadNS, tn)
	}

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if after := readNetnsDir(t); !slices.Equal(before, after) {
		t.Errorf("/run/netns before %v, after %v", before, after)
	}
	if out, err := runHost("ip", "netns", "list"); err == nil && strings.Contains(out, c.Prefix()) {
		t.Errorf("ip netns list still shows the cluster:\n%s", out)
	}
	if hostAfter := hostState(t); hostAfter != hostBefore {
		t.Errorf("host network namespace changed:\nbefore %s\nafter  %s", hostBefore, hostAfter)
	}
}

// runHost runs a read-only command in the test's own (host) namespace.
func runHost(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	return string(out), err
}

// TestDialSCTPSurvivesLostInit checks that an SCTP dial, like a TCP one, survives one
// lost INIT: the node drops the first packet of each client port once, and the dial
// must still be served well within its timeout (the kernel's default initial
// retransmission timeout, 3 s, would time it out).
func TestDialSCTPSurvivesLostInit(t *testing.T) {
	c := New(t)
	c.RequireSCTP()
	a := c.AddPod("pod-a")
	b := c.AddPod("pod-b")
	b.Serve(SCTP, srvPort)
	if out, err := ExecStdin(c.Node, strings.NewReader(`
table inet harness_lose {
	set seen {
		type inet_service
		flags dynamic
	}
	chain forward_lose {
		type filter hook forward priority 0; policy accept;
		meta l4proto sctp th dport 8080 th sport != @seen add @seen { th sport } drop
	}
}`), "nft", "-f", "-"); err != nil {
		t.Fatalf("nft: %v %s", err, out)
	}
	for _, f := range family.All {
		for range 3 {
			start := time.Now()
			r, err := Dial(a, SCTP, netip.AddrPortFrom(b.IP(f), srvPort), dialTimout)
			if err != nil {
				t.Fatalf("%s sctp with its first INIT lost: %v", f.Name, err)
			}
			if d := time.Since(start); r.Server != b.Name || d < sctpInitialRTO-50*time.Millisecond {
				t.Fatalf("%s sctp: served by %s after %v, want %s after at least one retransmission (%v)", f.Name, r.Server, d, b.Name, sctpInitialRTO)
			}
		}
	}
}
