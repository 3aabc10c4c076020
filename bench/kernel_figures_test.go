//go:build netns

package bench

import (
	"context"
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
	// connect() latency from outside the cluster (the external netns; ClusterIP
	// traffic masqueraded) and from a client pod on the node (inside the node's pod
	// CIDR: not masqueraded, the usual way a ClusterIP is reached).
	ext, pod latency
	// after: external connects once the tables were removed again (drift check).
	after map[*family.Family][]time.Duration
	// full is the wall time of each periodic full sync (state recompute for every
	// port, kernel read-back and repair), per family.
	full map[*family.Family][]time.Duration
}

// latency is connect() times per family. Phases alternate in rounds so that drift
// in the machine's load falls on both sides of a comparison alike: before the cold
// start, no rules ↔ conntrack only (a table with two empty NAT base chains); once
// programmed, dsproxy's tables asleep (flag dormant: hooks off, conntrack on) ↔
// awake (direct and ClusterIP connects interleaved).
type latency struct {
	noRules, ctOnly, asleep, direct, cip map[*family.Family][]time.Duration
}

// latencyRounds is the number of alternations per comparison.
const latencyRounds = 10

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
// DSPROXY_BENCH_COUNT_SPREAD=K (1 … probePods−1) gives the other Services 1 … K
// endpoints instead of 10: K distinct endpoint counts (dispatch groups), all below
// the probe Service's (when each group was a rule, its first packets walked them).
// DSPROXY_BENCH_TX_ELEMENTS=N sets the nftables backend's MaxElementsPerTx (the
// cold start's transaction size).
func TestKernelFigures(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	sizes := envInts(t, "DSPROXY_BENCH_SIZES", []int{1000})
	changes := envInts(t, "DSPROXY_BENCH_CHANGES", []int{200})[0]
	connects := envInts(t, "DSPROXY_BENCH_CONNECTS", []int{2000})[0]
	spread := 0
	if os.Getenv("DSPROXY_BENCH_COUNT_SPREAD") != "" {
		spread = envInts(t, "DSPROXY_BENCH_COUNT_SPREAD", nil)[0]
		if spread >= probePods {
			t.Fatalf("DSPROXY_BENCH_COUNT_SPREAD=%d: want at most %d (below the probe Service's %d endpoints)", spread, probePods-1, probePods)
		}
	}
	var rows []*sizeResult
	for _, n := range sizes {
		t.Run(fmt.Sprintf("services=%d", n), func(t *testing.T) {
			if spread > 0 {
				t.Logf("endpoint counts 1 … %d (probe Service: %d)", spread, probePods)
			}
			r := runSize(t, n, spread, changes, connects)
			printFigures(os.Stdout, []*sizeResult{r})
			rows = append(rows, r)
		})
	}
	if len(rows) > 1 {
		fmt.Println("\n=== all sizes ===")
		printFigures(os.Stdout, rows)
	}
}

// probeCluster is a harness cluster with the probe Service's server pods (TCP on
// 8080) and a client pod.
func probeCluster(t *testing.T) (c *netns.Cluster, pods []*netns.NS, client *netns.NS) {
	c = netns.New(t)
	pods = make([]*netns.NS, probePods)
	for j := range pods {
		pods[j] = c.AddPod(fmt.Sprintf("ep%d", j))
		pods[j].Serve(netns.TCP, 8080)
	}
	return c, pods, c.AddPod("client")
}

