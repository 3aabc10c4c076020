//go:build netns

package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/test/netns"
)

// ipTablesResult is what TestIPTablesFigures measured at one size.
type ipTablesResult struct {
	n         int
	cold      coldStart
	ep        churn
	add, del  churn
	full      map[*family.Family][]time.Duration
	check     map[*family.Family][]time.Duration // the periodic drift check (Flushed)
	rules     map[*family.Family]map[string]int  // after the cold start, per table
	direct    map[*family.Family][]time.Duration
	clusterIP map[*family.Family][]time.Duration
}

// TestIPTablesFigures measures dsproxy's iptables backend against the real kernel
// the way TestKernelFigures measures the nftables one: cold start of both
// families, one-endpoint and one-service syncs (each one iptables-restore per
// family), periodic full syncs, and the first-packet (TCP connect) cost of a
// ClusterIP against connecting to the endpoint directly, from a client pod on the
// node. Figures are printed, not asserted; the test fails only on functional
// errors.
//
//	DSPROXY_BENCH_SIZES=1000,10000 go test -tags netns -run TestIPTablesFigures -v -count=1 -timeout 60m ./bench/
//
// DSPROXY_BENCH_CHANGES (endpoint changes, default 100; service add/delete pairs
// are half as many) and DSPROXY_BENCH_CONNECTS (connections per target, default
// 1000) select the work; DSPROXY_BENCH_IPTABLES=legacy runs the legacy binaries
// instead of the default ones (iptables-nft on Debian).
func TestIPTablesFigures(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	mode, suffix := "iptables", ""
	switch v := os.Getenv("DSPROXY_BENCH_IPTABLES"); v {
	case "":
	case "legacy":
		mode, suffix = "iptables-legacy", "-legacy"
	default:
		t.Fatalf("DSPROXY_BENCH_IPTABLES=%q: want legacy or nothing", v)
	}
	for _, f := range family.All {
		if _, err := exec.LookPath(f.IPTablesCommand + suffix + "-restore"); err != nil {
			t.Skipf("no %s%s-restore", f.IPTablesCommand, suffix)
		}
	}
	sizes := envInts(t, "DSPROXY_BENCH_SIZES", []int{1000})
	changes := envInts(t, "DSPROXY_BENCH_CHANGES", []int{100})[0]
	connects := envInts(t, "DSPROXY_BENCH_CONNECTS", []int{1000})[0]
	var rows []*ipTablesResult
	for _, n := range sizes {
		t.Run(fmt.Sprintf("services=%d", n), func(t *testing.T) {
			r := runIPTablesSize(t, n, changes, connects, mode, suffix)
			printIPTablesFigures(os.Stdout, []*ipTablesResult{r})
			rows = append(rows, r)
		})
	}
	if len(rows) > 1 {
		fmt.Println("\n=== all sizes ===")
		printIPTablesFigures(os.Stdout, rows)
	}
}

func runIPTablesSize(t *testing.T, n, changes, connects int, mode, suffix string) *ipTablesResult {
	ctx := t.Context()
	c, pods, client := probeCluster(t)
	w := Workload{Services: n, EndpointsPerFamily: 10, NodePortEvery: nodePortEvery(n), NodeName: benchNodeName}
	probe := n / 2
	nd := newNodeMode(t, c, w, probe, pods, mode)
	r := &ipTablesResult{n: n, rules: map[*family.Family]map[string]int{}}
	var err error
	if r.cold, err = nd.coldStart(ctx); err != nil {
		t.Fatalf("cold start: %v", err)
	}
	for _, fp := range nd.fams {
		out, err := netns.Exec(c.Node, fp.f.IPTablesCommand+suffix+"-save")
		if err != nil {
			t.Fatalf("%s%s-save: %v", fp.f.IPTablesCommand, suffix, err)
		}
		r.rules[fp.f] = countRules(out)
	}
	t.Logf("cold start: %v (IPv4 %v, IPv6 %v)", r.cold.total, r.cold.sync[family.IPv4], r.cold.sync[family.IPv6])

	rnd := rand.New(rand.NewPCG(uint64(n), 3))
	if r.ep, err = nd.endpointChurn(ctx, changes, rnd.IntN); err != nil {
		t.Fatalf("endpoint churn: %v", err)
	}
	if r.add, r.del, err = nd.serviceChurn(ctx, max(changes/2, 1)); err != nil {
		t.Fatalf("service churn: %v", err)
	}
	if r.full, err = nd.fullSyncs(ctx, 3); err != nil {
		t.Fatalf("periodic full sync: %v", err)
	}
	if r.check, err = nd.driftChecks(ctx, 5); err != nil {
		t.Fatalf("periodic check: %v", err)
	}
	var targets []netip.AddrPort
	for _, f := range family.All {
		targets = append(targets, netip.AddrPortFrom(pods[0].IP(f), 8080), netip.AddrPortFrom(ServiceIP(f, probe), 80))
	}
	ds, err := connectLatency(client, targets, connects, 100)
	if err != nil {
		t.Fatalf("connect with %d services programmed: %v", n, err)
	}
	r.direct = map[*family.Family][]time.Duration{family.IPv4: ds[0], family.IPv6: ds[2]}
	r.clusterIP = map[*family.Family][]time.Duration{family.IPv4: ds[1], family.IPv6: ds[3]}
	if err := nd.cleanup(ctx); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	return r
}

