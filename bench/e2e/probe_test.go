//go:build e2e && netns

package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsproxy/dsproxy/test/netns"
)

// The kernel-observed side: real TCP connections from the client pod
// namespace, through the node (where the proxy's rules are), to servers in pod
// namespaces. Every connection uses a new source port, so it is a new
// conntrack entry and walks the NAT rules; sockets are closed with RST (no
// TIME_WAIT, so polling cannot run out of ports).

// dialOnce connects to dst, reads the server's "<pod> <client>" line and
// returns the pod name.
func dialOnce(dst netip.AddrPort, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	d := net.Dialer{Deadline: deadline}
	c, err := d.Dial("tcp", dst.String())
	if err != nil {
		return "", err
	}
	defer func() {
		_ = c.(*net.TCPConn).SetLinger(0)
		_ = c.Close()
	}()
	if err := c.SetDeadline(deadline); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	f := strings.Fields(line)
	if len(f) == 0 {
		return "", fmt.Errorf("empty reply from %v", dst)
	}
	return f[0], nil
}

// poll describes a wait for a change the client can observe.
type poll struct {
	dst      netip.AddrPort
	timeout  time.Duration // per connection
	interval time.Duration // pause between connections
	// done decides from one connection's outcome whether the change is visible.
	done func(server string, err error) bool
	// confirm: the change counts only after this many consecutive
	// connections saw it (1 when zero); the first one's start is returned.
	confirm int
}

// run connects repeatedly from ns, one connection at a time, until done, and
// returns the start time of the first connection that saw the change: the
// rules were in place before it and not yet at the previous connection's
// start. Its resolution is the connections' length plus interval: enough for
// W1's seconds and for waiting until a probe is ready; W2 and W3 use first.
func (p poll) run(ctx context.Context, ns *netns.NS) (time.Time, error) {
	var at time.Time
	err := netns.RunIn(ns, func() error {
		streak := 0
		for {
			start := time.Now()
			srv, err := dialOnce(p.dst, p.timeout)
			if p.done(srv, err) {
				if streak == 0 {
					at = start
				}
				streak++
				if streak >= max(1, p.confirm) {
					return nil
				}
			} else {
				streak = 0
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%v: %w", p.dst, context.Cause(ctx))
			case <-time.After(p.interval):
			}
		}
	})
	return at, err
}

func answers(server string, err error) bool { return err == nil && server != "" }
func fails(_ string, err error) bool        { return err != nil }
func reaches(pod string) func(string, error) bool {
	return func(server string, err error) bool { return err == nil && server == pod }
}

// nsTarget is a connect target and the network namespace to connect from.
// With spread, round r connects to spread[r%len(spread)] instead of dst, as a
// Service's connects spread over its endpoints; spread's addresses are of
// dst's family (the sockets are made for dst).
type nsTarget struct {
	ns     *netns.NS
	dst    netip.AddrPort
	spread []netip.AddrPort
}

// at is the address round r connects to.
func (tg nsTarget) at(r int) netip.AddrPort {
	if len(tg.spread) == 0 {
		return tg.dst
	}
	return tg.spread[r%len(tg.spread)]
}

