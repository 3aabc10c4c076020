//go:build e2e && netns

package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsproxy/dsproxy/test/netns"
)

// floorTables are the node rulesets TestConnectFloor compares: nothing, then
// conntrack switched on, then NAT hooks, then filter chains shaped like
// kube-proxy's (and dsproxy's) base chains. None has a Service rule.
var floorTables = []struct{ name, rules string }{
	{"no table", ""},
	{"conntrack", `table inet floor {
	chain forward { type filter hook forward priority 0; ct state new counter; }
}`},
	{"conntrack + NAT hooks", `table inet floor {
	chain forward { type filter hook forward priority 0; ct state new counter; }
	chain nat-pre { type nat hook prerouting priority -100; }
	chain nat-post { type nat hook postrouting priority 100; }
}`},
	{"+ proxy-shaped filter chains", `table inet floor {
	chain forward { type filter hook forward priority 0; ct state new counter; }
	chain nat-pre { type nat hook prerouting priority -100; }
	chain nat-post { type nat hook postrouting priority 100; }
	chain pre-dnat { type filter hook prerouting priority -110; ct state new counter; }
	chain filter-forward { type filter hook forward priority 0; ct state invalid drop; ct state new counter; ct state new counter; }
}`},
}

var counterPackets = regexp.MustCompile(`counter packets (\d+)`)

// TestConnectFloor prints what conntrack and NAT in the node cost a first
// packet before any proxy rule: W4's ClusterIP − no-proxy difference starts
// from there for every proxy that NATs. One bare node per ruleset, connects
// from its client pod to its pod p0 interleaved across the nodes (as W4),
// p50 / p99 per family. It fails only on functional errors; the figures are
// printed. DSPROXY_BENCH_FLOOR_CONNECTS sets the connects per target (2000).
func TestConnectFloor(t *testing.T) {
	n := 2000
	if v := os.Getenv("DSPROXY_BENCH_FLOOR_CONNECTS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("DSPROXY_BENCH_FLOOR_CONNECTS=%q: want a positive number", v)
		}
	}
	var targets []nsTarget
	var nodes []*netns.NS
	for _, ft := range floorTables {
		c := netns.New(t)
		client := c.AddPod("client")
		p := c.AddPod("p0")
		p.Serve(netns.TCP, podPort)
		if ft.rules != "" {
			if out, err := netns.ExecStdin(c.Node, strings.NewReader(ft.rules), "nft", "-f", "-"); err != nil {
				t.Fatalf("%s: %v\n%s", ft.name, err, out)
			}
		}
		nodes = append(nodes, c.Node)
		targets = append(targets, nsTarget{ns: client, dst: netip.AddrPortFrom(p.IPv4, podPort)}, nsTarget{ns: client, dst: netip.AddrPortFrom(p.IPv6, podPort)})
	}
	times, err := connectTimes(targets, n, 100)
	if err != nil {
		t.Fatal(err)
	}
	// Conntrack saw the connects where a table asks for it.
	for i, ft := range floorTables {
		if ft.rules == "" {
			continue
		}
		out, err := netns.Exec(nodes[i], "nft", "list", "chain", "inet", "floor", "forward")
		if err != nil {
			t.Fatalf("%s: %v\n%s", ft.name, err, out)
		}
		m := counterPackets.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("%s: no counter in\n%s", ft.name, out)
		}
		if pk, _ := strconv.Atoi(m[1]); pk < 2*n {
			t.Errorf("%s: conntrack counted %d new connections, want ≥ %d", ft.name, pk, 2*n)
		}
	}
	p := func(ds []time.Duration, q float64) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[int(q*float64(len(s)-1))]
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-30s %-22s %-22s %s\n", "node ruleset", "IPv4 p50 / p99", "IPv6 p50 / p99", "p50 over no table")
	for i, ft := range floorTables {
		v4, v6 := times[2*i], times[2*i+1]
		fmt.Fprintf(&b, "%-30s %-22s %-22s %+.1f / %+.1f µs\n", ft.name,
			fmtDur(p(v4, 0.5).Seconds())+" / "+fmtDur(p(v4, 0.99).Seconds()),
			fmtDur(p(v6, 0.5).Seconds())+" / "+fmtDur(p(v6, 0.99).Seconds()),
			float64(p(v4, 0.5)-p(times[0], 0.5))/1e3, float64(p(v6, 0.5)-p(times[1], 0.5))/1e3)
	}
	t.Logf("first-packet cost before any proxy rule (%d connects per target):\n%s", n, b.String())
}
