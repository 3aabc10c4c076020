//go:build e2e && netns

package e2e

import (
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Row is one line of the result table.
type Row struct {
	Proxy    string  `json:"proxy"`
	Mode     string  `json:"mode"`
	Workload string  `json:"workload"`
	Services int     `json:"services"`
	Samples  int     `json:"samples"`
	P50      float64 `json:"p50_seconds"`
	P99      float64 `json:"p99_seconds"`
	Max      float64 `json:"max_seconds"`
	// CPU is the proxy's user+system CPU (with waited-for children) during
	// the workload, -1 when not measured; RSSMiB its peak RSS (VmHWM) so far.
	// ProxyP50 and ProxyP99 (W2, W3) are the same changes measured from the
	// moment the benchmark's own watch saw the API server's event: the proxy's
	// share of the latency (watch event → kernel). Absent for other rows.
	ProxyP50 *float64 `json:"proxy_p50_seconds,omitempty"`
	ProxyP99 *float64 `json:"proxy_p99_seconds,omitempty"`
	// APIP50 and APIP99 (W2, W3) are the API server's part of the same changes:
	// from the first API call to the watch event (the same for every proxy but
	// for the machine's load). Absent for other rows.
	APIP50 *float64 `json:"api_p50_seconds,omitempty"`
	APIP99 *float64 `json:"api_p99_seconds,omitempty"`
	// APIRequestMean (W3) is the API server's own mean of the workload's
	// Service requests, from its metrics: POSTs for adds, DELETEs (which
	// release the ClusterIPs after the Service is gone) for deletes.
	// APIAllocMean (W3 add) is its mean ClusterIP allocation (one per family,
	// inside the POST). Absent for other rows and when the metrics could not
	// be read.
	APIRequestMean *float64 `json:"api_request_mean_seconds,omitempty"`
	APIAllocMean   *float64 `json:"api_clusterip_allocation_mean_seconds,omitempty"`
	CPU            float64  `json:"cpu_seconds"`
	RSSMiB         float64  `json:"peak_rss_mib"`
	// EndRSSMiB is the RSS (VmRSS) at the end of the workload: after W1 the
	// programmed proxy's, after W2/W3 its steady state. Absent when not measured.
	EndRSSMiB *float64 `json:"end_rss_mib,omitempty"`
	Status    string   `json:"status"` // "ok", "not finished after …" or "error: …"
	// LoadAvg is /proc/loadavg (1, 5, 15 min) at the end of the workload.
	LoadAvg string `json:"loadavg"`
	// Ratios are dsproxy's figure divided by this row's (kube-proxy rows
	// only); for an unfinished row, dsproxy's figure over the timeout (an
	// upper bound).
	RatioP50 *float64 `json:"ratio_dsproxy_p50,omitempty"`
	RatioP99 *float64 `json:"ratio_dsproxy_p99,omitempty"`
	RatioCPU *float64 `json:"ratio_dsproxy_cpu,omitempty"`
	RatioRSS *float64 `json:"ratio_dsproxy_rss,omitempty"`
}

func (r *Row) setLatencies(d []time.Duration) {
	r.Samples = len(d)
	if len(d) == 0 {
		return
	}
	s := slices.Clone(d)
	slices.Sort(s)
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return s[max(0, min(i, len(s)-1))].Seconds()
	}
	r.P50, r.P99, r.Max = q(0.50), q(0.99), s[len(s)-1].Seconds()
}

// p50p99 returns the p50 and p99 of d, nil when d is empty (for ProxyP50 /
// ProxyP99 and APIP50 / APIP99).
func p50p99(d []time.Duration) (p50, p99 *float64) {
	if len(d) == 0 {
		return nil, nil
	}
	var q Row
	q.setLatencies(d)
	return &q.P50, &q.P99
}

func (r Row) ok() bool { return strings.HasPrefix(r.Status, "ok") && r.Samples > 0 }

