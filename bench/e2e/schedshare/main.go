// Command schedshare shows which processes held the CPUs while the W2/W3 changes of
// an end-to-end benchmark run (bench/e2e) were in flight. It reads a kernel trace of
// sched_switch events, as trace.sh in this directory records it (ftrace, clock
// "tai"), and the -samples CSV of the same run, and prints, for the chosen workload,
// the share of CPU time each command name had within the samples' windows (from the
// watch event, or the API call, to the kernel showing the change, plus a margin) and
// the slowest samples one by one.
//
//	bench/e2e/schedshare/trace.sh start          # while the workload runs
//	bench/e2e/schedshare/trace.sh stop /tmp/trace.txt
//	go run ./bench/e2e/schedshare -trace /tmp/trace.txt -samples /tmp/samples.csv -workload 'W3 service delete'
//
// The trace's clock is CLOCK_TAI, the samples' the wall clock; their difference is
// read from this machine when the trace is analysed (-tai-offset overrides it).
package main

import (
	"bufio"
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsproxy/dsproxy/bench/e2e/samplecsv"
)

func main() {
	var (
		tracePath   = flag.String("trace", "", "ftrace text output with sched_switch events (trace.sh stop writes it)")
		samplesPath = flag.String("samples", "", "the bench's -samples CSV")
		workload    = flag.String("workload", "W3 service delete", "workload whose samples to look at")
		from        = flag.String("from", "event", "window start: \"event\" (the watch event) or \"start\" (the API call)")
		margin      = flag.Duration("margin", 2*time.Millisecond, "added to the end of each window")
		worst       = flag.Int("worst", 10, "print this many of the slowest samples one by one")
		taiOffset   = flag.Duration("tai-offset", -1, "CLOCK_TAI minus the wall clock (default: as on this machine now)")
	)
	flag.Parse()
	if *tracePath == "" || *samplesPath == "" {
		fmt.Fprintln(os.Stderr, "schedshare: -trace and -samples are required")
		os.Exit(2)
	}
	if *from != "event" && *from != "start" {
		fmt.Fprintf(os.Stderr, "schedshare: -from must be \"event\" or \"start\", not %q\n", *from)
		os.Exit(2)
	}
	off := *taiOffset
	if off < 0 {
		var err error
		if off, err = currentTAIOffset(); err != nil {
			fmt.Fprintln(os.Stderr, "schedshare:", err)
			os.Exit(1)
		}
	}
	if err := run(os.Stdout, *tracePath, *samplesPath, *workload, *from == "event", *margin, *worst, off); err != nil {
		fmt.Fprintln(os.Stderr, "schedshare:", err)
		os.Exit(1)
	}
}

func currentTAIOffset() (time.Duration, error) {
	var tai, wall unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_TAI, &tai); err != nil {
		return 0, fmt.Errorf("reading CLOCK_TAI: %w", err)
	}
	if err := unix.ClockGettime(unix.CLOCK_REALTIME, &wall); err != nil {
		return 0, fmt.Errorf("reading CLOCK_REALTIME: %w", err)
	}
	d := time.Duration(tai.Nano() - wall.Nano())
	return d.Round(time.Second), nil
}

