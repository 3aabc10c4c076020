//go:build netns

package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/nft"

	"github.com/dsproxy/dsproxy/test/netns"
)

// connectTimeout bounds one connect(); a SYN lost to a wrong rule would otherwise
// wait for retransmissions.
const connectTimeout = 3 * time.Second

// connectLatency opens n fresh TCP connections from ns to each target, interleaved
// (target 0, target 1, ..., target 0, ...) so that drift in machine load affects all
// targets alike, after warm connections that are not counted. Each connection has a
// new source port, hence a new conntrack entry that traverses the nat chains. It
// returns the connect() durations per target; any failed connect is an error.
func connectLatency(ns *netns.NS, targets []netip.AddrPort, n, warm int) ([][]time.Duration, error) {
	out := make([][]time.Duration, len(targets))
	err := netns.RunIn(ns, func() error {
		for i := range n + warm {
			for t, dst := range targets {
				d, err := connectOnce(dst)
				if err != nil {
					return fmt.Errorf("connect #%d to %v: %w", i, dst, err)
				}
				if i >= warm {
					out[t] = append(out[t], d)
				}
			}
		}
		return nil
	})
	return out, err
}

// connectOnce times one blocking connect() (SYN out, SYN-ACK back) and closes the
// socket with a reset, so no TIME_WAIT state piles up in the client. A connect
// interrupted by a signal (the Go runtime's preemption) is retried on a new socket.
func connectOnce(dst netip.AddrPort) (time.Duration, error) {
	for range 10 {
		d, err := connectSocket(dst)
		if err != unix.EINTR {
			return d, err
		}
	}
	return 0, unix.EINTR
}

func connectSocket(dst netip.AddrPort) (time.Duration, error) {
	domain := unix.AF_INET6
	var sa unix.Sockaddr = &unix.SockaddrInet6{Port: int(dst.Port()), Addr: dst.Addr().As16()}
	if dst.Addr().Is4() {
		domain = unix.AF_INET
		sa = &unix.SockaddrInet4{Port: int(dst.Port()), Addr: dst.Addr().As4()}
	}
	fd, err := unix.Socket(domain, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0}); err != nil {
		return 0, err
	}
	tv := unix.NsecToTimeval(connectTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
		return 0, err
	}
	start := time.Now()
	err = unix.Connect(fd, sa)
	d := time.Since(start)
	if err == unix.EINPROGRESS {
		err = fmt.Errorf("no answer within %v", connectTimeout)
	}
	return d, err
}

// ctOnlyTable is a table of empty NAT base chains: loading it turns conntrack and
// NAT on in the namespace without any rule, so latency measured with it isolates
// the conntrack cost any NAT-based proxy pays from the cost of dsproxy's rules.
const ctOnlyTable = "bench-conntrack-only"

func setConntrackOnly(ctx context.Context, k nft.Kernel, on bool) error {
	for _, f := range family.All {
		tx := nft.NewTx(f)
		tx.DeleteTable(ctOnlyTable)
		if on {
			tx.AddTable(ctOnlyTable)
			tx.SetChain(ctOnlyTable, &nft.Chain{Name: "pre", Type: nftables.ChainTypeNAT,
				Hook: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
			tx.SetChain(ctOnlyTable, &nft.Chain{Name: "post", Type: nftables.ChainTypeNAT,
				Hook: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
		}
		if err := k.Apply(ctx, tx); err != nil {
			return err
		}
	}
	return nil
}

// widenPortRange gives the client the whole ephemeral range, so that thousands of
// connections to one destination never reuse a source port.
func widenPortRange(ns *netns.NS) error {
	return netns.RunIn(ns, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte("1024 65000"), 0)
	})
}