type report struct {
	Date    string `json:"date"`
	Machine string `json:"machine"`
	Sizes   []int  `json:"sizes"`
	Flags   string `json:"flags"`
	// CountSpread is -count-spread (0: every Service has 10 endpoints per family).
	CountSpread int   `json:"count_spread,omitempty"`
	Rows        []Row `json:"rows"`
	// Targets are issue 5's targets checked against this run's dsproxy rows
	// (set by finish).
	Targets []Target `json:"targets,omitempty"`

	mu sync.Mutex
}

func newReport(sizes []int, spread int) *report {
	var u unix.Utsname
	_ = unix.Uname(&u)
	model := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	return &report{
		Date:    time.Now().UTC().Format(time.RFC3339),
		Machine: fmt.Sprintf("%d CPUs (%s), kernel %s, %s", runtime.NumCPU(), model, unix.ByteSliceToString(u.Release[:]), runtime.Version()),
		Sizes:   sizes,
		Flags: fmt.Sprintf("changes=%d pairs=%d kube-proxy-changes=%d kube-proxy-pairs=%d connects=%d workload-timeout=%v gap=%v count-spread=%d",
			*flagChanges, *flagPairs, *flagKPChanges, *flagKPPairs, *flagConnects, *flagTimeout, *flagGap, spread),
		CountSpread: spread,
	}
}

func (rep *report) add(rows ...Row) {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	rep.Rows = append(rep.Rows, rows...)
}

// merge adds the rows of an earlier results.json for sizes the report has no
// rows of yet, so the plot can span runs; their status names the source.
func (rep *report) merge(path string) error {
	old, err := readReport(path)
	if err != nil {
		return err
	}
	if old.CountSpread != rep.CountSpread {
		return fmt.Errorf("%s: measured with -count-spread=%d, this run with %d: not comparable", path, old.CountSpread, rep.CountSpread)
	}
	have := map[int]bool{}
	for _, n := range rep.Sizes {
		have[n] = true
	}
	for _, r := range rep.Rows {
		have[r.Services] = true
	}
	var rows []Row
	for _, r := range old.Rows {
		if have[r.Services] {
			continue
		}
		r.RatioP50, r.RatioP99, r.RatioCPU, r.RatioRSS = nil, nil, nil, nil
		if r.Status == "ok" {
			r.Status = "ok (run of " + old.Date + ")"
		}
		rows = append(rows, r)
	}
	rep.Rows = append(rows, rep.Rows...)
	return nil
}

// mergeAll merges each of a comma-separated list of results.json paths in turn
// (none for "").
func (rep *report) mergeAll(paths string) error {
	if paths == "" {
		return nil
	}
	for _, p := range strings.Split(paths, ",") {
		if err := rep.merge(p); err != nil {
			return err
		}
	}
	return nil
}

// readReport reads a results.json.
func readReport(path string) (*report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rep report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &rep, nil
}

// finish computes the dsproxy/kube-proxy ratios and checks the targets.
func (rep *report) finish() {
	defer func() { rep.Targets = rep.targets() }()
	// A kube-proxy row is compared with dsproxy in the same mode when that was
	// measured (iptables with iptables), else with dsproxy's nftables mode.
	ds := map[string]Row{}
	key := func(mode string, r Row) string { return fmt.Sprintf("%s|%s|%d", mode, r.Workload, r.Services) }
	for _, r := range rep.Rows {
		if r.Proxy == "dsproxy" && r.ok() {
			ds[key(r.Mode, r)] = r
		}
	}
	ratio := func(a, b float64) *float64 {
		if a <= 0 || b <= 0 {
			return nil
		}
		v := a / b
		return &v
	}
	for i := range rep.Rows {
		r := &rep.Rows[i]
		d, ok := ds[key(r.Mode, *r)]
		if !ok {
			d, ok = ds[key("nftables", *r)]
		}
		if r.Proxy != "kube-proxy" || !ok {
			continue
		}
		if r.ok() {
			r.RatioP50, r.RatioP99 = ratio(d.P50, r.P50), ratio(d.P99, r.P99)
		} else if limit, ok := unfinishedAfter(*r); ok && r.Workload == "W1 cold start" {
			r.RatioP50 = ratio(d.P50, limit.Seconds())
			r.RatioP99 = r.RatioP50
		}
		r.RatioCPU, r.RatioRSS = ratio(d.CPU, r.CPU), ratio(d.RSSMiB, r.RSSMiB)
	}
}

