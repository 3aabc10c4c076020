//go:build netns

package bench

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/test/netns"
)

// Targets of issue 3, printed next to the figures (not asserted).
const (
	targetCold10k    = 2 * time.Second
	targetCold30k    = 5 * time.Second
	targetEndpointTx = 2 * time.Millisecond
	targetServiceTx  = time.Millisecond
	targetLatency    = 10 * time.Microsecond
	// kube-proxy v1.36.3 nftables mode at 10k services (PERF-NOTES.md).
	kubeProxyCold10k     = 34 * time.Second
	kubeProxyEndpoint10k = 6300 * time.Millisecond // 6.3–6.7 s; the favourable end
)

// sizeResult is everything measured at one cluster size.
type sizeResult struct {
	n        int
	cold     coldStart
	ep       churn
	add, del churn
	// connect() times per family: before any rule, with conntrack and NAT on but no
	// rule, with dsproxy's rules (direct and through the ClusterIP), and after the
	// tables were removed again.
	before, ctOnly, direct, cip, after map[*family.Family][]time.Duration
}

// TestKernelFigures measures dsproxy against the real kernel in network namespaces
// and prints a table of figures: cold start of both families, one-endpoint and
// one-service transactions, and first-packet (TCP connect) latency through a
// ClusterIP. Targets are printed, not asserted; the test fails only on functional
// errors (a sync error, a failed connection).
//
//	DSPROXY_BENCH_SIZES=10000,30000 go test -tags netns -run TestKernelFigures -v -count=1 -timeout 30m ./bench/
//
// DSPROXY_BENCH_SIZES (default 1000), DSPROXY_BENCH_CHANGES (endpoint changes,
// default 200; service add/delete pairs are half as many) and
// DSPROXY_BENCH_CONNECTS (connections per target, default 2000) select the work.
func TestKernelFigures(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	sizes := envInts(t, "DSPROXY_BENCH_SIZES", []int{1000})
	changes := envInts(t, "DSPROXY_BENCH_CHANGES", []int{200})[0]
	connects := envInts(t, "DSPROXY_BENCH_CONNECTS", []int{2000})[0]
	var rows []*sizeResult
	for _, n := range sizes {
		t.Run(fmt.Sprintf("services=%d", n), func(t *testing.T) {
			r := runSize(t, n, changes, connects)
			printFigures(os.Stdout, []*sizeResult{r})
			rows = append(rows, r)
		})
	}
	if len(rows) > 1 {
		fmt.Println("\n=== all sizes ===")
		printFigures(os.Stdout, rows)
	}
}

