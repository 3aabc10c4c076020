package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"
)

// Two CPUs: CPU 0 runs kube-apiserver 100.000–100.006, then idle; CPU 1 runs
// dsproxy 100.002–100.003, then e2e.test.
const testTrace = `# tracer: nop
#
    kube-apiserver-1 [000] d..2. 100.000000: sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=kube-apiserver next_pid=11 next_prio=120
          <idle>-0     [001] d..2. 100.001000: sched_switch: prev_comm=swapper/1 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=swapper/1 next_pid=0 next_prio=120
          <idle>-0     [001] d..2. 100.002000: sched_switch: prev_comm=swapper/1 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=dsproxy next_pid=21 next_prio=120
       dsproxy-21      [001] d..2. 100.003000: sched_switch: prev_comm=dsproxy prev_pid=21 prev_prio=120 prev_state=S ==> next_comm=kworker/1:1 H next_pid=30 next_prio=120
   kworker/1:1 H-30    [001] d..2. 100.003500: sched_switch: prev_comm=kworker/1:1 H prev_pid=30 prev_prio=120 prev_state=S ==> next_comm=e2e.test next_pid=31 next_prio=120
    kube-apiserver-11  [000] d..2. 100.006000: sched_switch: prev_comm=kube-apiserver prev_pid=11 prev_prio=120 prev_state=S ==> next_comm=swapper/0 next_pid=0 next_prio=120
       e2e.test-31     [001] d..2. 100.010000: sched_switch: prev_comm=e2e.test prev_pid=31 prev_prio=120 prev_state=S ==> next_comm=swapper/1 next_pid=0 next_prio=120
`

func TestOccupancy(t *testing.T) {
	off := 37 * time.Second
	tr, err := parseTrace(strings.NewReader(testTrace), off)
	if err != nil {
		t.Fatal(err)
	}
	at := func(ms float64) time.Time {
		return time.Unix(100, 0).Add(-off).Add(time.Duration(ms * float64(time.Millisecond)))
	}
	if !tr.first.Equal(at(0)) || !tr.last.Equal(at(10)) {
		t.Errorf("trace spans %v … %v, want %v … %v", tr.first, tr.last, at(0), at(10))
	}
	got := tr.occupancy(at(1.5), at(4))
	want := share{
		"kube-apiserver": 2500 * time.Microsecond,
		"idle":           500 * time.Microsecond,
		"dsproxy":        time.Millisecond,
		"kworker/1:1 H":  500 * time.Microsecond,
		"e2e.test":       500 * time.Microsecond,
	}
	if len(got) != len(want) {
		t.Errorf("occupancy = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("occupancy[%q] = %v, want %v", k, got[k], v)
		}
	}
	// The last stretch of each CPU has no end in the trace and counts nowhere.
	if got := tr.occupancy(at(11), at(20)); len(got) != 0 {
		t.Errorf("occupancy after the trace = %v, want none", got)
	}
}

func TestLostEvents(t *testing.T) {
	// CPU 1 lost events after dsproxy started at 100.002: its stretch ends there
	// unrecorded instead of running until the next switch at 100.003.
	in := strings.Replace(testTrace, "       dsproxy-21      [001] d..2. 100.003000",
		"CPU:1 [LOST 42 EVENTS]\n       dsproxy-21      [001] d..2. 100.003000", 1)
	tr, err := parseTrace(strings.NewReader(in), 0)
	if err != nil {
		t.Fatal(err)
	}
	if tr.lost != 1 {
		t.Errorf("lost = %d, want 1", tr.lost)
	}
	at := func(ms float64) time.Time {
		return time.Unix(100, 0).Add(time.Duration(ms * float64(time.Millisecond)))
	}
	got := tr.occupancy(at(2), at(4))
	if got["dsproxy"] != 0 || got["kworker/1:1 H"] != 500*time.Microsecond || got["e2e.test"] != 500*time.Microsecond {
		t.Errorf("occupancy around the loss = %v, want no dsproxy, kworker 0.5 ms, e2e.test 0.5 ms", got)
	}
}

func TestRun(t *testing.T) {
	dir := t.TempDir()
	tracePath, samplesPath := dir+"/trace.txt", dir+"/samples.csv"
	writeFile(t, tracePath, testTrace)
	// Times are the wall clock: the trace's minus the offset (0 here).
	writeFile(t, samplesPath, strings.Join([]string{
		"dsproxy/nftables,10000,W3 service delete,IPv4,1970-01-01T00:01:40.000000000Z,1970-01-01T00:01:40.002000000Z,1970-01-01T00:01:40.003000000Z",
		"dsproxy/nftables,10000,W3 service delete,IPv6,1970-01-01T00:01:40.000000000Z,1970-01-01T00:01:40.001000000Z,1970-01-01T00:01:40.001500000Z,1700000,1300000",
		"dsproxy/nftables,10000,W3 service add,IPv4,1970-01-01T00:01:40.000000000Z,1970-01-01T00:01:40.001000000Z,1970-01-01T00:01:40.009000000Z",
		"dsproxy/nftables,10000,W3 service delete,IPv4,1970-01-01T00:02:40.000000000Z,1970-01-01T00:02:40.001000000Z,1970-01-01T00:02:40.002000000Z",
	}, "\n")+"\n")
	var out bytes.Buffer
	if err := run(&out, tracePath, samplesPath, "W3 service delete", true, 0, 1, 0); err != nil {
		t.Fatal(err)
	}
	// Windows 2–3 ms (apiserver 1, dsproxy 1) and 1–1.5 ms (apiserver 0.5, idle 0.5); the
	// third delete lies outside the trace.
	for _, w := range []string{
		"W3 service delete: 2 samples within the trace",
		"CPU share in the windows: kube-apiserver 50%, dsproxy 33%, idle 17%",
		"slowest 1 (watch event → kernel; CPU ms per command in the window):",
		"IPv4    1.00 ms: dsproxy 1.0, kube-apiserver 1.0",
	} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, out.String())
		}
	}
	out.Reset()
	if err := run(&out, tracePath, samplesPath, "W3 service delete", false, 0, -1, 0); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "slowest") {
		t.Errorf("-worst=-1 printed samples:\n%s", out.String())
	}
	if err := run(&out, tracePath, samplesPath, "W2 endpoint change", true, 0, 1, 0); err == nil {
		t.Error("no error for a workload without samples")
	}
}

func TestParseErrors(t *testing.T) {
	for _, in := range []string{
		"x-1 [zero] d..2. 100.0: sched_switch: prev_comm=a prev_pid=1 ==> next_comm=b next_pid=2 next_prio=120\n",
		"x-1 [000] d..2. 100: sched_switch: prev_comm=a prev_pid=1 ==> next_comm=b next_pid=2 next_prio=120\n",
		"x-1 [000] d..2. 100.0: sched_switch: prev_comm=a prev_pid=1 next_comm=b\n",
		"# nothing\n",
	} {
		if _, err := parseTrace(strings.NewReader(in), 0); err == nil {
			t.Errorf("parseTrace(%q): no error", in)
		}
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