// fmtEventDur formats an event → kernel latency: 0 means the change was in the
// kernel before the benchmark's own watch delivered the event.
func fmtEventDur(s float64) string {
	if s <= 0 {
		return "≤ 0"
	}
	return fmtDur(s)
}

func fmtDur(s float64) string {
	switch {
	case s <= 0:
		return "-"
	case s < 1e-3:
		return fmt.Sprintf("%.1f µs", s*1e6)
	case s < 1:
		return fmt.Sprintf("%.1f ms", s*1e3)
	default:
		return fmt.Sprintf("%.2f s", s)
	}
}

func fmtRatio(v *float64, unfinished bool) string {
	if v == nil {
		return "-"
	}
	prefix := ""
	if unfinished {
		prefix = "< "
	}
	if *v < 0.1 {
		return fmt.Sprintf("%s%.4f (1/%.0f)", prefix, *v, 1 / *v)
	}
	return fmt.Sprintf("%s%.2f", prefix, *v)
}

// table prints rows as an aligned text table.
func (rep *report) table(rows []Row) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "proxy\tmode\tworkload\tservices\tn\tp50\tp99\tcall→event p50 / p99\tevent→kernel p50 / p99\tCPU\tpeak RSS\tRSS at end\tdsproxy/this p50\tp99\tCPU\tRSS\tstatus")
	for _, r := range rows {
		cpu, rss := "-", "-"
		if r.CPU >= 0 {
			cpu = fmt.Sprintf("%.2f s", r.CPU)
		}
		if r.RSSMiB >= 0 {
			rss = fmt.Sprintf("%.0f MiB", r.RSSMiB)
		}
		endRSS := "-"
		if r.EndRSSMiB != nil {
			endRSS = fmt.Sprintf("%.0f MiB", *r.EndRSSMiB)
		}
		p50, p99 := fmtDur(r.P50), fmtDur(r.P99)
		unfinished := strings.Contains(r.Status, "not finished")
		if unfinished && r.Samples == 0 {
			// W1's cap is -workload-timeout; W2/W3 stop at a change over -change-timeout.
			limit, ok := unfinishedAfter(r)
			if !ok {
				limit = *flagTimeout
				if r.Workload != "W1 cold start" {
					limit = *flagChangeTO
				}
			}
			p50, p99 = "> "+limit.String(), "> "+limit.String()
		}
		proxy, api := "-", "-"
		if r.ProxyP50 != nil && r.ProxyP99 != nil {
			proxy = fmtEventDur(*r.ProxyP50) + " / " + fmtEventDur(*r.ProxyP99)
		}
		if r.APIP50 != nil && r.APIP99 != nil {
			api = fmtDur(*r.APIP50) + " / " + fmtDur(*r.APIP99)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			r.Proxy, r.Mode, r.Workload, r.Services, r.Samples, p50, p99, api, proxy, cpu, rss, endRSS,
			fmtRatio(r.RatioP50, unfinished), fmtRatio(r.RatioP99, unfinished),
			fmtRatio(r.RatioCPU, false), fmtRatio(r.RatioRSS, false), r.Status)
	}
	_ = w.Flush()
	return b.String()
}

// write stores results.json, results.txt and results.png in dir.
func (rep *report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	j, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(j, '\n'), 0o644); err != nil {
		return err
	}
	txt := fmt.Sprintf("%s\n%s\n%s\n\n%s\n%s", rep.Date, rep.Machine, rep.Flags, rep.table(rep.Rows), targetTable(rep.Targets))
	if err := os.WriteFile(filepath.Join(dir, "results.txt"), []byte(txt), 0o644); err != nil {
		return err
	}
	png := filepath.Join(dir, "results.png")
	if err := rep.plot(png); err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	abs, _ := filepath.Abs(dir)
	fmt.Printf("\nwrote %s/results.{json,txt,png}\n", abs)
	return nil
}

