//go:build e2e && netns

package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
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

// run connects repeatedly from ns until done, and returns the start time of
// the first connection that saw the change: the rules were in place before it
// and not yet at the previous connection's start.
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
type nsTarget struct {
	ns  *netns.NS
	dst netip.AddrPort
}

// connectTimes measures blocking connect() (SYN → SYN-ACK) to each target from
// its namespace, interleaved (round robin, one connect at a time), warm connects
// first; it returns the measured durations per target. Only the connect is
// timed. Each namespace has a thread of its own that stays in it and makes the
// connects it is handed, so targets in different namespaces (a node with a
// proxy and one without) are measured under the same load at the same time.
func connectTimes(targets []nsTarget, n, warm int) ([][]time.Duration, error) {
	type result struct {
		d   time.Duration
		err error
	}
	type worker struct {
		req  chan netip.AddrPort
		resp chan result
	}
	workers := map[*netns.NS]*worker{}
	var wg sync.WaitGroup
	defer func() {
		for _, w := range workers {
			close(w.req)
		}
		wg.Wait()
	}()
	for _, tg := range targets {
		if workers[tg.ns] != nil {
			continue
		}
		w := &worker{req: make(chan netip.AddrPort), resp: make(chan result)}
		workers[tg.ns] = w
		wg.Add(1)
		go func(ns *netns.NS) {
			defer wg.Done()
			err := netns.RunIn(ns, func() error {
				for dst := range w.req {
					d, err := connectOnce(dst)
					// A signal (Go's preemption) can interrupt the blocking
					// connect: drop that sample and connect again, a bounded
					// number of times.
					for try := 0; errors.Is(err, unix.EINTR) && try < 5; try++ {
						d, err = connectOnce(dst)
					}
					w.resp <- result{d, err}
				}
				return nil
			})
			for range w.req { // RunIn failed before serving: answer with its error
				w.resp <- result{err: err}
			}
		}(tg.ns)
	}
	out := make([][]time.Duration, len(targets))
	for round := range warm + n {
		for ti, tg := range targets {
			w := workers[tg.ns]
			w.req <- tg.dst
			r := <-w.resp
			if r.err != nil {
				return nil, fmt.Errorf("connect %v from %s: %w", tg.dst, tg.ns.Name, r.err)
			}
			if round >= warm {
				out[ti] = append(out[ti], r.d)
			}
		}
	}
	return out, nil
}

// sockaddr returns dst's address family and socket address.
func sockaddr(dst netip.AddrPort) (int, unix.Sockaddr) {
	if a := dst.Addr().Unmap(); a.Is4() {
		return unix.AF_INET, &unix.SockaddrInet4{Port: int(dst.Port()), Addr: a.As4()}
	}
	return unix.AF_INET6, &unix.SockaddrInet6{Port: int(dst.Port()), Addr: dst.Addr().As16()}
}

func connectOnce(dst netip.AddrPort) (time.Duration, error) {
	af, sa := sockaddr(dst)
	fd, err := unix.Socket(af, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	// SO_SNDTIMEO bounds a blocking connect.
	tv := unix.Timeval{Sec: 2}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
		return 0, err
	}
	if err := unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0}); err != nil {
		return 0, err
	}
	start := time.Now()
	err = unix.Connect(fd, sa)
	d := time.Since(start)
	if errors.Is(err, unix.EINPROGRESS) {
		err = unix.ETIMEDOUT
	}
	return d, err
}

// firstAnswer waits for a target that does not answer yet (a new Service's
// ClusterIP) to start answering. Connecting one at a time would not do: while
// the address has no rules its SYNs are dropped, so each connection waits its
// whole timeout and a change would be seen up to one timeout late. Instead a
// new connection starts every interval, each waiting up to timeout in the
// background, and the start of the earliest one that got an answer is
// returned (resolution: interval). Sockets are made on ns's locked thread, so
// they belong to its network namespace; waiting on them needs no namespace.
func firstAnswer(ctx context.Context, ns *netns.NS, dst netip.AddrPort, interval, timeout time.Duration) (time.Time, error) {
	type result struct {
		id int
		ok bool
	}
	var at time.Time
	err := netns.RunIn(ns, func() error {
		results := make(chan result, 1024)
		var earliest time.Time         // earliest answered start so far
		pending := map[int]time.Time{} // connections still waiting, by id
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for id := 0; ; {
			if earliest.IsZero() {
				start := time.Now()
				fd, err := connectNonblocking(dst)
				if err != nil {
					return fmt.Errorf("connect %v: %w", dst, err)
				}
				pending[id] = start
				go func(id int) {
					results <- result{id, awaitAnswer(fd, start.Add(timeout))}
				}(id)
				id++
			}
			if !earliest.IsZero() && !slices.ContainsFunc(slices.Collect(maps.Values(pending)), func(s time.Time) bool { return s.Before(earliest) }) {
				// Nothing started earlier can still answer.
				at = earliest
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%v: %w", dst, context.Cause(ctx))
			case r := <-results:
				start := pending[r.id]
				delete(pending, r.id)
				if r.ok && (earliest.IsZero() || start.Before(earliest)) {
					earliest = start
				}
			case <-tick.C:
			}
		}
	})
	return at, err
}

// connectNonblocking starts a TCP connection to dst and returns its socket. The
// socket closes with RST.
func connectNonblocking(dst netip.AddrPort) (int, error) {
	af, sa := sockaddr(dst)
	fd, err := unix.Socket(af, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0}); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if err := unix.Connect(fd, sa); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// awaitAnswer waits until deadline for fd's connection to complete and the
// server's line to arrive, then closes fd. It reports whether a line came.
func awaitAnswer(fd int, deadline time.Time) bool {
	defer unix.Close(fd)
	for {
		ms := int(time.Until(deadline).Milliseconds())
		if ms <= 0 {
			return false
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, ms)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			return false
		}
		if pfd[0].Revents&(unix.POLLERR|unix.POLLHUP) != 0 && pfd[0].Revents&unix.POLLIN == 0 {
			return false
		}
		var buf [64]byte
		m, err := unix.Read(fd, buf[:])
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && m > 0 && len(strings.Fields(string(buf[:m]))) > 0
	}
}