func run(w io.Writer, tracePath, samplesPath, workload string, fromEvent bool, margin time.Duration, worst int, taiOffset time.Duration) error {
	tf, err := os.Open(tracePath)
	if err != nil {
		return err
	}
	defer tf.Close()
	tr, err := parseTrace(tf, taiOffset)
	if err != nil {
		return fmt.Errorf("%s: %w", tracePath, err)
	}
	all, err := samplecsv.ReadFile(samplesPath)
	if err != nil {
		return err
	}
	var ss []samplecsv.Sample
	for _, s := range all {
		if s.Workload == workload && !s.Start.Before(tr.first) && !s.Kernel.After(tr.last) {
			ss = append(ss, s)
		}
	}
	if len(ss) == 0 {
		return fmt.Errorf("no %q sample lies within the trace (%s … %s)", workload, tr.first.Format(time.RFC3339Nano), tr.last.Format(time.RFC3339Nano))
	}
	window := func(s samplecsv.Sample) (time.Time, time.Time) {
		a := s.Start
		if fromEvent {
			a = s.Event
		}
		b := s.Kernel
		if b.Before(a) { // the kernel had it before the bench's own watch delivered the event
			a, b = b, a
		}
		return a, b.Add(margin)
	}
	total := share{}
	var span time.Duration
	for _, s := range ss {
		a, b := window(s)
		total.add(tr.occupancy(a, b))
		span += b.Sub(a)
	}
	what := "watch event"
	if !fromEvent {
		what = "API call"
	}
	fmt.Fprintf(w, "%s: %d samples within the trace; windows from the %s to the kernel + %v, %v in all, %d CPUs\n",
		workload, len(ss), what, margin, span.Round(time.Microsecond), len(tr.cpus))
	if tr.lost > 0 {
		fmt.Fprintf(w, "warning: the trace lost events %d times (ftrace buffer full); the CPU time around those gaps is not counted\n", tr.lost)
	}
	fmt.Fprintf(w, "CPU share in the windows: %s\n", total.format(0))
	slices.SortFunc(ss, func(x, y samplecsv.Sample) int { return cmp.Compare(x.Latency(fromEvent), y.Latency(fromEvent)) })
	worst = max(0, min(worst, len(ss)))
	if worst > 0 {
		fmt.Fprintf(w, "slowest %d (%s → kernel; CPU ms per command in the window):\n", worst, what)
	}
	for _, s := range ss[len(ss)-worst:] {
		a, b := window(s)
		fmt.Fprintf(w, "  %s %s %7.2f ms: %s\n", s.Start.Format("15:04:05.000"), s.Family,
			float64(s.Latency(fromEvent))/1e6, tr.occupancy(a, b).format(6))
	}
	return nil
}

// stretch is one stretch of one CPU given to one command ("idle" for the idle task).
type stretch struct {
	from, to time.Time
	comm     string
}

type trace struct {
	cpus        map[int][]stretch // sorted by from
	first, last time.Time
	lost        int // "LOST … EVENTS" markers: stretches are missing around them
}

// parseTrace reads ftrace's text format and keeps the sched_switch events:
//
//	<comm>-<pid> [<cpu>] <flags> <seconds>.<µs>: sched_switch: prev_comm=… prev_pid=… … ==> next_comm=<comm> next_pid=<pid> next_prio=…
//
// A CPU's stretch starts at a switch to a command and ends at the next switch on
// that CPU. Timestamps are CLOCK_TAI; taiOffset turns them into wall-clock time.
func parseTrace(r io.Reader, taiOffset time.Duration) (*trace, error) {
	tr := &trace{cpus: map[int][]stretch{}}
	cur := map[int]stretch{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	events := 0
	for sc.Scan() {
		line := sc.Text()
		// "CPU:<n> [LOST <k> EVENTS]": what ran on that CPU until its next switch is
		// unknown, so its open stretch is dropped rather than stretched over the gap.
		if rest, ok := strings.CutPrefix(line, "CPU:"); ok && strings.Contains(rest, "[LOST ") {
			if cpu, err := strconv.Atoi(strings.Fields(rest)[0]); err == nil {
				delete(cur, cpu)
				tr.lost++
			}
			continue
		}
		i := strings.Index(line, ": sched_switch: ")
		if i < 0 || strings.HasPrefix(line, "#") {
			continue
		}
		cpu, at, err := switchHeader(line[:i])
		if err != nil {
			return nil, err
		}
		at = at.Add(-taiOffset)
		next, err := nextComm(line[i:])
		if err != nil {
			return nil, err
		}
		if c, ok := cur[cpu]; ok {
			c.to = at
			tr.cpus[cpu] = append(tr.cpus[cpu], c)
		} else if _, ok := tr.cpus[cpu]; !ok {
			tr.cpus[cpu] = nil
		}
		cur[cpu] = stretch{from: at, comm: next}
		if events == 0 || at.Before(tr.first) {
			tr.first = at
		}
		if at.After(tr.last) {
			tr.last = at
		}
		events++
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if events == 0 {
		return nil, errors.New("no sched_switch events")
	}
	for cpu := range tr.cpus {
		slices.SortFunc(tr.cpus[cpu], func(a, b stretch) int { return a.from.Compare(b.from) })
	}
	return tr, nil
}

// switchHeader parses "<comm>-<pid> [<cpu>] <flags> <seconds>.<frac>".
func switchHeader(h string) (int, time.Time, error) {
	lb := strings.LastIndex(h, "[")
	rb := strings.LastIndex(h, "]")
	if lb < 0 || rb < lb {
		return 0, time.Time{}, fmt.Errorf("no [cpu] in %q", h)
	}
	cpu, err := strconv.Atoi(h[lb+1 : rb])
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("cpu in %q: %w", h, err)
	}
	f := strings.Fields(h[rb+1:])
	if len(f) == 0 {
		return 0, time.Time{}, fmt.Errorf("no timestamp in %q", h)
	}
	sec, frac, ok := strings.Cut(f[len(f)-1], ".")
	s, err1 := strconv.ParseInt(sec, 10, 64)
	if !ok || err1 != nil || len(frac) == 0 || len(frac) > 9 {
		return 0, time.Time{}, fmt.Errorf("timestamp in %q", h)
	}
	ns, err := strconv.ParseInt(frac+strings.Repeat("0", 9-len(frac)), 10, 64)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("timestamp in %q: %w", h, err)
	}
	return cpu, time.Unix(s, ns), nil
}