func runSize(t *testing.T, n, changes, connects int) *sizeResult {
	ctx := t.Context()
	c := netns.New(t)
	pods := make([]*netns.NS, probePods)
	for j := range pods {
		pods[j] = c.AddPod(fmt.Sprintf("ep%d", j))
		pods[j].Serve(netns.TCP, 8080)
	}
	if err := widenPortRange(c.External); err != nil {
		t.Fatal(err)
	}
	w := Workload{Services: n, EndpointsPerFamily: 10, NodePortEvery: nodePortEvery(n), NodeName: benchNodeName}
	probe := n / 2
	nd := newNode(t, c, w, probe, pods)
	r := &sizeResult{n: n}

	direct := map[*family.Family]netip.AddrPort{}
	cip := map[*family.Family]netip.AddrPort{}
	for _, f := range family.All {
		direct[f] = netip.AddrPortFrom(pods[0].IP(f), 8080)
		cip[f] = netip.AddrPortFrom(ServiceIP(f, probe), 80)
	}
	directOnly := func() map[*family.Family][]time.Duration {
		t.Helper()
		ds, err := connectLatency(c.External, []netip.AddrPort{direct[family.IPv4], direct[family.IPv6]}, connects, 100)
		if err != nil {
			t.Fatalf("connect without rules: %v", err)
		}
		return map[*family.Family][]time.Duration{family.IPv4: ds[0], family.IPv6: ds[1]}
	}

	r.before = directOnly()
	if err := setConntrackOnly(ctx, nd.fams[0].k.Kernel, true); err != nil {
		t.Fatal(err)
	}
	r.ctOnly = directOnly()
	if err := setConntrackOnly(ctx, nd.fams[0].k.Kernel, false); err != nil {
		t.Fatal(err)
	}

	var err error
	if r.cold, err = nd.coldStart(ctx); err != nil {
		t.Fatalf("cold start: %v", err)
	}
	for _, fp := range nd.fams {
		tables, err := fp.k.ListTables(ctx, fp.f)
		if err != nil || len(tables) != 1 {
			t.Fatalf("%s tables after the cold start: %v, %v", fp.f, tables, err)
		}
	}
	t.Logf("cold start: %v; kernel transactions IPv4 %v, IPv6 %v", r.cold.total, r.cold.kernel[family.IPv4], r.cold.kernel[family.IPv6])

	rnd := rand.New(rand.NewPCG(uint64(n), 3))
	if r.ep, err = nd.endpointChurn(ctx, changes, rnd.IntN); err != nil {
		t.Fatalf("endpoint churn: %v", err)
	}
	for _, f := range family.All {
		t.Logf("%s endpoint changes, slowest transactions: %v", f, slowestN(r.ep.kernel[f], 5))
	}
	if r.add, r.del, err = nd.serviceChurn(ctx, max(changes/2, 1)); err != nil {
		t.Fatalf("service churn: %v", err)
	}

	ds, err := connectLatency(c.External, []netip.AddrPort{direct[family.IPv4], cip[family.IPv4], direct[family.IPv6], cip[family.IPv6]}, connects, 100)
	if err != nil {
		t.Fatalf("connect with %d services programmed: %v", n, err)
	}
	r.direct = map[*family.Family][]time.Duration{family.IPv4: ds[0], family.IPv6: ds[2]}
	r.cip = map[*family.Family][]time.Duration{family.IPv4: ds[1], family.IPv6: ds[3]}

	if err := nd.cleanup(ctx); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	r.after = directOnly()
	return r
}

// slowestN returns the n longest durations, longest first.
func slowestN(ds []time.Duration, n int) []time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	slices.Reverse(s)
	return s[:min(n, len(s))]
}

func envInts(t *testing.T, name string, def []int) []int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out []int
	for s := range strings.SplitSeq(v, ",") {
		i, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || i <= 0 {
			t.Fatalf("%s=%q: want positive integers separated by commas", name, v)
		}
		out = append(out, i)
	}
	return out
}