func runSize(t *testing.T, n, spread, changes, connects int) *sizeResult {
	ctx := t.Context()
	c, pods, client := probeCluster(t)
	w := Workload{Services: n, EndpointsPerFamily: 10, CountSpread: spread, NodePortEvery: nodePortEvery(n), NodeName: benchNodeName}
	probe := n / 2
	nd := newNode(t, c, w, probe, pods)
	r := &sizeResult{n: n}

	direct := map[*family.Family]netip.AddrPort{}
	cip := map[*family.Family]netip.AddrPort{}
	for _, f := range family.All {
		direct[f] = netip.AddrPortFrom(pods[0].IP(f), 8080)
		cip[f] = netip.AddrPortFrom(ServiceIP(f, probe), 80)
	}
	directs := []netip.AddrPort{direct[family.IPv4], direct[family.IPv6]}
	targets := []netip.AddrPort{direct[family.IPv4], cip[family.IPv4], direct[family.IPv6], cip[family.IPv6]}
	perRound := max(connects/latencyRounds, 1)
	byFamily := func(ds [][]time.Duration, i4, i6 int) map[*family.Family][]time.Duration {
		return map[*family.Family][]time.Duration{family.IPv4: ds[i4], family.IPv6: ds[i6]}
	}
	k := nd.fams[0].k.Kernel
	clients := []struct {
		ns  *netns.NS
		out *latency
	}{{c.External, &r.ext}, {client, &r.pod}}
	for _, cl := range clients {
		a, b, err := alternate(cl.ns, latencyRounds, perRound,
			func() error { return setConntrackOnly(ctx, k, false) }, func() error { return setConntrackOnly(ctx, k, true) }, directs, directs)
		if err != nil {
			t.Fatalf("connect from %v without proxy rules: %v", cl.ns, err)
		}
		cl.out.noRules, cl.out.ctOnly = byFamily(a, 0, 1), byFamily(b, 0, 1)
	}
	if err := setConntrackOnly(ctx, k, false); err != nil {
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

	if r.full, err = nd.fullSyncs(ctx, 3); err != nil {
		t.Fatalf("periodic full sync: %v", err)
	}

	asleep := func() error { return setDormant(ctx, c.Node, k, true) }
	awake := func() error { return setDormant(ctx, c.Node, k, false) }
	if err := checkDormancy(ctx, c.Node, nd, asleep, awake); err != nil {
		t.Fatal(err)
	}
	for _, cl := range clients {
		a, b, err := alternate(cl.ns, latencyRounds, perRound, asleep, awake, directs, targets)
		if err != nil {
			t.Fatalf("connect from %v with %d services programmed: %v", cl.ns, n, err)
		}
		cl.out.asleep, cl.out.direct, cl.out.cip = byFamily(a, 0, 1), byFamily(b, 0, 2), byFamily(b, 1, 3)
	}

	if err := nd.cleanup(ctx); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	ds, err := connectLatency(c.External, directs, connects, 100)
	if err != nil {
		t.Fatalf("connect once the tables are gone: %v", err)
	}
	r.after = byFamily(ds, 0, 1)
	return r
}

// checkDormancy makes sure the asleep/awake switch does what the latency phases
// assume: every table of both families dormant, then none.
func checkDormancy(ctx context.Context, node *netns.NS, nd *node, asleep, awake func() error) error {
	for _, want := range []bool{true, false} {
		set := awake
		if want {
			set = asleep
		}
		if err := set(); err != nil {
			return err
		}
		for _, fp := range nd.fams {
			tables, err := fp.k.ListTables(ctx, fp.f)
			if err != nil {
				return err
			}
			for _, tb := range tables {
				got, err := isDormant(ctx, node, fp.f, tb)
				if err != nil {
					return err
				}
				if got != want {
					return fmt.Errorf("%s table %s: dormant %v, want %v", fp.f, tb, got, want)
				}
			}
		}
	}
	return nil
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

	printLatency := func(title string, l func(*sizeResult) latency, after bool) {
		fmt.Fprintln(out, "\n"+title)
		cols := []string{"services", "family", "connects", "no rules p50", "conntrack only p50", "rules asleep p50", "direct+rules p50", "p99", "ClusterIP p50", "p99",
			"conntrack (ct only − no rules)", "dsproxy (ClusterIP − asleep)", "sum", "ClusterIP − no rules", "target"}
		if after {
			cols = append(cols, "no rules again p50")
		}
		p(cols...)
		for _, r := range rows {
			lt := l(r)
			for _, f := range family.All {
				nr, ct, as, d, c := percentile(lt.noRules[f], 50), percentile(lt.ctOnly[f], 50), percentile(lt.asleep[f], 50), percentile(lt.direct[f], 50), percentile(lt.cip[f], 50)
				cells := []string{strconv.Itoa(r.n), f.Name, strconv.Itoa(len(lt.cip[f])), fmtDur(nr), fmtDur(ct), fmtDur(as),
					fmtDur(d), fmtDur(percentile(lt.direct[f], 99)), fmtDur(c), fmtDur(percentile(lt.cip[f], 99)),
					fmtDelta(ct - nr), fmtDelta(c - as), fmtDelta(ct - nr + c - as), fmtDelta(c - nr), "≤ " + fmtDur(targetLatency)}
				if after {
					cells = append(cells, fmtDur(percentile(r.after[f], 50)))
				}
				p(cells...)
			}
		}
		tw.Flush()
	}
	printLatency("4a. TCP connect() from the external netns through the node netns to a pod (a new conntrack entry each; ClusterIP traffic masqueraded); phases alternated, see latency", func(r *sizeResult) latency { return r.ext }, true)
	printLatency("4b. The same from a client pod on the node (inside the node's pod CIDR: not masqueraded)", func(r *sizeResult) latency { return r.pod }, false)

	fmt.Fprintln(out, "\n5. Periodic full sync once programmed (every port's state recomputed, kernel read back and compared, nothing to repair)")
	p("services", "family", "syncs", "min", "max")
	for _, r := range rows {
		for _, f := range family.All {
			p(strconv.Itoa(r.n), f.Name, strconv.Itoa(len(r.full[f])), fmtDur(percentile(r.full[f], 0)), fmtDur(percentile(r.full[f], 100)))
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
