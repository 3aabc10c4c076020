//go:build e2e && netns

package e2e

import (
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestConnectTimes measures connects from two nodes' client pods, interleaved,
// as W4 does, without a control plane or a proxy.
func TestConnectTimes(t *testing.T) {
	a, b := newBareNode(t, 3), newBareNode(t, 1)
	p0 := podAddrs(0)
	var spread []netip.AddrPort
	for k := range 3 {
		spread = append(spread, netip.AddrPortFrom(podAddrs(k)[1], podPort))
	}
	targets := []nsTarget{
		{ns: a.client, dst: netip.AddrPortFrom(p0[0], podPort)},
		{ns: b.client, dst: netip.AddrPortFrom(p0[0], podPort)},
		{ns: a.client, dst: netip.AddrPortFrom(p0[1], podPort)},
		{ns: b.client, dst: netip.AddrPortFrom(p0[1], podPort)},
		{ns: a.client, dst: spread[0], spread: spread},
	}
	// 120 rounds span three chunks of sockets, the last one short.
	const n, warm = 120, 10
	fds0 := openFDs(t)
	times, err := connectTimes(targets, n, warm)
	if err != nil {
		t.Fatal(err)
	}
	if len(times) != len(targets) {
		t.Fatalf("%d lists of times, want %d", len(times), len(targets))
	}
	for i, ts := range times {
		if len(ts) != n {
			t.Errorf("target %d (%v from %s): %d times, want %d", i, targets[i].dst, targets[i].ns.Name, len(ts), n)
		}
		for _, d := range ts {
			if d <= 0 {
				t.Errorf("target %d: connect took %v", i, d)
				break
			}
		}
	}

	// A refused connect is an error naming the target, not a sample.
	closed := netip.AddrPortFrom(p0[1], podPort+1)
	_, err = connectTimes([]nsTarget{targets[0], {ns: b.client, dst: closed}}, 3, 0)
	if !errors.Is(err, unix.ECONNREFUSED) {
		t.Fatalf("connect to a closed port: err = %v, want ECONNREFUSED", err)
	}
	t.Logf("refused: %v", err)
	// A spread target connects to its addresses in turn: the second round
	// meets the closed port.
	_, err = connectTimes([]nsTarget{{ns: a.client, dst: spread[0], spread: []netip.AddrPort{spread[0], closed}}}, 2, 0)
	if !errors.Is(err, unix.ECONNREFUSED) || !strings.Contains(err.Error(), closed.String()) {
		t.Fatalf("spread over an open and a closed port: err = %v, want ECONNREFUSED from %v", err, closed)
	}
	// The pods' servers run in this process and close the connections they
	// accepted on goroutines of their own, some after the last connect
	// returned (its SYN-ACK comes from the kernel before the accept): wait for
	// them before counting. A leak of connectTimes' sockets never settles.
	fds := openFDs(t)
	for deadline := time.Now().Add(5 * time.Second); fds > fds0 && time.Now().Before(deadline); fds = openFDs(t) {
		time.Sleep(10 * time.Millisecond)
	}
	if fds > fds0 {
		t.Errorf("%d file descriptors open 5 s after the connects, %d before", fds, fds0)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}