// connectTimes measures blocking connect() (SYN → SYN-ACK) to each target from
// its namespace, interleaved (round robin, one connect at a time), warm connects
// first; it returns the measured durations per target. Only the connect is
// timed. A socket belongs to the network namespace it was made in, whatever
// thread uses it later, so the sockets are made ahead (chunk rounds at a time),
// each by a thread that stays in its target's namespace, and one locked thread
// makes every connect in a tight loop, as one client would: targets in
// different namespaces (a node with a proxy and one without) are measured under
// the same load at the same time, and no connect waits for a thread to wake up.
func connectTimes(targets []nsTarget, n, warm int) ([][]time.Duration, error) {
	const chunk = 50
	makers := map[*netns.NS]*sockMaker{}
	defer func() {
		for _, m := range makers {
			m.close()
		}
	}()
	for _, tg := range targets {
		if makers[tg.ns] == nil {
			makers[tg.ns] = newSockMaker(tg.ns)
		}
	}
	out := make([][]time.Duration, len(targets))
	for first := 0; first < warm+n; first += chunk {
		rounds := min(chunk, warm+n-first)
		fds := make([][]int, len(targets)) // per target, one socket per round
		for ti, tg := range targets {
			var err error
			if fds[ti], err = makers[tg.ns].make(tg.dst, rounds); err != nil {
				closeAll(fds)
				return nil, fmt.Errorf("socket for %v in %s: %w", tg.dst, tg.ns.Name, err)
			}
		}
		err := onLockedThread(func() error {
			for r := range rounds {
				for ti, tg := range targets {
					fd := fds[ti][r]
					fds[ti][r] = -1
					dst := tg.at(first + r)
					d, err := connectSocket(fd, dst)
					// A signal (a child exiting, Go's preemption) can interrupt
					// the blocking connect: drop that sample and connect again
					// on a new socket, a bounded number of times.
					for try := 0; errors.Is(err, unix.EINTR) && try < 5; try++ {
						more, merr := makers[tg.ns].make(dst, 1)
						if merr != nil {
							return fmt.Errorf("socket for %v in %s: %w", dst, tg.ns.Name, merr)
						}
						d, err = connectSocket(more[0], dst)
					}
					if err != nil {
						return fmt.Errorf("connect %v from %s: %w", dst, tg.ns.Name, err)
					}
					if first+r >= warm {
						out[ti] = append(out[ti], d)
					}
				}
			}
			return nil
		})
		closeAll(fds)
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// onLockedThread runs fn on a goroutine locked to its OS thread and waits.
func onLockedThread(fn func() error) error {
	done := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		done <- fn()
	}()
	return <-done
}

func closeAll(fds [][]int) {
	for _, l := range fds {
		for _, fd := range l {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}
}

// sockMaker makes sockets in one network namespace, on a thread that stays in it.
type sockMaker struct {
	req chan sockReq
	wg  sync.WaitGroup
}

type sockReq struct {
	dst  netip.AddrPort
	n    int
	resp chan sockResp
}

type sockResp struct {
	fds []int
	err error
}

func newSockMaker(ns *netns.NS) *sockMaker {
	m := &sockMaker{req: make(chan sockReq)}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		err := netns.RunIn(ns, func() error {
			for r := range m.req {
				var resp sockResp
				for range r.n {
					fd, err := newSocket(r.dst, false)
					if err != nil {
						closeAll([][]int{resp.fds})
						resp = sockResp{err: err}
						break
					}
					resp.fds = append(resp.fds, fd)
				}
				r.resp <- resp
			}
			return nil
		})
		for r := range m.req { // RunIn failed before serving: answer with its error
			r.resp <- sockResp{err: err}
		}
	}()
	return m
}

// make returns n new sockets for connects to dst, made in m's namespace.
func (m *sockMaker) make(dst netip.AddrPort, n int) ([]int, error) {
	resp := make(chan sockResp)
	m.req <- sockReq{dst, n, resp}
	r := <-resp
	return r.fds, r.err
}

func (m *sockMaker) close() {
	close(m.req)
	m.wg.Wait()
}

// sockaddr returns dst's address family and socket address.
func sockaddr(dst netip.AddrPort) (int, unix.Sockaddr) {
	if a := dst.Addr().Unmap(); a.Is4() {
		return unix.AF_INET, &unix.SockaddrInet4{Port: int(dst.Port()), Addr: a.As4()}
	}
	return unix.AF_INET6, &unix.SockaddrInet6{Port: int(dst.Port()), Addr: dst.Addr().As16()}
}

// newSocket makes a TCP socket for dst, in the calling thread's network
// namespace, that closes with RST. A blocking one has a 2 s connect timeout.
func newSocket(dst netip.AddrPort, nonblocking bool) (int, error) {
	af, _ := sockaddr(dst)
	typ := unix.SOCK_STREAM | unix.SOCK_CLOEXEC
	if nonblocking {
		typ |= unix.SOCK_NONBLOCK
	}
	fd, err := unix.Socket(af, typ, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0}); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if !nonblocking {
		// SO_SNDTIMEO bounds a blocking connect.
		tv := unix.Timeval{Sec: 2}
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
			unix.Close(fd)
			return -1, err
		}
	}
	return fd, nil
}

// connectSocket times one blocking connect of fd (from newSocket) to dst, then
// closes fd.
func connectSocket(fd int, dst netip.AddrPort) (time.Duration, error) {
	defer unix.Close(fd)
	_, sa := sockaddr(dst)
	start := time.Now()
	err := unix.Connect(fd, sa)
	d := time.Since(start)
	if errors.Is(err, unix.EINPROGRESS) {
		err = unix.ETIMEDOUT
	}
	return d, err
}