// printFigures prints the figure tables for rows.
func printFigures(out io.Writer, rows []*sizeResult) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	p := func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t") }

	fmt.Fprintln(out, "\n1. Cold start: handlers + both families' first full sync in parallel, into a fresh netns")
	p("services", "feed", "IPv4 sync", "IPv6 sync", "both programmed", "target", "IPv4 kernel (txs, sum, max)", "IPv6 kernel (txs, sum, max)", "CPU (this / others)", "peak heap", "peak RSS", "live heap", "kube-proxy 10k / this")
	for _, r := range rows {
		cs := r.cold
		target := "-"
		switch {
		case r.n <= 10000:
			target = "≤ " + fmtDur(targetCold10k)
		case r.n <= 30000:
			target = "≤ " + fmtDur(targetCold30k)
		}
		ratio := "-"
		if r.n == 10000 {
			ratio = fmt.Sprintf("%.0f×", float64(kubeProxyCold10k)/float64(cs.total))
		}
		p(strconv.Itoa(r.n), fmtDur(cs.feed), fmtDur(cs.sync[family.IPv4]), fmtDur(cs.sync[family.IPv6]), fmtDur(cs.total), target,
			txSummary(cs.kernel[family.IPv4]), txSummary(cs.kernel[family.IPv6]),
			fmtDur(cs.cpu)+" / "+fmtDur(cs.otherCPU), fmtBytes(cs.peakHeap), fmtBytes(cs.peakRSS), fmtBytes(cs.liveHeap), ratio)
	}
	tw.Flush()

	fmt.Fprintln(out, "\n2. One endpoint added or removed (random services; kernel = the one transaction, sync = proxier Sync: model + diff + kernel)")
	p("services", "family", "changes", "kernel p50", "kernel p99", "kernel max", "target p99", "sync p50", "sync p99", "structural (n, max)", "kube-proxy 10k / sync p50")
	for _, r := range rows {
		for _, f := range family.All {
			k, s := r.ep.kernel[f], r.ep.sync[f]
			ratio := "-"
			if r.n == 10000 {
				ratio = fmt.Sprintf("%.0f×", float64(kubeProxyEndpoint10k)/float64(percentile(s, 50)))
			}
			p(strconv.Itoa(r.n), f.Name, strconv.Itoa(len(k)), fmtDur(percentile(k, 50)), fmtDur(percentile(k, 99)), fmtDur(percentile(k, 100)),
				"≤ "+fmtDur(targetEndpointTx), fmtDur(percentile(s, 50)), fmtDur(percentile(s, 99)), structural(r.ep.structural[f]), ratio)
		}
	}
	tw.Flush()

	fmt.Fprintln(out, "\n3. Add then delete one ClusterIP service with 10 endpoints (kernel transaction each)")
	p("services", "family", "pairs", "add p50", "add p99", "delete p50", "delete p99", "both p99", "target p99", "sync p50", "sync p99", "structural (n, max)")
	for _, r := range rows {
		for _, f := range family.All {
			a, d := r.add.kernel[f], r.del.kernel[f]
			both := append(append([]time.Duration(nil), a...), d...)
			syncs := append(append([]time.Duration(nil), r.add.sync[f]...), r.del.sync[f]...)
			p(strconv.Itoa(r.n), f.Name, strconv.Itoa(len(a)), fmtDur(percentile(a, 50)), fmtDur(percentile(a, 99)),
				fmtDur(percentile(d, 50)), fmtDur(percentile(d, 99)), fmtDur(percentile(both, 99)), "≤ "+fmtDur(targetServiceTx),
				fmtDur(percentile(syncs, 50)), fmtDur(percentile(syncs, 99)), structural(append(slices.Clone(r.add.structural[f]), r.del.structural[f]...)))
		}
	}
	tw.Flush()

	fmt.Fprintln(out, "\n4. TCP connect() from the external netns through the node netns to a pod (each a new conntrack entry)")
	p("services", "family", "connects", "no rules p50", "p99", "conntrack only p50", "p99", "direct+rules p50", "p99", "ClusterIP p50", "p99", "ClusterIP − no rules (p50)", "ClusterIP − conntrack only (p50)", "ClusterIP − direct (p50)", "target", "no rules again p50")
	for _, r := range rows {
		for _, f := range family.All {
			b, ct, d, c, a := r.before[f], r.ctOnly[f], r.direct[f], r.cip[f], r.after[f]
			p(strconv.Itoa(r.n), f.Name, strconv.Itoa(len(c)), fmtDur(percentile(b, 50)), fmtDur(percentile(b, 99)),
				fmtDur(percentile(ct, 50)), fmtDur(percentile(ct, 99)),
				fmtDur(percentile(d, 50)), fmtDur(percentile(d, 99)), fmtDur(percentile(c, 50)), fmtDur(percentile(c, 99)),
				fmtDelta(percentile(c, 50)-percentile(b, 50)), fmtDelta(percentile(c, 50)-percentile(ct, 50)), fmtDelta(percentile(c, 50)-percentile(d, 50)),
				"≤ "+fmtDur(targetLatency), fmtDur(percentile(a, 50)))
		}
	}
	tw.Flush()
}

func structural(ds []time.Duration) string {
	if len(ds) == 0 {
		return "0"
	}
	return fmt.Sprintf("%d, %s", len(ds), fmtDur(percentile(ds, 100)))
}

func txSummary(ds []time.Duration) string {
	return fmt.Sprintf("%d, %s, %s", len(ds), fmtDur(sum(ds)), fmtDur(percentile(ds, 100)))
}

func fmtDur(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.1f µs", float64(d)/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
}

func fmtDelta(d time.Duration) string {
	if d < 0 {
		return "−" + fmtDur(-d)
	}
	return "+" + fmtDur(d)
}

func fmtBytes(b uint64) string { return fmt.Sprintf("%d MiB", b>>20) }
