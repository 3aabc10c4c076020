//go:build e2e && netns

package e2e

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
)

// Target is one of issue 5's targets for dsproxy (nftables) at one size,
// checked against a report's rows.
type Target struct {
	Target   string `json:"target"`
	Services int    `json:"services"`
	// Value is the measured figure (with the part that is dsproxy's own where
	// the row has it); empty when the report has no finished row for it.
	Value string `json:"value"`
	// Status is "met", "not met" or "not measured: …".
	Status string `json:"status"`
}

// targetSizes are the sizes issue 5 sets W1, W2, W3 and RSS targets at; W4's
// is checked at every size (the is at 30k).
var targetSizes = []int{10000, 30000}

// targets checks the targets against the report's dsproxy rows (a
// value from rows merged from another run names that run): W1 ≤ 2 s at 10k
// and ≤ 5 s at 30k; W2, W3 add and W3 delete p99 ≤ 10 ms at 10k and 30k (end
// to end: API call → kernel; and, on a line of its own, dsproxy's part: watch
// event → kernel); peak RSS ≤ 150 MB at 10k; W4's ClusterIP p50
// within 10 µs of no proxy, per family, where no proxy is the connects beside
// dsproxy spread over the same pods the ClusterIP balances to (the p0-only
// baseline when the run has no spread rows).
func (rep *report) targets() []Target {
	ds := map[string]Row{}
	key := func(proxy, mode, workload string, n int) string {
		return fmt.Sprintf("%s|%s|%s|%d", proxy, mode, workload, n)
	}
	peakRSS := map[int]Row{} // the row with the largest peak RSS, per size
	var sizes []int
	for _, r := range rep.Rows {
		ds[key(r.Proxy, r.Mode, r.Workload, r.Services)] = r
		if r.Proxy == "dsproxy" && r.Mode == "nftables" && r.ok() {
			if r.RSSMiB > peakRSS[r.Services].RSSMiB {
				peakRSS[r.Services] = r
			}
		}
		if r.Proxy == "dsproxy" && r.Mode == "nftables" && !slices.Contains(sizes, r.Services) {
			sizes = append(sizes, r.Services)
		}
	}
	slices.Sort(sizes)
	get := func(workload string, n int) (Row, bool) {
		r, ok := ds[key("dsproxy", "nftables", workload, n)]
		return r, ok
	}
	var out []Target
	check := func(name string, n int, value string, met bool) {
		st := "not met"
		if met {
			st = "met"
		}
		out = append(out, Target{Target: name, Services: n, Value: value, Status: st})
	}
	missing := func(name string, n int, why string) {
		out = append(out, Target{Target: name, Services: n, Status: "not measured: " + why})
	}
	rowStatus := func(r Row, ok bool) string {
		if !ok {
			return "no row"
		}
		return r.Status
	}
	for _, n := range sizes {
		if slices.Contains(targetSizes, n) {
			limit := map[int]float64{10000: 2, 30000: 5}[n]
			name := fmt.Sprintf("W1 cold start ≤ %.0f s", limit)
			if r, ok := get("W1 cold start", n); ok && r.ok() {
				v := fmtDur(r.P50)
				if r.Samples > 1 {
					v += fmt.Sprintf(" (median of %d starts, max %s)", r.Samples, fmtDur(r.Max))
				}
				check(name, n, v+runOf(r), r.P50 <= limit)
			} else {
				missing(name, n, rowStatus(r, ok))
			}
			for _, w := range []string{"W2 endpoint change", "W3 service add", "W3 service delete"} {
				name := w + " p99 ≤ 10 ms"
				r, ok := get(w, n)
				if !ok || !r.ok() {
					missing(name, n, rowStatus(r, ok))
					continue
				}
				v := fmtDur(r.P99)
				if r.ProxyP99 != nil && r.APIP99 != nil {
					v += fmt.Sprintf(" (call → event %s, event → kernel %s)", fmtDur(*r.APIP99), fmtEventDur(*r.ProxyP99))
				}
				check(name, n, v+runOf(r), r.P99 <= 10e-3)
				// The same bound on dsproxy's own part, from the watch event
				// the change needs to the kernel showing it: the rest is the
				// API server's (call → event), which no proxy shortens.
				part := w + " p99 ≤ 10 ms, dsproxy's part (event → kernel)"
				if r.ProxyP99 == nil {
					missing(part, n, "no watch events in this row")
					continue
				}
				check(part, n, fmtEventDur(*r.ProxyP99)+runOf(r), *r.ProxyP99 <= 10e-3)
			}
		}
		if n == 10000 {
			const name = "peak RSS ≤ 150 MB"
			if r, ok := peakRSS[n]; ok {
				rss := r.RSSMiB
				check(name, n, fmt.Sprintf("%.0f MB (%.0f MiB)%s", rss*1.048576, rss, runOf(r)), rss*1.048576 <= 150)
			} else {
				missing(name, n, "no finished dsproxy row")
			}
		}
		for _, fam := range []string{"IPv4", "IPv6"} {
			name := "W4 ClusterIP p50 − no proxy ≤ 10 µs " + fam
			cip, ok := get("W4 connect ClusterIP "+fam, n)
			if !ok || !cip.ok() {
				missing(name, n, rowStatus(cip, ok))
				continue
			}
			base, what := ds[key("no proxy", "beside dsproxy/nftables", "W4 connect no-proxy spread "+fam, n)], "same pods"
			if !base.ok() {
				base, what = ds[key("no proxy", "beside dsproxy/nftables", "W4 connect no-proxy "+fam, n)], "pod p0 only"
			}
			if !base.ok() {
				missing(name, n, "no no-proxy row beside dsproxy")
				continue
			}
			d := cip.P50 - base.P50
			check(name, n, fmt.Sprintf("%+.1f µs (%s − %s, no proxy to %s)%s", d*1e6, fmtDur(cip.P50), fmtDur(base.P50), what, runOf(cip)), d <= 10e-6)
		}
	}
	return out
}