// first is run for W2 and W3's single changes, where milliseconds count.
// Connecting one at a time would see a change late whenever the connection
// before it waits: for its SYN to time out (an address without rules drops
// it) or for a pod's server, which runs in this process and starves for a CPU
// with it, to answer. Instead a new connection starts every interval, each
// waiting up to timeout in the background, and first returns the start of the
// earliest connection that saw the change together with the confirm-1
// connections started after it, once every connection started before it has
// finished (resolution: interval). Sockets are made on ns's locked thread, so
// they belong to its network namespace; waiting on them needs no namespace.
func (p poll) first(ctx context.Context, ns *netns.NS) (time.Time, error) {
	type result struct {
		id  int
		saw bool
	}
	var at time.Time
	err := netns.RunIn(ns, func() error {
		results := make(chan result)
		stop := make(chan struct{})
		defer close(stop)
		var starts []time.Time
		rs := runs{confirm: max(1, p.confirm)}
		connect := func() error {
			start := time.Now()
			fd, err := connectNonblocking(p.dst)
			if err != nil {
				return fmt.Errorf("connect %v: %w", p.dst, err)
			}
			id := rs.start()
			starts = append(starts, start)
			go func() {
				srv, err := awaitLine(fd, start.Add(p.timeout))
				select {
				case results <- result{id, p.done(srv, err)}:
				case <-stop:
				}
			}()
			return nil
		}
		if err := connect(); err != nil {
			return err
		}
		tick := time.NewTicker(p.interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return fmt.Errorf("%v: %w", p.dst, context.Cause(ctx))
			case <-tick.C:
				if !rs.complete {
					if err := connect(); err != nil {
						return err
					}
				}
			case r := <-results:
				if id, ok := rs.finish(r.id, r.saw); ok {
					at = starts[id]
					return nil
				}
			}
		}
	})
	return at, err
}

// runs follows a probe's connections in the order they started, as they
// finish in any order, for the earliest run of confirm consecutive
// connections that all saw the change.
type runs struct {
	confirm int
	saw     []int8 // per connection: 0 waiting, 1 saw the change, -1 did not
	// lo: every connection before lo finished, and no run starts there.
	lo int
	// complete: some run has finished, so a connection started from now on
	// cannot start the earliest one.
	complete bool
}

// start adds a connection and returns its id.
func (r *runs) start() int {
	r.saw = append(r.saw, 0)
	return len(r.saw) - 1
}

// finish records connection id's outcome. Once the earliest run is known
// (every connection before it finished) it returns the run's first
// connection and true.
func (r *runs) finish(id int, saw bool) (int, bool) {
	r.saw[id] = -1
	if saw {
		r.saw[id] = 1
		n := 1
		for j := id - 1; j >= 0 && r.saw[j] == 1 && n < r.confirm; j-- {
			n++
		}
		for j := id + 1; j < len(r.saw) && r.saw[j] == 1 && n < r.confirm; j++ {
			n++
		}
		r.complete = r.complete || n >= r.confirm
	}
	for r.lo < len(r.saw) && r.saw[r.lo] != 0 {
		if r.saw[r.lo] < 0 {
			r.lo++
			continue
		}
		end := r.lo
		for end < r.lo+r.confirm && end < len(r.saw) && r.saw[end] == 1 {
			end++
		}
		if end == r.lo+r.confirm {
			return r.lo, true
		}
		if end < len(r.saw) && r.saw[end] < 0 {
			r.lo = end + 1
			continue
		}
		break // the run from lo waits for a connection
	}
	return 0, false
}

// connectNonblocking starts a TCP connection to dst and returns its socket. The
// socket closes with RST.
func connectNonblocking(dst netip.AddrPort) (int, error) {
	_, sa := sockaddr(dst)
	fd, err := newSocket(dst, true)
	if err != nil {
		return -1, err
	}
	if err := unix.Connect(fd, sa); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// errNoAnswer: a connection got no line before its deadline.
var errNoAnswer = errors.New("no answer")

// awaitLine waits until deadline for fd's connection to complete and the
// server's "<pod> <client>" line to arrive, closes fd, and returns the pod name.
// It waits in Go's network poller, not in a blocking poll(2): hundreds of
// probe connections blocked in system calls would hold the Ps their
// goroutines ran on until the runtime's sysmon takes them back (it sleeps up
// to 10 ms between checks), and could stall the rest of the benchmark (its
// API calls and watch) meanwhile.
func awaitLine(fd int, deadline time.Time) (string, error) {
	f := os.NewFile(uintptr(fd), "probe") // non-blocking: pollable
	defer f.Close()
	if err := f.SetReadDeadline(deadline); err != nil {
		return "", err
	}
	var buf [64]byte
	m, err := f.Read(buf[:])
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "", errNoAnswer
	case err != nil:
		return "", err // ECONNREFUSED, EHOSTUNREACH, EOF, ...
	}
	f0 := strings.Fields(string(buf[:m]))
	if len(f0) == 0 {
		return "", fmt.Errorf("no line: %q", buf[:m])
	}
	return f0[0], nil
}
