//go:build e2e && netns

package e2e

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// schedStat is what the scheduler accounted to a process's threads
// (/proc/<pid>/task/*/schedstat): time on a CPU, and time runnable but
// waiting for one (run_delay). A proxy that waits for a CPU while the API
// server and etcd hold both cores shows it in the second; children (nft,
// iptables-restore) are not included.
type schedStat struct{ ran, waited time.Duration }

func readSchedStat(pid int) (schedStat, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return schedStat{}, err
	}
	var s schedStat
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "schedstat"))
		if err != nil {
			continue // the thread exited meanwhile
		}
		t, err := parseSchedStat(string(b))
		if err != nil {
			return schedStat{}, fmt.Errorf("thread %s: %w", e.Name(), err)
		}
		s.ran += t.ran
		s.waited += t.waited
	}
	return s, nil
}

// parseSchedStat reads one schedstat line: ns on a CPU, ns waiting on a run
// queue, time slices.
func parseSchedStat(line string) (schedStat, error) {
	f := strings.Fields(line)
	if len(f) < 2 {
		return schedStat{}, fmt.Errorf("malformed schedstat %q", line)
	}
	var v [2]int64
	for i := range v {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil || n < 0 {
			return schedStat{}, fmt.Errorf("malformed schedstat %q", line)
		}
		v[i] = n
	}
	return schedStat{ran: time.Duration(v[0]), waited: time.Duration(v[1])}, nil
}

// sub is s − o, each part at least 0 (threads that exited take their counts
// with them).
func (s schedStat) sub(o schedStat) schedStat {
	return schedStat{ran: max(s.ran-o.ran, 0), waited: max(s.waited-o.waited, 0)}
}

// procSched reads p's schedStat; a read error (the process exited) gives
// ok false, and the change is reported without it.
func (p *proc) procSched() (s schedStat, ok bool) {
	s, err := readSchedStat(p.pid())
	return s, err == nil
}

// controlPlaneSched reads the schedStat of the control-plane processes on
// every change's path, etcd and kube-apiserver, summed; ok is false if either
// cannot be read (not running, or restarted meanwhile).
func (l *load) controlPlaneSched() (s schedStat, ok bool) {
	pids, err := l.cp.PIDs("etcd", "kube-apiserver")
	if err != nil {
		return schedStat{}, false
	}
	for _, pid := range pids {
		x, err := readSchedStat(pid)
		if err != nil {
			return schedStat{}, false
		}
		s.ran += x.ran
		s.waited += x.waited
	}
	return s, true
}

// schedSnap is what the scheduler had accounted to the proxy and to the
// control plane (etcd and kube-apiserver) at one moment.
type schedSnap struct {
	proxy, cp     schedStat
	proxyOK, cpOK bool
}

func takeSched(p *proc, ld *load) schedSnap {
	var s schedSnap
	s.proxy, s.proxyOK = p.procSched()
	s.cp, s.cpOK = ld.controlPlaneSched()
	return s
}

// slowChange is one W2/W3 change's proxy part (event → kernel; for W3 the
// slower family's) and API server part (call → event; for W3 the slower
// family's), what the scheduler accounted to the proxy from the API call
// until the kernel showed the change (for W3 in both families), and what it
// accounted to etcd and kube-apiserver from the API call until the watch
// event of the API server part.
type slowChange struct {
	proxy, api time.Duration
	sched, cp  schedStat
	ok, cpOK   bool
}

// setAPI sets the API server part to ev, which arrived after the call at t0,
// with the control plane's accounting from s0 (read at t0) to ev.
func (c *slowChange) setAPI(t0 time.Time, s0 schedSnap, ev event) {
	c.api = ev.at.Sub(t0)
	c.cp, c.cpOK = ev.cp.sub(s0.cp), s0.cpOK && ev.cpOK
}

// slowest returns the k changes with the longest proxy parts, longest first,
// formatted for the log: "19.1 ms (ran 2.0 ms, waited 15.2 ms for a CPU)",
// what the proxy ran and waited.
func slowest(cs []slowChange, k int) string {
	return slowestBy(cs, k, func(c slowChange) (time.Duration, schedStat, bool) { return c.proxy, c.sched, c.ok })
}