// plotLine is one line of the plot: a proxy's (or the no-proxy baseline's)
// p50 for one workload at each size, and the sizes where it did not finish,
// drawn at the cap it did not finish within (a lower bound).
type plotLine struct {
	proxy, workload string
	points          plotter.XYs // sorted by size
	atLeast         plotter.XYs // unfinished: (size, cap)
}

// baselineName and baselineP0Name are the plot's names for W4's no-proxy
// connects beside dsproxy: spread over the pods the ClusterIP balances to (the
// baseline), and to pod p0 only, drawn at sizes whose run had no spread rows
// (results from before 2026-11-27 merged in).
const (
	baselineName   = "no proxy, same pods (beside dsproxy)"
	baselineP0Name = "no proxy, pod p0 (beside dsproxy)"
)

// plotLines picks the rows the plot shows: W1, W2, W3 and W4 ClusterIP IPv4
// per proxy, the no-proxy IPv4 connects measured beside dsproxy (spread over
// the same pods, or to p0 where no spread row exists) as W4's baseline, and W1 rows that did not finish as lower bounds. It returns the
// lines in legend order and the sizes they cover, ascending.
func plotLines(rows []Row) ([]plotLine, []int) {
	type key struct{ proxy, workload string }
	byKey := map[key]*plotLine{}
	var sizes []int
	const besideDS = "beside dsproxy/nftables"
	var spreadAt []int // sizes with a no-proxy spread row beside dsproxy
	for _, r := range rows {
		if r.Proxy == "no proxy" && r.Mode == besideDS && r.Workload == "W4 connect no-proxy spread IPv4" {
			spreadAt = append(spreadAt, r.Services)
		}
	}
	add := func(k key, xy plotter.XY, lower bool) {
		l := byKey[k]
		if l == nil {
			l = &plotLine{proxy: k.proxy, workload: k.workload}
			byKey[k] = l
		}
		if lower {
			l.atLeast = append(l.atLeast, xy)
		} else {
			l.points = append(l.points, xy)
		}
		if !slices.Contains(sizes, int(xy.X)) {
			sizes = append(sizes, int(xy.X))
		}
	}
	for _, r := range rows {
		k := key{r.Proxy + "/" + r.Mode, r.Workload}
		switch {
		case r.Proxy == "no proxy" && r.Mode == besideDS && r.Workload == "W4 connect no-proxy spread IPv4":
			k = key{baselineName, "W4 connect IPv4"}
		case r.Proxy == "no proxy" && r.Mode == besideDS && r.Workload == "W4 connect no-proxy IPv4" && !slices.Contains(spreadAt, r.Services):
			k = key{baselineP0Name, "W4 connect IPv4"}
		case r.Proxy == "no proxy":
			continue
		case !slices.Contains([]string{"W1 cold start", "W2 endpoint change", "W3 service add", "W3 service delete", "W4 connect ClusterIP IPv4"}, r.Workload):
			continue
		}
		x := float64(r.Services)
		if r.ok() && r.P50 > 0 {
			add(k, plotter.XY{X: x, Y: r.P50}, false)
		} else if limit, ok := unfinishedAfter(r); ok && r.Workload == "W1 cold start" {
			add(k, plotter.XY{X: x, Y: limit.Seconds()}, true)
		}
	}
	var out []plotLine
	for _, l := range byKey {
		slices.SortFunc(l.points, func(a, b plotter.XY) int { return int(a.X - b.X) })
		out = append(out, *l)
	}
	slices.SortFunc(out, func(a, b plotLine) int {
		return strings.Compare(a.workload+a.proxy, b.workload+b.proxy)
	})
	slices.Sort(sizes)
	return out, sizes
}