// nextComm returns next_comm of a sched_switch event ("idle" for pid 0). Command
// names may hold spaces, so the field ends where " next_pid=" starts.
func nextComm(ev string) (string, error) {
	i := strings.Index(ev, "==> next_comm=")
	if i < 0 {
		return "", fmt.Errorf("no next_comm in %q", ev)
	}
	rest := ev[i+len("==> next_comm="):]
	j := strings.Index(rest, " next_pid=")
	if j < 0 {
		return "", fmt.Errorf("no next_pid in %q", ev)
	}
	pid := strings.Fields(rest[j+len(" next_pid="):])
	if len(pid) > 0 && pid[0] == "0" {
		return "idle", nil
	}
	return rest[:j], nil
}

// share is CPU time per command.
type share map[string]time.Duration

func (s share) add(o share) {
	for k, v := range o {
		s[k] += v
	}
}

// format lists the commands by CPU time: as percentages of the total when top is
// 0, else the top ones in milliseconds.
func (s share) format(top int) string {
	type kv struct {
		k string
		v time.Duration
	}
	var all []kv
	var sum time.Duration
	for k, v := range s {
		all = append(all, kv{k, v})
		sum += v
	}
	slices.SortFunc(all, func(a, b kv) int { return cmp.Or(cmp.Compare(b.v, a.v), cmp.Compare(a.k, b.k)) })
	var parts []string
	for i, e := range all {
		if top > 0 && i == top {
			break
		}
		if top == 0 {
			if pct := 100 * float64(e.v) / float64(sum); pct >= 0.5 {
				parts = append(parts, fmt.Sprintf("%s %.0f%%", e.k, pct))
			}
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.1f", e.k, float64(e.v)/1e6))
	}
	return strings.Join(parts, ", ")
}

// occupancy returns the CPU time each command had in [a, b], over all CPUs.
func (tr *trace) occupancy(a, b time.Time) share {
	out := share{}
	for _, runs := range tr.cpus {
		i, _ := slices.BinarySearchFunc(runs, a, func(r stretch, t time.Time) int { return r.to.Compare(t) })
		for ; i < len(runs) && runs[i].from.Before(b); i++ {
			r := runs[i]
			from, to := r.from, r.to
			if from.Before(a) {
				from = a
			}
			if to.After(b) {
				to = b
			}
			if to.After(from) {
				out[r.comm] += to.Sub(from)
			}
		}
	}
	return out
}
