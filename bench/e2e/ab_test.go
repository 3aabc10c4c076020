//go:build e2e && netns

package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dsproxy/dsproxy/test/netns"
)

// TestRulesetAB compares what proxies' node rulesets cost a first packet,
// without the proxies: one node per ruleset file in DSPROXY_BENCH_AB_RULESETS
// (comma-separated; saved by the benchmark's -rulesets), loaded with nft -f,
// and one node without a ruleset, each with a client pod and pods p0 … p9 at
// the benchmark's addresses. Connects from each client, interleaved as in W4:
// direct to p0, spread over the ten pods and, with DSPROXY_BENCH_AB_CLUSTERIPS
// (an IPv4 and an IPv6 ClusterIP of a Service whose endpoints are the ten pods,
// such as the benchmark's svc-0), to those. It prints p50 / p99 per target and
// fails only on functional errors. DSPROXY_BENCH_AB_CONNECTS sets the connects
// per target (2000).
func TestRulesetAB(t *testing.T) {
	files := os.Getenv("DSPROXY_BENCH_AB_RULESETS")
	if files == "" {
		t.Skip("DSPROXY_BENCH_AB_RULESETS is not set")
	}
	n := 2000
	if v := os.Getenv("DSPROXY_BENCH_AB_CONNECTS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("DSPROXY_BENCH_AB_CONNECTS=%q: want a positive number", v)
		}
	}
	var vips []netip.Addr
	if v := os.Getenv("DSPROXY_BENCH_AB_CLUSTERIPS"); v != "" {
		for _, s := range strings.Split(v, ",") {
			a, err := netip.ParseAddr(s)
			if err != nil {
				t.Fatalf("DSPROXY_BENCH_AB_CLUSTERIPS: %v", err)
			}
			vips = append(vips, a)
		}
		if len(vips) != 2 || !vips[0].Is4() || !vips[1].Is6() {
			t.Fatalf("DSPROXY_BENCH_AB_CLUSTERIPS=%q: want an IPv4 and an IPv6 address", v)
		}
	}
	const pods = 10
	type target struct {
		name string
		nsTarget
	}
	var targets []target
	for _, file := range append([]string{""}, strings.Split(files, ",")...) {
		name := "no ruleset"
		c := netns.New(t)
		client := c.AddPod("client")
		for k := range pods {
			p := c.AddPod(fmt.Sprintf("p%d", k))
			if a := podAddrs(k); p.IPv4 != a[0] || p.IPv6 != a[1] {
				t.Fatalf("pod p%d has %v %v, want %v", k, p.IPv4, p.IPv6, a)
			}
			p.Serve(netns.TCP, podPort)
		}
		if file != "" {
			name = strings.TrimSuffix(filepath.Base(file), ".nft")
			rules, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if out, err := netns.ExecStdin(c.Node, strings.NewReader(string(rules)), "nft", "-f", "-"); err != nil {
				t.Fatalf("%s: %v\n%s", file, err, out)
			}
			t.Logf("%s: loaded in %v", name, time.Since(start).Round(time.Millisecond))
		}
		for fi, f := range fams {
			p0 := netip.AddrPortFrom(podAddrs(0)[fi], podPort)
			spread := nsTarget{ns: client, dst: p0}
			for k := range pods {
				spread.spread = append(spread.spread, netip.AddrPortFrom(podAddrs(k)[fi], podPort))
			}
			targets = append(targets,
				target{name + ", direct " + f.Name, nsTarget{ns: client, dst: p0}},
				target{name + ", direct spread " + f.Name, spread})
			if file != "" && vips != nil {
				targets = append(targets, target{name + ", ClusterIP " + f.Name, nsTarget{ns: client, dst: netip.AddrPortFrom(vips[fi], svcPort)}})
			}
		}
	}
	nts := make([]nsTarget, len(targets))
	for i := range targets {
		nts[i] = targets[i].nsTarget
	}
	times, err := connectTimes(nts, n, 100)
	if err != nil {
		t.Fatal(err)
	}
	q := func(ds []time.Duration, p float64) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[int(p*float64(len(s)-1))]
	}
	var b strings.Builder
	for i, tg := range targets {
		fmt.Fprintf(&b, "%-60s %s / %s\n", tg.name, fmtDur(q(times[i], 0.5).Seconds()), fmtDur(q(times[i], 0.99).Seconds()))
	}
	t.Logf("connect p50 / p99 (%d connects per target, interleaved):\n%s", n, b.String())
}
