//go:build e2e && netns

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsproxy/dsproxy/test/netns"
)

// slowServer serves "<name> <client>\n" on port (both families) in ns, each
// reply delay after its accept, as a pod's server starved for a CPU would.
// Each accept's time goes to the returned channel when nobody is behind on
// it. The server stops when t ends.
func slowServer(t *testing.T, ns *netns.NS, port uint16, delay time.Duration) <-chan time.Time {
	t.Helper()
	var ln net.Listener
	if err := netns.RunIn(ns, func() error {
		var err error
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	acc := make(chan time.Time, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case acc <- time.Now():
			default:
			}
			wg.Go(func() {
				defer c.Close()
				time.Sleep(delay)
				fmt.Fprintf(c, "%s %s\n", ns.Name, c.RemoteAddr())
			})
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return acc
}

// probed is what probeBoth sends: both families' times, or their errors.
type probed struct {
	at  [2]time.Time
	err error
}

// outcomes keeps, per family, the first few errors a probe's connections
// ended with and when, so that a failed check says what the connections saw.
type outcomes struct {
	mu   sync.Mutex
	errs [2][]string
}

// wrap returns done for family fi, recording the errors it is given.
func (o *outcomes) wrap(fi int, done func(string, error) bool) func(string, error) bool {
	return func(srv string, err error) bool {
		if err != nil {
			o.mu.Lock()
			if len(o.errs[fi]) < 5 {
				o.errs[fi] = append(o.errs[fi], fmt.Sprintf("%s: %v", time.Now().Format("15:04:05.000000"), err))
			}
			o.mu.Unlock()
		}
		return done(srv, err)
	}
}

// String lists the recorded errors per family.
func (o *outcomes) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var b strings.Builder
	for fi, es := range o.errs {
		fmt.Fprintf(&b, "%s: first errors %q\n", fams[fi].Name, es)
	}
	return b.String()
}

// probeBoth starts poll.first from client to dst[fi] for both families at
// once, for up to 10 s; the channel gets their times. With o, the errors of
// the connections go to o.
func probeBoth(client *netns.NS, dst [2]netip.AddrPort, p poll, o *outcomes) <-chan probed {
	ch := make(chan probed, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var r probed
		var errs [2]error
		var wg sync.WaitGroup
		for fi := range dst {
			wg.Go(func() {
				q := p
				q.dst = dst[fi]
				if o != nil {
					q.done = o.wrap(fi, q.done)
				}
				r.at[fi], errs[fi] = q.first(ctx, client)
			})
		}
		wg.Wait()
		r.err = errors.Join(errs[:]...)
		ch <- r
	}()
	return ch
}

// TestPollFirst checks W2 and W3's probe: the time it returns for a change is
// that of the first connection started after the change, whether the
// connections before it waited for a slow server (the change: the node starts
// rejecting new connections) or for a dropped SYN to time out (the change: the node stops dropping).
// A probe that connects one at a time returns either change up to a whole
// reply delay or timeout late.
func TestPollFirst(t *testing.T) {
	const slack, late = 10 * time.Millisecond, 40 * time.Millisecond
	check := func(t *testing.T, what string, at [2]time.Time, t0, t1 time.Time) bool {
		t.Helper()
		ok := true
		for fi, a := range at {
			t.Logf("%s, %s: seen %v after the change started (it took %v)", what, fams[fi].Name, a.Sub(t0).Round(10*time.Microsecond), t1.Sub(t0).Round(10*time.Microsecond))
			if a.Before(t0.Add(-slack)) || a.After(t1.Add(late)) {
				t.Errorf("%s, %s: seen at %v from the change's start, want within [-%v, %v + %v]", what, fams[fi].Name, a.Sub(t0), slack, t1.Sub(t0), late)
				ok = false
			}
		}
		return ok
	}
	c := netns.New(t)
	client, pod := c.AddPod("client"), c.AddPod("p0")
	nft := func(t *testing.T, rules string) {
		t.Helper()
		if out, err := netns.ExecStdin(c.Node, strings.NewReader(rules), "nft", "-f", "-"); err != nil {
			t.Fatalf("nft: %v\n%s", err, out)
		}
	}
	dst := func(port uint16) [2]netip.AddrPort {
		return [2]netip.AddrPort{netip.AddrPortFrom(pod.IPv4, port), netip.AddrPortFrom(pod.IPv6, port)}
	}
	pod.Serve(netns.TCP, podPort+11)
	pod.Serve(netns.TCP, podPort+12)
	// Both families answer before any probe starts, so that a probe's first
	// connections do not meet what is left of the new links' setup. In the
	// failed CI run of a4078c2, IPv6's first two connections of "stops
	// answering" failed 0.32 s before the change, as if it had come then; the
	// run did not say with what error (a failed check now logs them), and it
	// did not happen again in 15 runs here, so the cause is a guess: a
	// neighbour solicitation lost on the fresh link, 1 s to the next.
	for fi, d := range dst(podPort + 11) {
		var err error
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if _, err = netns.Dial(client, netns.TCP, d, 2*time.Second); err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("%s: the pod does not answer before the probes: %v", fams[fi].Name, err)
		}
	}
	fds0 := openFDs(t)

	t.Run("stops answering, slow server", func(t *testing.T) {
		const port, delay = podPort + 10, 150 * time.Millisecond
		accepted := slowServer(t, pod, port, delay)
		// A reply later than timeout counts as a failure: timeout leaves the
		// slow server room under load.
		var o outcomes
		ch := probeBoth(client, dst(port), poll{timeout: time.Second, interval: time.Millisecond, done: fails, confirm: 2}, &o)
		// The change comes 20 ms after an accept, while that connection
		// waits for its reply: one connection at a time would see it only
		// after delay.
		time.Sleep(2 * delay)
		for len(accepted) > 0 {
			<-accepted
		}
		select {
		case <-accepted:
		case <-time.After(5 * time.Second):
			t.Fatal("no connection accepted in 5 s")
		}
		time.Sleep(20 * time.Millisecond)
		// Reject new connections in the node, as a deleted Service's rules
		// are gone there, and keep those established (not closing the
		// listener: that would reset connections still in its queue, which
		// started before the change).
		t0 := time.Now()
		nft(t, fmt.Sprintf("table inet first-test {\n\tchain reject-new {\n\t\ttype filter hook forward priority 0;\n\t\tct state new tcp dport %d reject with tcp reset\n\t}\n}\n", port))
		t1 := time.Now()
		r := <-ch
		nft(t, "delete table inet first-test\n")
		if r.err != nil {
			t.Fatal(r.err)
		}
		if !check(t, "node rejects", r.at, t0, t1) {
			t.Logf("the change at %s; the probe's connections got:\n%v", t0.Format("15:04:05.000000"), &o)
		}
	})

	t.Run("starts answering, dropped SYNs", func(t *testing.T) {
		const port = podPort + 11
		nft(t, fmt.Sprintf("table inet first-test {\n\tchain drop-syn {\n\t\ttype filter hook forward priority 0;\n\t\ttcp dport %d drop\n\t}\n}\n", port))
		ch := probeBoth(client, dst(port), poll{timeout: 100 * time.Millisecond, interval: time.Millisecond, done: answers}, nil)
		time.Sleep(170 * time.Millisecond)
		t0 := time.Now()
		nft(t, "delete table inet first-test\n")
		t1 := time.Now()
		r := <-ch
		if r.err != nil {
			t.Fatal(r.err)
		}
		check(t, "drop removed", r.at, t0, t1)
	})

	t.Run("no change", func(t *testing.T) {
		const port = podPort + 12
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := poll{dst: dst(port)[1], timeout: 100 * time.Millisecond, interval: time.Millisecond, done: fails, confirm: 2}.first(ctx, client)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), dst(port)[1].String()) {
			t.Fatalf("err = %v, want the deadline, naming %v", err, dst(port)[1])
		}
	})

	// Every probe socket is closed once its connection finished: at most a
	// timeout after first returned.
	fds := openFDs(t)
	for deadline := time.Now().Add(5 * time.Second); fds > fds0 && time.Now().Before(deadline); fds = openFDs(t) {
		time.Sleep(10 * time.Millisecond)
	}
	if fds > fds0 {
		t.Errorf("%d file descriptors open 5 s after the probes, %d before", fds, fds0)
	}
}

