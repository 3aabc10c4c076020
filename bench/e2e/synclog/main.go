// Command synclog splits each W2/W3 change of an end-to-end benchmark run
// (bench/e2e) into what dsproxy did with it, from dsproxy's own log at -v=4: the
// benchmark's watch event → the handler call that reached dsproxy ("Calling
// handler.…", the last one before the sync began) → the sync's start → its end
// ("Sync done", whose duration gives the start) → the first connection that saw
// the change. With a log of dsproxy from before stop 20, which has no handler
// calls, only event → sync start is given.
//
//	go test -tags e2e,netns -run TestBenchE2E ./bench/e2e/ -args -proxies=dsproxy -dsproxy-args=-v=4 -samples=/tmp/samples.csv ...
//	go run ./bench/e2e/synclog -samples /tmp/samples.csv -log /tmp/dsproxy-bench-dsproxy-nftables-10000.log -services 10000
//
// klog writes local time without a year: the log is read in this machine's
// time zone, in the year of the samples.
package main

import (
	"bufio"
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/dsproxy/dsproxy/bench/e2e/samplecsv"
)

func main() {
	var (
		samplesPath = flag.String("samples", "", "the bench's -samples CSV")
		logPath     = flag.String("log", "", "dsproxy's log, written at -v=4 (DSPROXY_BENCH_KEEP_LOGS=1 keeps it)")
		services    = flag.Int("services", 0, "the size whose samples to look at (0: the only one)")
		worst       = flag.Int("worst", 8, "print this many of each workload's slowest samples one by one")
	)
	flag.Parse()
	if *samplesPath == "" || *logPath == "" {
		fmt.Fprintln(os.Stderr, "synclog: -samples and -log are required")
		os.Exit(2)
	}
	if err := run(os.Stdout, *samplesPath, *logPath, *services, *worst, time.Local); err != nil {
		fmt.Fprintln(os.Stderr, "synclog:", err)
		os.Exit(1)
	}
}

// syncRun is one "Sync done" line.
type syncRun struct{ start, end time.Time }

// logged is what the log gave: every sync per family, and the time of every
// handler call, in order.
type logged struct {
	syncs    map[string][]syncRun
	handlers []time.Time
}

var (
	// I1127 10:47:49.668794   20158 loop.go:141] "Sync done" ipFamily="IPv4" full=true duration="1.416128461s"
	klogHeader = regexp.MustCompile(`^[IWEF](\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d{6})\s+\d+ [^\]]*\] (.*)$`)
	syncDone   = regexp.MustCompile(`^"Sync done" ipFamily="(IPv[46])" full=\w+ duration="([^"]+)"`)
)