// driftChecks runs the iptables backends' periodic drift check (what a sync
// with nothing to do, or the first one after each check period, runs) k times
// per family in the node's namespace, timing each; an undisturbed kernel that
// reads as drift is an error.
func (n *node) driftChecks(ctx context.Context, k int) (map[*family.Family][]time.Duration, error) {
	out := map[*family.Family][]time.Duration{}
	for range k {
		for _, fp := range n.fams {
			var flushed bool
			start := time.Now()
			err := netns.RunIn(n.c.Node, func() error { flushed = fp.ib.Flushed(ctx); return nil })
			out[fp.f] = append(out[fp.f], time.Since(start))
			if err != nil {
				return out, err
			}
			if flushed {
				return out, fmt.Errorf("%s: the check reads the undisturbed kernel as drift", fp.f)
			}
		}
	}
	return out, nil
}

// countRules counts an iptables-save's DSPROXY- rules per table.
func countRules(save string) map[string]int {
	out := map[string]int{}
	table := ""
	for line := range strings.SplitSeq(save, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
		case strings.HasPrefix(line, "-A DSPROXY-"):
			out[table]++
		}
	}
	return out
}

func printIPTablesFigures(out io.Writer, rows []*ipTablesResult) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	p := func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t") }
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
	us := func(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d.Nanoseconds())/1000) }
	pp := func(ds []time.Duration) string { return ms(percentile(ds, 50)) + " / " + ms(percentile(ds, 99)) }

	fmt.Fprintln(out, "\niptables backend: cold start (handlers + both families' first sync in parallel), rules after it")
	p("services", "total", "IPv4 sync", "IPv6 sync", "CPU", "peak RSS", "nat rules v4/v6", "filter rules v4/v6")
	for _, r := range rows {
		p(fmt.Sprint(r.n), ms(r.cold.total), ms(r.cold.sync[family.IPv4]), ms(r.cold.sync[family.IPv6]), ms(r.cold.cpu),
			fmt.Sprintf("%d MiB", r.cold.peakRSS>>20),
			fmt.Sprintf("%d / %d", r.rules[family.IPv4]["nat"], r.rules[family.IPv6]["nat"]),
			fmt.Sprintf("%d / %d", r.rules[family.IPv4]["filter"], r.rules[family.IPv6]["filter"]))
	}
	_ = tw.Flush()
	fmt.Fprintln(out, "\niptables backend: one partial sync (one iptables-restore) per change, p50 / p99")
	p("services", "family", "endpoint change", "service add", "service delete", "full sync (median)", "periodic check (median)")
	for _, r := range rows {
		for _, f := range family.All {
			p(fmt.Sprint(r.n), f.Name, pp(r.ep.sync[f]), pp(r.add.sync[f]), pp(r.del.sync[f]), ms(percentile(r.full[f], 50)),
				ms(percentile(r.check[f], 50)))
		}
	}
	_ = tw.Flush()
	fmt.Fprintln(out, "\niptables backend: TCP connect from a client pod, p50 (ClusterIP of the middle Service vs its endpoint directly)")
	p("services", "family", "direct", "ClusterIP", "ClusterIP − direct")
	for _, r := range rows {
		for _, f := range family.All {
			d, c := percentile(r.direct[f], 50), percentile(r.clusterIP[f], 50)
			p(fmt.Sprint(r.n), f.Name, us(d), us(c), us(c-d))
		}
	}
	_ = tw.Flush()
}
