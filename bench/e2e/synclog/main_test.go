package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const testLog = `I1127 09:59:59.000000   20158 loop.go:141] "Sync done" ipFamily="IPv4" full=true duration="1.5s"
I1127 10:00:00.006000   20158 handlers.go:30] "Calling handler.OnServiceDelete" service="load/w3-1"
I1127 10:00:00.009000   20158 loop.go:141] "Sync done" ipFamily="IPv4" full=false duration="2ms"
I1127 10:00:00.009100   20158 loop.go:141] "Sync done" ipFamily="IPv6" full=false duration="2.5ms"
not a klog line
I1127 10:00:01.002000   20158 loop.go:141] "Sync done" ipFamily="IPv6" full=false duration="500µs"
I1127 10:00:05.000000   20158 loop.go:141] "Sync done" ipFamily="IPv6" full=false duration="1ms"
`

const testSamples = `dsproxy/nftables,10000,W3 service delete,IPv4,2026-11-27T09:59:59.990000000Z,2026-11-27T10:00:00.000000000Z,2026-11-27T10:00:00.010000000Z,1700000,1300000
dsproxy/nftables,10000,W2 endpoint change,IPv6,2026-11-27T10:00:00.995000000Z,2026-11-27T10:00:01.000000000Z,2026-11-27T10:00:01.003000000Z
dsproxy/nftables,10000,W2 endpoint change,IPv4,2026-11-27T10:00:02.995000000Z,2026-11-27T10:00:03.000000000Z,2026-11-27T10:00:03.003000000Z
kube-proxy/nftables,10000,W2 endpoint change,IPv6,2026-11-27T10:00:00.995000000Z,2026-11-27T10:00:01.000000000Z,2026-11-27T10:00:01.003000000Z
`

func writeFiles(t *testing.T, samples, log string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	sp, lp := filepath.Join(dir, "samples.csv"), filepath.Join(dir, "dsproxy.log")
	for p, s := range map[string]string{sp: samples, lp: log} {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return sp, lp
}

func TestRun(t *testing.T) {
	sp, lp := writeFiles(t, testSamples, testLog)
	var out bytes.Buffer
	if err := run(&out, sp, lp, 0, 5, time.UTC); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, w := range []string{
		// The delete: its sync 7–9 ms after the event, its handler call at 6 ms;
		// the IPv6 sync that ended at 9.1 ms is another family's.
		"W3 service delete: 1 samples, 1 with a sync in the log, 1 of them with its handler call",
		"event → sync start         p50 7.00 ms",
		"of which → handler call  p50 6.00 ms",
		"10:00:00.000 IPv4 10.00 ms = 7.00 ms + 2.00 ms + 1.00 ms [6.00 ms]",
		// W2: IPv6 synced 1.5–2 ms after its event, no handler call logged; the
		// IPv4 change has no sync of its family in its window. kube-proxy's
		// samples are not dsproxy's.
		"W2 endpoint change: 2 samples, 1 with a sync in the log, 0 of them with its handler call",
		"10:00:01.000 IPv6 3.00 ms = 1.50 ms + 0.50 ms + 1.00 ms\n",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("output lacks %q:\n%s", w, got)
		}
	}
	if strings.Count(got, "of which") != 1 {
		t.Errorf("a handler split for W2, which has no handler call:\n%s", got)
	}
}

func TestRunErrors(t *testing.T) {
	twoSizes := testSamples + "dsproxy/nftables,30000,W2 endpoint change,IPv6,2026-11-27T10:00:00.995000000Z,2026-11-27T10:00:01.000000000Z,2026-11-27T10:00:01.003000000Z\n"
	for _, tc := range []struct {
		name, samples, log string
		services           int
		want               string
	}{
		{"log without syncs", testSamples, "I1127 10:00:00.006000   1 x.go:1] \"Calling handler.OnServiceDelete\"\n", 0, "was dsproxy run with -v=4"},
		{"two sizes", twoSizes, testLog, 0, "choose one with -services"},
		{"no such size", testSamples, testLog, 5000, "no dsproxy sample at 5000 Services"},
		{"bad samples", "a,b\n", testLog, 0, "line 1"},
		{"bad duration", testSamples, `I1127 10:00:00.009000   1 loop.go:141] "Sync done" ipFamily="IPv4" full=false duration="fast"` + "\n", 0, "fast"},
	} {
		sp, lp := writeFiles(t, tc.samples, tc.log)
		var out bytes.Buffer
		err := run(&out, sp, lp, tc.services, 5, time.UTC)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}
