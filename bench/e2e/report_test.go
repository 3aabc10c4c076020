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
	CPU    float64  `json:"cpu_seconds"`
	RSSMiB float64  `json:"peak_rss_mib"`
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
	Rows    []Row  `json:"rows"`

	mu sync.Mutex
}

func newReport(sizes []int) *report {
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
		Flags: fmt.Sprintf("changes=%d pairs=%d kube-proxy-changes=%d kube-proxy-pairs=%d connects=%d workload-timeout=%v gap=%v",
			*flagChanges, *flagPairs, *flagKPChanges, *flagKPPairs, *flagConnects, *flagTimeout, *flagGap),
	}
}

func (rep *report) add(rows ...Row) {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	rep.Rows = append(rep.Rows, rows...)
}

// merge adds the rows of an earlier results.json for sizes this run did not
// measure, so the plot can span runs; their status names the source.
func (rep *report) merge(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var old report
	if err := json.Unmarshal(b, &old); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	var rows []Row
	for _, r := range old.Rows {
		if slices.Contains(rep.Sizes, r.Services) {
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

// finish computes the dsproxy/kube-proxy ratios.
func (rep *report) finish() {
	ds := map[string]Row{}
	key := func(r Row) string { return fmt.Sprintf("%s|%d", r.Workload, r.Services) }
	for _, r := range rep.Rows {
		if r.Proxy == "dsproxy" && r.ok() {
			ds[key(r)] = r
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
		d, ok := ds[key(*r)]
		if r.Proxy != "kube-proxy" || !ok {
			continue
		}
		if r.ok() {
			r.RatioP50, r.RatioP99 = ratio(d.P50, r.P50), ratio(d.P99, r.P99)
		} else if strings.HasPrefix(r.Status, "not finished") && r.Workload == "W1 cold start" {
			r.RatioP50 = ratio(d.P50, flagTimeout.Seconds())
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
			limit := *flagTimeout
			if r.Workload != "W1 cold start" {
				limit = *flagChangeTO
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
	txt := fmt.Sprintf("%s\n%s\n%s\n\n%s", rep.Date, rep.Machine, rep.Flags, rep.table(rep.Rows))
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

// plot draws p50 latency against the number of Services, both axes
// logarithmic, one line per proxy and workload (W4: ClusterIP IPv4 only).
func (rep *report) plot(path string) error {
	p := plot.New()
	p.Title.Text = "dsproxy vs kube-proxy v1.36: p50 latency (kernel-observed)"
	p.X.Label.Text = "dual-stack Services"
	p.Y.Label.Text = "p50 latency (s)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, false
	p.Legend.TextStyle.Font.Size = vg.Points(8)

	type key struct{ proxy, workload string }
	series := map[key]plotter.XYs{}
	var keys []key
	minX, maxX := math.Inf(1), math.Inf(-1)
	for _, r := range rep.Rows {
		if !r.ok() || r.P50 <= 0 {
			continue
		}
		switch r.Workload {
		case "W1 cold start", "W2 endpoint change", "W3 service add", "W3 service delete", "W4 connect ClusterIP IPv4":
		default:
			continue
		}
		k := key{r.Proxy + "/" + r.Mode, r.Workload}
		if _, ok := series[k]; !ok {
			keys = append(keys, k)
		}
		series[k] = append(series[k], plotter.XY{X: float64(r.Services), Y: r.P50})
		minX, maxX = math.Min(minX, float64(r.Services)), math.Max(maxX, float64(r.Services))
	}
	if len(keys) == 0 {
		return fmt.Errorf("no finished rows to plot")
	}
	slices.SortFunc(keys, func(a, b key) int {
		return strings.Compare(a.workload+a.proxy, b.workload+b.proxy)
	})
	proxyColor := map[string]color.Color{
		"dsproxy/nftables":           color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
		"kube-proxy/nftables":        color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
		"kube-proxy/iptables":        color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
		"kube-proxy/iptables-legacy": color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	}
	workloadShape := map[string]int{"W1 cold start": 0, "W2 endpoint change": 1, "W3 service add": 2, "W3 service delete": 3, "W4 connect ClusterIP IPv4": 4}
	for _, k := range keys {
		xys := series[k]
		slices.SortFunc(xys, func(a, b plotter.XY) int { return int(a.X - b.X) })
		l, s, err := plotter.NewLinePoints(xys)
		if err != nil {
			return err
		}
		c := proxyColor[k.proxy]
		if c == nil {
			c = color.Black
		}
		l.Color, s.Color = c, c
		l.Dashes = plotutil.Dashes(workloadShape[k.workload])
		s.Shape = plotutil.Shape(workloadShape[k.workload])
		s.Radius = vg.Points(3.5)
		p.Add(l, s)
		p.Legend.Add(k.proxy+" "+k.workload, l, s)
	}
	// A single size would give the log axis an empty range.
	p.X.Min, p.X.Max = minX/2, maxX*2
	p.Y.Min, p.Y.Max = math.Max(p.Y.Min/3, 1e-6), p.Y.Max*10
	return p.Save(10*vg.Inch, 7*vg.Inch, path)
}