// runOf returns " (run of DATE)" for a row merged from another run, else "".
func runOf(r Row) string {
	if v, ok := strings.CutPrefix(r.Status, "ok "); ok && strings.HasPrefix(v, "(run of ") {
		return " " + v
	}
	return ""
}

// targetTable prints targets as an aligned text table.
func targetTable(ts []Target) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "target (dsproxy nftables)\tservices\tmeasured\tstatus")
	for _, t := range ts {
		v := t.Value
		if v == "" {
			v = "-"
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", t.Target, t.Services, v, t.Status)
	}
	_ = w.Flush()
	return b.String()
}

func TestTargets(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	ds := func(workload string, n int, p50, p99, rss float64) Row {
		return Row{Proxy: "dsproxy", Mode: "nftables", Workload: workload, Services: n, Samples: 50, P50: p50, P99: p99, RSSMiB: rss, Status: "ok"}
	}
	np := func(workload string, n int, p50 float64) Row {
		return Row{Proxy: "no proxy", Mode: "beside dsproxy/nftables", Workload: workload, Services: n, Samples: 500, P50: p50, Status: "ok"}
	}
	w2 := ds("W2 endpoint change", 10000, 5e-3, 12e-3, 120)
	w2.APIP99, w2.ProxyP99 = f(9e-3), f(3e-3)
	// dsproxy's own part over the bound too: its line says so.
	w3del := ds("W3 service delete", 10000, 5e-3, 12e-3, 144)
	w3del.APIP99, w3del.ProxyP99 = f(1e-3), f(11e-3)
	rep := &report{Sizes: []int{10000, 30000}, Rows: []Row{
		// 10k: W1 met, W2 p99 not met (its part met), W3 add missing,
		// W3 delete not met (nor its part); RSS
		// 144 MiB = 151 MB: not met.
		// Five starts: the median is met, the slowest start is not.
		{Proxy: "dsproxy", Mode: "nftables", Workload: "W1 cold start", Services: 10000, Samples: 5, P50: 1.5, P99: 2.4, Max: 2.4, RSSMiB: 100, Status: "ok"},
		w2,
		w3del,
		ds("W4 connect ClusterIP IPv4", 10000, 30e-6, 90e-6, 144),
		ds("W4 connect ClusterIP IPv6", 10000, 40e-6, 90e-6, 144),
		np("W4 connect no-proxy IPv4", 10000, 15e-6),
		np("W4 connect no-proxy spread IPv4", 10000, 21e-6), // +9 µs: met (p0 would be +15)
		np("W4 connect no-proxy IPv6", 10000, 31e-6),        // no spread row: p0, +9 µs
		// 30k: W1 not finished.
		{Proxy: "dsproxy", Mode: "nftables", Workload: "W1 cold start", Services: 30000, Status: "not finished after 6m0s"},
		ds("W4 connect ClusterIP IPv4", 30000, 35e-6, 90e-6, 300),
		// A row without watch events (as from runs before 2026-11-27): its
		// end-to-end figure is checked, dsproxy's part is not measured.
		ds("W2 endpoint change", 30000, 4e-3, 8e-3, 300),
		np("W4 connect no-proxy spread IPv4", 30000, 24e-6), // +11 µs: not met
		// Another run's 1k rows, merged: W1 is no target at 1k, W4 is.
		{Proxy: "dsproxy", Mode: "nftables", Workload: "W1 cold start", Services: 1000, Samples: 1, P50: 9, Status: "ok (run of yesterday)"},
		{Proxy: "dsproxy", Mode: "nftables", Workload: "W4 connect ClusterIP IPv4", Services: 1000, Samples: 500, P50: 30e-6, Status: "ok (run of yesterday)"},
		{Proxy: "no proxy", Mode: "beside dsproxy/nftables", Workload: "W4 connect no-proxy spread IPv4", Services: 1000, Samples: 500, P50: 25e-6, Status: "ok (run of yesterday)"},
		// kube-proxy's rows are not dsproxy's targets.
		{Proxy: "kube-proxy", Mode: "nftables", Workload: "W1 cold start", Services: 30000, Samples: 1, P50: 1, Status: "ok"},
	}}
	got := map[string]Target{}
	for _, tg := range rep.targets() {
		k := fmt.Sprintf("%s@%d", tg.Target, tg.Services)
		if _, dup := got[k]; dup {
			t.Errorf("target %s twice", k)
		}
		got[k] = tg
	}
	want := map[string]string{
		"W4 ClusterIP p50 − no proxy ≤ 10 µs IPv4@1000":                         "met",
		"W4 ClusterIP p50 − no proxy ≤ 10 µs IPv6@1000":                         "not measured: no row",
		"W1 cold start ≤ 2 s@10000":                                             "met",
		"W2 endpoint change p99 ≤ 10 ms@10000":                                  "not met",
		"W3 service add p99 ≤ 10 ms@10000":                                      "not measured: no row",
		"W3 service delete p99 ≤ 10 ms@10000":                                   "not met",
		"W2 endpoint change p99 ≤ 10 ms, dsproxy's part (event → kernel)@10000": "met",
		"W3 service delete p99 ≤ 10 ms, dsproxy's part (event → kernel)@10000":  "not met",
		"peak RSS ≤ 150 MB@10000":                                               "not met",
		"W4 ClusterIP p50 − no proxy ≤ 10 µs IPv4@10000":                        "met",
		"W4 ClusterIP p50 − no proxy ≤ 10 µs IPv6@10000":                        "met",
		"W1 cold start ≤ 5 s@30000":                                             "not measured: not finished after 6m0s",
		"W2 endpoint change p99 ≤ 10 ms@30000":                                  "met",
		"W2 endpoint change p99 ≤ 10 ms, dsproxy's part (event → kernel)@30000": "not measured: no watch events in this row",
		"W3 service add p99 ≤ 10 ms@30000":                                      "not measured: no row",
		"W3 service delete p99 ≤ 10 ms@30000":                                   "not measured: no row",
		"W4 ClusterIP p50 − no proxy ≤ 10 µs IPv4@30000":                        "not met",
		"W4 ClusterIP p50 − no proxy ≤ 10 µs IPv6@30000":                        "not measured: no row",
	}
	for k, st := range want {
		tg, ok := got[k]
		if !ok {
			t.Errorf("no target %s", k)
			continue
		}
		if tg.Status != st {
			t.Errorf("%s: status %q (value %q), want %q", k, tg.Status, tg.Value, st)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected target %s: %+v", k, got[k])
		}
	}
	// The values say what was measured, and against which baseline.
	for k, sub := range map[string]string{
		"W1 cold start ≤ 2 s@10000":                                            "1.50 s (median of 5 starts, max 2.40 s)",
		"W2 endpoint change p99 ≤ 10 ms@10000":                                 "12.0 ms (call → event 9.0 ms, event → kernel 3.0 ms)",
		"W3 service delete p99 ≤ 10 ms, dsproxy's part (event → kernel)@10000": "11.0 ms",
		"peak RSS ≤ 150 MB@10000":                                              "151 MB (144 MiB)",
		"W4 ClusterIP p50 − no proxy ≤ 10 µs IPv4@10000":                       "+9.0 µs (30.0 µs − 21.0 µs, no proxy to same pods)",
		"W4 ClusterIP p50 − no proxy ≤ 10 µs IPv6@10000":                       "+9.0 µs (40.0 µs − 31.0 µs, no proxy to pod p0 only)",
		"W4 ClusterIP p50 − no proxy ≤ 10 µs IPv4@30000":                       "+11.0 µs",
		"W4 ClusterIP p50 − no proxy ≤ 10 µs IPv4@1000":                        "+5.0 µs (30.0 µs − 25.0 µs, no proxy to same pods) (run of yesterday)",
	} {
		if v := got[k].Value; !strings.Contains(v, sub) {
			t.Errorf("%s: value %q, want it to contain %q", k, v, sub)
		}
	}
	tt := targetTable(rep.targets())
	if n := strings.Count(tt, "\n"); n != len(want)+1 {
		t.Errorf("target table has %d lines, want %d:\n%s", n, len(want)+1, tt)
	}
	for _, l := range strings.Split(tt, "\n") {
		if f := strings.Fields(l); strings.HasPrefix(l, "W1 cold start ≤ 5 s ") && (len(f) < 8 || f[6] != "30000" || f[7] != "-" || !strings.HasSuffix(l, "  not measured: not finished after 6m0s")) {
			t.Errorf("target table line %q", l)
		}
	}
}