// slowestAPI returns the k changes with the longest API server parts (call →
// event), longest first, with what etcd and kube-apiserver ran and waited for
// a CPU from the call to the event. A wait is for a CPU held by any other
// thread: of the node side (proxy, pods, probe, benchmark), which on a cluster
// runs on other machines, or of the control plane itself.
func slowestAPI(cs []slowChange, k int) string {
	return slowestBy(cs, k, func(c slowChange) (time.Duration, schedStat, bool) { return c.api, c.cp, c.cpOK })
}

// slowestBy formats the k changes of cs with the longest part, longest first;
// part returns a change's part and, if ok, the scheduler's accounting for it.
func slowestBy(cs []slowChange, k int, part func(slowChange) (d time.Duration, s schedStat, ok bool)) string {
	s := slices.Clone(cs)
	slices.SortStableFunc(s, func(a, b slowChange) int {
		da, _, _ := part(a)
		db, _, _ := part(b)
		return cmp.Compare(db, da)
	})
	var out []string
	for _, c := range s[:min(k, len(s))] {
		d, st, ok := part(c)
		x := fmtMs(d)
		if ok {
			x += fmt.Sprintf(" (ran %s, waited %s for a CPU)", fmtMs(st.ran), fmtMs(st.waited))
		}
		out = append(out, x)
	}
	return strings.Join(out, ", ")
}

func fmtMs(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }

func TestParseSchedStat(t *testing.T) {
	got, err := parseSchedStat("149185104 12709094 443\n")
	if err != nil || got != (schedStat{ran: 149185104, waited: 12709094}) {
		t.Errorf("parseSchedStat = %+v, %v", got, err)
	}
	for _, bad := range []string{"", "12", "a 1 2", "1 -2 3"} {
		if _, err := parseSchedStat(bad); err == nil {
			t.Errorf("parseSchedStat(%q): no error", bad)
		}
	}
	self, err := readSchedStat(os.Getpid())
	if err != nil || self.ran <= 0 {
		t.Errorf("readSchedStat(self) = %+v, %v; want some CPU time", self, err)
	}
	cs := []slowChange{{proxy: time.Millisecond}, {proxy: 19 * time.Millisecond, ok: true, sched: schedStat{ran: 2 * time.Millisecond, waited: 15 * time.Millisecond}}, {proxy: 3 * time.Millisecond}}
	if got, want := slowest(cs, 2), "19.0 ms (ran 2.0 ms, waited 15.0 ms for a CPU), 3.0 ms"; got != want {
		t.Errorf("slowest = %q, want %q", got, want)
	}
	cs = []slowChange{{api: 4 * time.Millisecond, cpOK: true, cp: schedStat{ran: time.Millisecond}},
		{api: 12 * time.Millisecond, cpOK: true, cp: schedStat{ran: 3 * time.Millisecond, waited: 8 * time.Millisecond}},
		{api: 2 * time.Millisecond, proxy: time.Second}}
	if got, want := slowestAPI(cs, 2), "12.0 ms (ran 3.0 ms, waited 8.0 ms for a CPU), 4.0 ms (ran 1.0 ms, waited 0.0 ms for a CPU)"; got != want {
		t.Errorf("slowestAPI = %q, want %q", got, want)
	}
	t0 := time.Now()
	s0 := schedSnap{cp: schedStat{ran: 100, waited: 50}, cpOK: true}
	var c slowChange
	c.setAPI(t0, s0, event{at: t0.Add(3 * time.Millisecond), cp: schedStat{ran: 130, waited: 90}, cpOK: true})
	if c.api != 3*time.Millisecond || !c.cpOK || c.cp != (schedStat{ran: 30, waited: 40}) {
		t.Errorf("setAPI: %+v, want api 3 ms, the control plane's ran 30 ns, waited 40 ns", c)
	}
	c.setAPI(t0, s0, event{at: t0.Add(time.Millisecond)}) // an event that arrived disarmed
	if c.api != time.Millisecond || c.cpOK {
		t.Errorf("setAPI with an event without accounting: %+v, want api 1 ms, cpOK false", c)
	}
}