// unfinishedAfter returns the cap of a row that says "not finished after T"
// (W1) or "not finished: a change took > T (…" (W2, W3).
func unfinishedAfter(r Row) (time.Duration, bool) {
	v, ok := strings.CutPrefix(r.Status, "not finished after ")
	if !ok {
		if v, ok = strings.CutPrefix(r.Status, "not finished: a change took > "); ok {
			v, _, _ = strings.Cut(v, " ")
		}
	}
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(v)
	return d, err == nil && d > 0
}

// plot draws p50 latency against the number of Services, both axes
// logarithmic, one line per proxy and workload (W4: ClusterIP IPv4 only, and
// the no-proxy baseline); a W1 that did not finish is an open marker at its
// cap, labelled "> cap".
func (rep *report) plot(path string) error {
	p := plot.New()
	p.Title.Text = "dsproxy vs kube-proxy v1.36: p50 latency (kernel-observed)"
	p.X.Label.Text = "dual-stack Services"
	p.Y.Label.Text = "p50 latency (s)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, false
	p.Legend.TextStyle.Font.Size = vg.Points(8)

	lines, sizes := plotLines(rep.Rows)
	if len(lines) == 0 {
		return fmt.Errorf("no finished rows to plot")
	}
	var ticks []plot.Tick
	for _, n := range sizes {
		ticks = append(ticks, plot.Tick{Value: float64(n), Label: fmt.Sprint(n)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	proxyColor := map[string]color.Color{
		"dsproxy/nftables":           color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
		"dsproxy/iptables":           color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
		"kube-proxy/nftables":        color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
		"kube-proxy/iptables":        color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
		"kube-proxy/iptables-legacy": color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
		baselineName:                 color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
		baselineP0Name:               color.RGBA{R: 0xbf, G: 0xbf, B: 0xbf, A: 0xff},
	}
	workloadShape := map[string]int{"W1 cold start": 0, "W2 endpoint change": 1, "W3 service add": 2, "W3 service delete": 3, "W4 connect ClusterIP IPv4": 4, "W4 connect IPv4": 4}
	for _, ln := range lines {
		c := proxyColor[ln.proxy]
		if c == nil {
			c = color.Black
		}
		name := ln.proxy + " " + ln.workload
		if len(ln.points) > 0 {
			l, s, err := plotter.NewLinePoints(ln.points)
			if err != nil {
				return err
			}
			l.Color, s.Color = c, c
			l.Dashes = plotutil.Dashes(workloadShape[ln.workload])
			s.Shape = plotutil.Shape(workloadShape[ln.workload])
			s.Radius = vg.Points(3.5)
			p.Add(l, s)
			p.Legend.Add(name, l, s)
		}
		if len(ln.atLeast) > 0 {
			s, err := plotter.NewScatter(ln.atLeast)
			if err != nil {
				return err
			}
			s.Color = c
			s.Shape = plotutil.Shape(workloadShape[ln.workload])
			s.Radius = vg.Points(3.5)
			labels := make([]string, len(ln.atLeast))
			for i, xy := range ln.atLeast {
				labels[i] = "> " + time.Duration(xy.Y*float64(time.Second)).String()
			}
			lb, err := plotter.NewLabels(plotter.XYLabels{XYs: ln.atLeast, Labels: labels})
			if err != nil {
				return err
			}
			for i := range lb.TextStyle {
				lb.TextStyle[i].Color = c
				lb.TextStyle[i].Font.Size = vg.Points(8)
			}
			lb.Offset = vg.Point{X: vg.Points(6), Y: vg.Points(-3)}
			p.Add(s, lb)
			if len(ln.points) == 0 {
				p.Legend.Add(name+" (not finished)", s)
			}
		}
	}
	// A single size would give the log axis an empty range.
	p.X.Min, p.X.Max = float64(sizes[0])/2, float64(sizes[len(sizes)-1])*2
	// Three decades above the highest point keep the legend clear of the lines.
	p.Y.Min, p.Y.Max = math.Max(p.Y.Min/3, 1e-6), p.Y.Max*1000
	return p.Save(10*vg.Inch, 7*vg.Inch, path)
}