// TestRuns checks poll.first's bookkeeping: connections finish in any order,
// and the earliest run of confirm that saw the change counts only once every
// connection before it finished.
func TestRuns(t *testing.T) {
	type step struct {
		id  int
		saw bool
	}
	for _, c := range []struct {
		name     string
		confirm  int
		started  int
		steps    []step
		want     int  // the run's first connection, -1: none yet
		complete bool // a run has finished
	}{
		{"one, in order", 1, 3, []step{{0, false}, {1, true}}, 1, true},
		{"one, a later one first: waits for the earlier", 1, 3, []step{{2, true}}, -1, true},
		{"one, the earlier one saw it too", 1, 3, []step{{2, true}, {0, false}, {1, true}}, 1, true},
		{"one, the earlier one did not", 1, 3, []step{{2, true}, {1, false}, {0, false}}, 2, true},
		{"two, a lone one is no run", 2, 4, []step{{0, true}, {1, false}, {2, true}}, -1, false},
		{"two in a row", 2, 4, []step{{0, true}, {1, false}, {2, true}, {3, true}}, 2, true},
		{"two, out of order", 2, 4, []step{{3, true}, {2, true}, {1, false}, {0, false}}, 2, true},
		{"two, an earlier run completes later", 2, 5, []step{{3, true}, {4, true}, {0, true}, {1, true}}, 0, true},
		{"two, the last started waits for the next", 2, 3, []step{{0, false}, {1, false}, {2, true}}, -1, false},
		{"none saw it", 2, 3, []step{{0, false}, {1, false}, {2, false}}, -1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runs{confirm: c.confirm}
			for range c.started {
				r.start()
			}
			got := -1
			for _, s := range c.steps {
				if got >= 0 {
					t.Fatalf("finish after the run was found at %d", got)
				}
				if id, ok := r.finish(s.id, s.saw); ok {
					got = id
				}
			}
			if got != c.want || r.complete != c.complete {
				t.Errorf("run from %d, complete %v; want %d, %v", got, r.complete, c.want, c.complete)
			}
		})
	}
}