func parseLog(r io.Reader, year int, loc *time.Location) (*logged, error) {
	l := &logged{syncs: map[string][]syncRun{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<24)
	for sc.Scan() {
		m := klogHeader.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		at, err := time.ParseInLocation("2006-01-02 15:04:05.000000", fmt.Sprintf("%d-%s-%s %s", year, m[1], m[2], m[3]), loc)
		if err != nil {
			return nil, err
		}
		msg := m[4]
		if strings.HasPrefix(msg, `"Calling handler.`) {
			l.handlers = append(l.handlers, at)
			continue
		}
		if s := syncDone.FindStringSubmatch(msg); s != nil {
			d, err := time.ParseDuration(s[2])
			if err != nil {
				return nil, fmt.Errorf("%q: %w", sc.Text(), err)
			}
			l.syncs[s[1]] = append(l.syncs[s[1]], syncRun{start: at.Add(-d), end: at})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(l.syncs) == 0 {
		return nil, errors.New("no \"Sync done\" line: was dsproxy run with -v=4?")
	}
	return l, nil
}

// split is one sample taken apart; ok is false when no sync of its family
// overlapped it (the kernel had the change before the benchmark's own watch
// delivered the event, as for most W3 adds, whose slices follow the Service).
// handled is false when the log has no handler call for it (dsproxy before
// 2026-11-27, stop 20, logged none).
type split struct {
	s                                 samplecsv.Sample
	ok, handled                       bool
	toSync, toHandler, sync, toKernel time.Duration
}

// slack lets a sync or handler call that the log puts just before the
// benchmark's watch event still count: the two watches are delivered
// independently, and either can come first.
const slack = 2 * time.Millisecond

func (l *logged) split(s samplecsv.Sample) split {
	sp := split{s: s}
	// The sync that made the change visible: the last to start before the
	// connection that saw it, among those that ended after the event (less the
	// slack). A W3 add's Service has its own sync before its slice's event, and
	// that one ends before it. (A sync that starts after the one that made the
	// change but before the probe's next connection would be taken instead; the
	// probe connects every millisecond.)
	i := -1
	for k, y := range l.syncs[s.Family] {
		if !y.end.Before(s.Event.Add(-slack)) && !y.start.After(s.Kernel) {
			i = k
		}
	}
	if i < 0 {
		return sp
	}
	y := l.syncs[s.Family][i]
	sp.ok = true
	sp.sync, sp.toKernel = y.end.Sub(y.start), s.Kernel.Sub(y.end)
	sp.toSync = y.start.Sub(s.Event)
	// The last handler call before the sync began, if it is recent enough to be
	// this change's.
	j, _ := slices.BinarySearchFunc(l.handlers, y.start, func(a, b time.Time) int { return a.Compare(b) })
	if j > 0 && !l.handlers[j-1].Before(s.Event.Add(-slack)) {
		sp.handled, sp.toHandler = true, l.handlers[j-1].Sub(s.Event)
	}
	return sp
}

func run(w io.Writer, samplesPath, logPath string, services, worst int, loc *time.Location) error {
	all, err := samplecsv.ReadFile(samplesPath)
	if err != nil {
		return err
	}
	var ss []samplecsv.Sample
	sizes := map[int]bool{}
	for _, s := range all {
		if strings.HasPrefix(s.Proxy, "dsproxy") {
			sizes[s.Services] = true
			if services == 0 || s.Services == services {
				ss = append(ss, s)
			}
		}
	}
	switch {
	case len(ss) == 0:
		return fmt.Errorf("%s: no dsproxy sample at %d Services", samplesPath, services)
	case services == 0 && len(sizes) > 1:
		return fmt.Errorf("%s: dsproxy samples at %d sizes; choose one with -services", samplesPath, len(sizes))
	}
	lf, err := os.Open(logPath)
	if err != nil {
		return err
	}
	defer lf.Close()
	l, err := parseLog(lf, ss[0].Event.In(loc).Year(), loc)
	if err != nil {
		return fmt.Errorf("%s: %w", logPath, err)
	}
	var workloads []string
	for _, s := range ss {
		if !slices.Contains(workloads, s.Workload) {
			workloads = append(workloads, s.Workload)
		}
	}
	for _, wl := range workloads {
		var sps []split
		for _, s := range ss {
			if s.Workload == wl {
				sps = append(sps, l.split(s))
			}
		}
		report(w, wl, sps, worst)
	}
	return nil
}

func report(w io.Writer, wl string, sps []split, worst int) {
	var got, handled []split
	for _, sp := range sps {
		if sp.ok {
			got = append(got, sp)
			if sp.handled {
				handled = append(handled, sp)
			}
		}
	}
	fmt.Fprintf(w, "%s: %d samples, %d with a sync in the log, %d of them with its handler call\n", wl, len(sps), len(got), len(handled))
	part := func(name string, sps []split, f func(split) time.Duration) {
		if len(sps) == 0 {
			return
		}
		ds := make([]time.Duration, len(sps))
		for i, sp := range sps {
			ds[i] = f(sp)
		}
		slices.Sort(ds)
		q := func(p float64) string { return ms(ds[min(len(ds)-1, int(p*float64(len(ds))))]) }
		fmt.Fprintf(w, "  %-26s p50 %s  p90 %s  max %s\n", name, q(0.5), q(0.9), ms(ds[len(ds)-1]))
	}
	part("event → sync start", got, func(sp split) time.Duration { return sp.toSync })
	part("  of which → handler call", handled, func(sp split) time.Duration { return sp.toHandler })
	part("sync", got, func(sp split) time.Duration { return sp.sync })
	part("sync end → kernel", got, func(sp split) time.Duration { return sp.toKernel })
	slices.SortStableFunc(got, func(a, b split) int { return cmp.Compare(b.s.Latency(true), a.s.Latency(true)) })
	worst = max(0, min(worst, len(got)))
	if worst > 0 {
		fmt.Fprintf(w, "  slowest %d: event → kernel = event → sync start + sync + sync end → kernel [handler call after the event]\n", worst)
	}
	for _, sp := range got[:worst] {
		h := ""
		if sp.handled {
			h = " [" + ms(sp.toHandler) + "]"
		}
		fmt.Fprintf(w, "    %s %s %s = %s + %s + %s%s\n", sp.s.Event.Format("15:04:05.000"), sp.s.Family,
			ms(sp.s.Latency(true)), ms(sp.toSync), ms(sp.sync), ms(sp.toKernel), h)
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }
