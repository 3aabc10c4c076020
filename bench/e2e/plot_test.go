//go:build e2e && netns

package e2e

import (
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"gonum.org/v1/plot/plotter"
)

func TestPlotLines(t *testing.T) {
	row := func(proxy, mode, workload string, n int, p50 float64, status string) Row {
		return Row{Proxy: proxy, Mode: mode, Workload: workload, Services: n, Samples: 1, P50: p50, Status: status}
	}
	rows := []Row{
		row("no proxy", "-", "W4 connect no-proxy IPv4", 10000, 17e-6, "ok"),
		row("dsproxy", "nftables", "W1 cold start", 30000, 3.9, "ok"),
		row("dsproxy", "nftables", "W1 cold start", 10000, 1.3, "ok"),
		row("dsproxy", "nftables", "W4 connect ClusterIP IPv4", 10000, 27e-6, "ok"),
		row("dsproxy", "nftables", "W4 connect ClusterIP IPv6", 10000, 34e-6, "ok"),
		row("dsproxy", "nftables", "W4 connect direct IPv4", 10000, 24e-6, "ok"),
		row("no proxy", "beside dsproxy/nftables", "W4 connect no-proxy IPv4", 10000, 19e-6, "ok"),
		row("no proxy", "beside dsproxy/nftables", "W4 connect no-proxy spread IPv4", 10000, 22e-6, "ok"),
		row("no proxy", "beside dsproxy/nftables", "W4 connect no-proxy IPv6", 10000, 24e-6, "ok"),
		// A run from before the spread rows, merged: its p0 row is drawn apart.
		row("no proxy", "beside dsproxy/nftables", "W4 connect no-proxy IPv4", 1000, 18e-6, "ok (run of yesterday)"),
		row("no proxy", "beside kube-proxy/nftables", "W4 connect no-proxy IPv4", 10000, 21e-6, "ok"),
		row("kube-proxy", "nftables", "W1 cold start", 10000, 49.5, "ok"),
		{Proxy: "kube-proxy", Mode: "nftables", Workload: "W1 cold start", Services: 30000, Status: "not finished after 6m0s"},
		{Proxy: "kube-proxy", Mode: "nftables", Workload: "W2 endpoint change", Services: 30000, Status: "error: boom"},
		{Proxy: "kube-proxy", Mode: "iptables", Workload: "W1 cold start", Services: 30000, Status: "not finished after soon"},
	}
	lines, sizes := plotLines(rows)
	if !slices.Equal(sizes, []int{1000, 10000, 30000}) {
		t.Errorf("sizes %v, want [1000 10000 30000]", sizes)
	}
	got := map[string]plotLine{}
	for _, l := range lines {
		got[l.proxy+" "+l.workload] = l
	}
	want := map[string]struct{ points, atLeast plotter.XYs }{
		"dsproxy/nftables W1 cold start":             {points: plotter.XYs{{X: 10000, Y: 1.3}, {X: 30000, Y: 3.9}}},
		"dsproxy/nftables W4 connect ClusterIP IPv4": {points: plotter.XYs{{X: 10000, Y: 27e-6}}},
		baselineName + " W4 connect IPv4":            {points: plotter.XYs{{X: 10000, Y: 22e-6}}},
		baselineP0Name + " W4 connect IPv4":          {points: plotter.XYs{{X: 1000, Y: 18e-6}}},
		"kube-proxy/nftables W1 cold start":          {points: plotter.XYs{{X: 10000, Y: 49.5}}, atLeast: plotter.XYs{{X: 30000, Y: 360}}},
	}
	if len(got) != len(want) {
		t.Errorf("%d lines, want %d: %v", len(got), len(want), lines)
	}
	for name, w := range want {
		l, ok := got[name]
		if !ok {
			t.Errorf("no line %q", name)
			continue
		}
		if !slices.Equal(l.points, w.points) || !slices.Equal(l.atLeast, w.atLeast) {
			t.Errorf("%s: points %v, at least %v; want %v, %v", name, l.points, l.atLeast, w.points, w.atLeast)
		}
	}

	// The plot is a PNG of the size asked for.
	path := filepath.Join(t.TempDir(), "results.png")
	if err := (&report{Rows: rows}).plot(path); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Width != 960 || cfg.Height != 672 { // 10 × 7 in at 96 dpi
		t.Errorf("plot is %d×%d, want 960×672", cfg.Width, cfg.Height)
	}
	if err := (&report{Rows: rows[:1]}).plot(path); err == nil {
		t.Error("a plot of only the before-proxy baseline: no error")
	}
}
