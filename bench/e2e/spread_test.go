//go:build e2e && netns

package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dsproxy/dsproxy/bench"
)

func TestLoadCount(t *testing.T) {
	for _, k := range []int{-1, 1, maxSpread + 1} {
		if checkSpread(k) == nil {
			t.Errorf("checkSpread(%d) = nil, want an error", k)
		}
	}
	for _, k := range []int{0, 2, maxSpread} {
		if err := checkSpread(k); err != nil {
			t.Errorf("checkSpread(%d): %v", k, err)
		}
	}
	sizes := map[int]bool{1000: true}
	plain := &load{w: bench.Workload{EndpointsPerFamily: endpoints}, sizes: sizes}
	spread := &load{w: bench.Workload{EndpointsPerFamily: endpoints, CountSpread: 40}, sizes: sizes, spread: 40}
	seen := map[int]bool{}
	for i := range 1000 {
		if got := plain.count(i); got != endpoints {
			t.Fatalf("no spread: count(%d) = %d, want %d", i, got, endpoints)
		}
		got := spread.count(i)
		seen[got] = true
		switch {
		case spread.real(i) && got != 40:
			t.Fatalf("spread 40: real Service %d has %d endpoints, want 40 (the last group)", i, got)
		case !spread.real(i) && got != 1+i%40:
			t.Fatalf("spread 40: count(%d) = %d, want %d", i, got, 1+i%40)
		}
		for fi := range fams {
			if n := len(spread.workloadSlice(i, fi).Endpoints); n != got {
				t.Fatalf("spread 40: Service %d's slice has %d endpoints, want %d", i, n, got)
			}
		}
	}
	if len(seen) != 40 {
		t.Errorf("spread 40: %d distinct counts in 1000 Services, want 40", len(seen))
	}
	if plain.pods() != serverPods || spread.pods() != 40 {
		t.Errorf("pods: %d and %d, want %d and 40", plain.pods(), spread.pods(), serverPods)
	}
	// Real Services' endpoints are the server pods, each once.
	es := spread.workloadSlice(0, 0)
	addrs := map[string]bool{}
	for j, e := range es.Endpoints {
		if want := podAddrs(j)[0].String(); e.Addresses[0] != want {
			t.Fatalf("real Service 0 endpoint %d is %s, want pod p%d (%s)", j, e.Addresses[0], j, want)
		}
		addrs[e.Addresses[0]] = true
	}
	if len(addrs) != 40 {
		t.Errorf("real Service 0 has %d distinct endpoints, want 40", len(addrs))
	}
}

func TestMergeCountSpread(t *testing.T) {
	dir := t.TempDir()
	old := newReport([]int{1000}, 0)
	old.Rows = []Row{{Proxy: "dsproxy", Mode: "nftables", Workload: "W1 cold start", Services: 1000, Samples: 1, P50: 1, Status: "ok"}}
	path := writeReport(t, filepath.Join(dir, "results.json"), old)
	same := newReport([]int{10000}, 0)
	if err := same.merge(path); err != nil || len(same.Rows) != 1 {
		t.Fatalf("merge of the same spread: %v, %d rows, want 1", err, len(same.Rows))
	}
	other := newReport([]int{10000}, 40)
	err := other.merge(path)
	if err == nil || !strings.Contains(err.Error(), "count-spread") {
		t.Fatalf("merge across spreads: %v, want an error naming -count-spread", err)
	}
	if len(other.Rows) != 0 {
		t.Errorf("merge across spreads added %d rows", len(other.Rows))
	}

	// Two runs merged in turn: the second adds only sizes the first did not.
	second := newReport([]int{1000, 3000}, 0)
	second.Rows = []Row{
		{Proxy: "dsproxy", Mode: "nftables", Workload: "W1 cold start", Services: 1000, Samples: 1, P50: 2, Status: "ok"},
		{Proxy: "dsproxy", Mode: "nftables", Workload: "W1 cold start", Services: 3000, Samples: 1, P50: 3, Status: "ok"},
	}
	path2 := writeReport(t, filepath.Join(dir, "second.json"), second)
	both := newReport([]int{10000}, 0)
	if err := both.mergeAll(path + "," + path2); err != nil {
		t.Fatal(err)
	}
	var got []float64
	for _, r := range both.Rows {
		got = append(got, r.P50)
	}
	slices.Sort(got)
	if !slices.Equal(got, []float64{1, 3}) {
		t.Errorf("merged W1 p50s %v, want [1 3] (1k from the first run, 3k from the second)", got)
	}
}

// writeReport stores rep as a results.json at path and returns path.
func writeReport(t *testing.T, path string, rep *report) string {
	t.Helper()
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
