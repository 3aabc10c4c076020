//go:build netns

package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
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
	var local unix.Sockaddr = &unix.SockaddrInet6{Port: srcPorts.next(dst)}
	if dst.Addr().Is4() {
		local = &unix.SockaddrInet4{Port: srcPorts.next(dst)}
	}
	if err := unix.Bind(fd, local); err != nil {
		return 0, fmt.Errorf("bind source port: %w", err)
	}
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

// srcPorts gives every destination its own block of client source ports.
//
// Left to the kernel, connects to a pod directly and connects to a ClusterIP
// DNATed to that pod can get the same source port within seconds of each other.
// From an unmasqueraded client both connections then have the reply tuple
// pod:8080 → client:port. While the NAT hooks are registered the kernel remaps the
// newer connection's source port, but while dsproxy's tables are dormant (only
// conntrack on) the newer SYN fails conntrack confirmation and is dropped, again on
// every retransmission until the older entry expires: a failed connect that has
// nothing to do with the proxy. Disjoint blocks rule that out; within a block,
// ports are reused only for the same destination, whose old entry (closed by a
// reset) conntrack replaces.
var srcPorts = &portBlocks{block: map[netip.AddrPort]int{}, used: map[netip.AddrPort]int{}}

const (
	portBlockBase = 10000 // above every server port in the bench
	portBlockSize = 6000
	numPortBlocks = 8 // up to port 58000
)

type portBlocks struct {
	mu    sync.Mutex
	block map[netip.AddrPort]int // destination → its block
	used  map[netip.AddrPort]int // destination → ports handed out
}

// next returns the next source port of dst's block, cycling through the block.
func (p *portBlocks) next(dst netip.AddrPort) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.block[dst]
	if !ok {
		b = len(p.block) % numPortBlocks
		p.block[dst] = b
	}
	i := p.used[dst] % portBlockSize
	p.used[dst]++
	return portBlockBase + b*portBlockSize + i
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

// setDormant puts every table of both families in ns to sleep (flag dormant: the
// hooks are unregistered, rules and sets kept, conntrack stays on because the rules'
// ct and NAT expressions hold it) or wakes them. The flag is set with the nft CLI
// (benchmark only: nothing in dsproxy sets it); an "add table" without flags, as
// google/nftables sends it, clears it.
func setDormant(ctx context.Context, ns *netns.NS, k nft.Kernel, on bool) error {
	for _, f := range family.All {
		tables, err := k.ListTables(ctx, f)
		if err != nil {
			return err
		}
		for _, t := range tables {
			if on {
				cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns.NetnsName, "nft", "add", "table", f.NFTFamilyName, t, "{ flags dormant; }")
				if out, err := cmd.CombinedOutput(); err != nil {
					return fmt.Errorf("%v: %w: %s", cmd.Args, err, out)
				}
				continue
			}
			tx := nft.NewTx(f)
			tx.AddTable(t)
			if err := k.Apply(ctx, tx); err != nil {
				return err
			}
		}
	}
	return nil
}

// isDormant reports whether table t of family f in ns is dormant, from the nft CLI.
func isDormant(ctx context.Context, ns *netns.NS, f *family.Family, t string) (bool, error) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns.NetnsName, "nft", "-t", "list", "table", f.NFTFamilyName, t).CombinedOutput()
	if err != nil {
		return false, fmt.Errorf("nft list table: %w: %s", err, out)
	}
	return strings.Contains(string(out), "flags dormant"), nil
}

// alternate measures connect() latency in two states of the node, switching between
// them every round so that drift in machine load falls on both alike: rounds ×
// (state a: connects to each of aTargets; state b: connects to each of bTargets),
// each round after a few unmeasured warm-up connects. It returns the durations per
// target of a, then of b.
func alternate(from *netns.NS, rounds, perRound int, setA, setB func() error, aTargets, bTargets []netip.AddrPort) (a, b [][]time.Duration, err error) {
	a, b = make([][]time.Duration, len(aTargets)), make([][]time.Duration, len(bTargets))
	for range rounds {
		for _, st := range []struct {
			set     func() error
			targets []netip.AddrPort
			out     [][]time.Duration
		}{{setA, aTargets, a}, {setB, bTargets, b}} {
			if err := st.set(); err != nil {
				return nil, nil, err
			}
			ds, err := connectLatency(from, st.targets, perRound, 10)
			if err != nil {
				return nil, nil, err
			}
			for i := range ds {
				st.out[i] = append(st.out[i], ds[i]...)
			}
		}
	}
	return a, b, nil
}