// TestRenderAgain: a results.json read back (as -render does) gives the same
// rows, and its ratios, table caps and targets come from the rows, not from
// this process's flags.
func TestRenderAgain(t *testing.T) {
	rep := newReport([]int{30000}, 0)
	rep.Rows = []Row{
		{Proxy: "dsproxy", Mode: "nftables", Workload: "W1 cold start", Services: 30000, Samples: 1, P50: 4.5, P99: 4.5, CPU: 6, RSSMiB: 300, Status: "ok"},
		{Proxy: "kube-proxy", Mode: "nftables", Workload: "W1 cold start", Services: 30000, CPU: 100, RSSMiB: 900, Status: "not finished after 6m0s"},
		{Proxy: "kube-proxy", Mode: "iptables", Workload: "W2 endpoint change", Services: 30000, Status: "not finished: a change took > 3m0s (0 of 50 samples done)"},
	}
	dir := t.TempDir()
	if err := rep.write(dir); err != nil {
		t.Fatal(err)
	}
	got, err := readReport(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Rows) != len(rep.Rows) || got.Rows[0].P50 != 4.5 || got.Sizes[0] != 30000 {
		t.Fatalf("read back %+v", got)
	}
	got.finish()
	if r := got.Rows[1].RatioP50; r == nil || *r != 4.5/360 {
		t.Errorf("kube-proxy W1 ratio %v, want 4.5 s over the row's 6m0s cap", r)
	}
	tab := got.table(got.Rows)
	// p50 and p99 show the cap (and W2's status names it once more).
	if strings.Count(tab, "> 3m0s") != 3 || strings.Count(tab, "> 6m0s") != 2 {
		t.Errorf("table does not show the rows' caps:\n%s", tab)
	}
	if len(got.Targets) == 0 || got.Targets[0].Target != "W1 cold start ≤ 5 s" || got.Targets[0].Status != "met" {
		t.Errorf("targets %+v", got.Targets)
	}
	if _, ok := unfinishedAfter(Row{Status: "not finished: a change took > soon"}); ok {
		t.Error("a cap that is no duration parsed")
	}
}

// TestRatioSameMode: a kube-proxy row's ratio is over dsproxy in the same mode
// when both dsproxy modes were measured, else over dsproxy's nftables mode.
func TestRatioSameMode(t *testing.T) {
	rep := newReport([]int{1000}, 0)
	row := func(proxy, mode string, p50 float64) Row {
		return Row{Proxy: proxy, Mode: mode, Workload: "W2 endpoint change", Services: 1000, Samples: 50, P50: p50, P99: p50, Status: "ok"}
	}
	rep.Rows = []Row{
		row("dsproxy", "nftables", 0.005), row("dsproxy", "iptables", 0.05),
		row("kube-proxy", "nftables", 0.2), row("kube-proxy", "iptables", 0.1), row("kube-proxy", "iptables-legacy", 0.1),
	}
	rep.finish()
	want := map[string]float64{"nftables": 0.025, "iptables": 0.5, "iptables-legacy": 0.05}
	for _, r := range rep.Rows[2:] {
		if r.RatioP50 == nil || math.Abs(*r.RatioP50-want[r.Mode]) > 1e-9 {
			t.Errorf("kube-proxy/%s ratio %v, want %v", r.Mode, fmtRatio(r.RatioP50, false), want[r.Mode])
		}
	}
}
