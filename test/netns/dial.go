//go:build netns

package netns

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Reply is a server's answer to Dial.
type Reply struct {
	// Server is the name of the namespace whose server answered.
	Server string
	// ObservedSrc is the client address and port as the server saw them (after any
	// SNAT / masquerade on the way).
	ObservedSrc netip.AddrPort
	// Local is the client socket's own address and port.
	Local netip.AddrPort
}

func (r Reply) String() string {
	return fmt.Sprintf("%s saw %s (local %s)", r.Server, r.ObservedSrc, r.Local)
}

// Error kinds of Dial, for errors.Is.
var (
	// ErrRefused: ECONNREFUSED, i.e. a TCP RST, an SCTP ABORT or an ICMP port
	// unreachable (the way UDP and nftables "reject" report a closed port).
	ErrRefused = errors.New("refused")
	// ErrUnreachable: EHOSTUNREACH / ENETUNREACH (ICMP host/net unreachable or
	// administratively prohibited, or no route).
	ErrUnreachable = errors.New("unreachable")
	// ErrTimeout: no answer before the timeout (e.g. dropped packets).
	ErrTimeout = errors.New("timeout")
)

// DialError is the error of a failed Dial. errors.Is matches Kind (one of ErrRefused,
// ErrUnreachable, ErrTimeout, or nil for anything else) and the underlying error.
type DialError struct {
	From  string
	Proto Proto
	Dst   netip.AddrPort
	Kind  error
	Err   error
}

func (e *DialError) Error() string {
	kind := "failed"
	if e.Kind != nil {
		kind = e.Kind.Error()
	}
	return fmt.Sprintf("dial %s %s from %s: %s: %v", e.Proto, e.Dst, e.From, kind, e.Err)
}

// Unwrap returns the kind and the underlying error.
func (e *DialError) Unwrap() []error {
	if e.Kind == nil {
		return []error{e.Err}
	}
	return []error{e.Kind, e.Err}
}

// IsRefused reports whether err is a Dial error of kind ErrRefused.
func IsRefused(err error) bool { return errors.Is(err, ErrRefused) }

// IsUnreachable reports whether err is a Dial error of kind ErrUnreachable.
func IsUnreachable(err error) bool { return errors.Is(err, ErrUnreachable) }

// IsTimeout reports whether err is a Dial error of kind ErrTimeout.
func IsTimeout(err error) bool { return errors.Is(err, ErrTimeout) }

// udpResend is how often Dial resends its UDP datagram while waiting for a reply.
const udpResend = 250 * time.Millisecond

// Dial connects from the namespace to dst with proto, reads the server's reply line
// and parses it. TCP and SCTP open a connection; UDP sends a datagram on a connected
// socket (resent every 250ms) and waits for the answer. On failure the error is a
// *DialError whose kind tells refused from unreachable from timeout.
func Dial(from *NS, proto Proto, dst netip.AddrPort, timeout time.Duration) (Reply, error) {
	var (
		line  string
		local netip.AddrPort
	)
	err := RunIn(from, func() error {
		var err error
		switch proto {
		case TCP:
			line, local, err = dialTCP(dst, timeout)
		case UDP:
			line, local, err = dialUDP(dst, timeout)
		case SCTP:
			line, local, err = dialSCTP(dst, timeout)
		default:
			err = fmt.Errorf("unknown protocol %q", proto)
		}
		return err
	})
	if err != nil {
		return Reply{}, &DialError{From: from.Name, Proto: proto, Dst: dst, Kind: classify(err), Err: err}
	}
	r, err := parseReply(line)
	if err != nil {
		return Reply{}, &DialError{From: from.Name, Proto: proto, Dst: dst, Err: err}
	}
	r.Local = local
	return r, nil
}

func parseReply(line string) (Reply, error) {
	f := strings.Fields(line)
	if len(f) != 2 {
		return Reply{}, fmt.Errorf("malformed reply %q", line)
	}
	ap, err := netip.ParseAddrPort(f[1])
	if err != nil {
		return Reply{}, fmt.Errorf("malformed reply %q: %w", line, err)
	}
	return Reply{Server: f[0], ObservedSrc: ap}, nil
}

func classify(err error) error {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return ErrRefused
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return ErrUnreachable
	case errors.Is(err, ErrTimeout), errors.Is(err, os.ErrDeadlineExceeded),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, syscall.ETIMEDOUT),
		errors.As(err, &ne) && ne.Timeout():
		return ErrTimeout
	}
	return nil
}

func dialTCP(dst netip.AddrPort, timeout time.Duration) (string, netip.AddrPort, error) {
	deadline := time.Now().Add(timeout)
	d := net.Dialer{Deadline: deadline}
	conn, err := d.Dial("tcp", dst.String())
	if err != nil {
		return "", netip.AddrPort{}, err
	}
	defer conn.Close()
	local := addrPortOf(conn.LocalAddr())
	if err := conn.SetDeadline(deadline); err != nil {
		return "", local, err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	return line, local, err
}

func dialUDP(dst netip.AddrPort, timeout time.Duration) (string, netip.AddrPort, error) {
	deadline := time.Now().Add(timeout)
	conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
	if err != nil {
		return "", netip.AddrPort{}, err
	}
	defer conn.Close()
	// Without IP_RECVERR a UDP socket only reports "hard" ICMP errors (port or
	// protocol unreachable, admin prohibited); with it, net/host unreachable too.
	if err := setRecvErr(conn, dst.Addr().Is6()); err != nil {
		return "", netip.AddrPort{}, err
	}
	local := addrPortOf(conn.LocalAddr())
	buf := make([]byte, 2048)
	for {
		if _, err := conn.Write([]byte("hello\n")); err != nil {
			return "", local, err
		}
		wait := time.Now().Add(udpResend)
		if wait.After(deadline) {
			wait = deadline
		}
		if err := conn.SetReadDeadline(wait); err != nil {
			return "", local, err
		}
		n, err := conn.Read(buf)
		if err == nil {
			return string(buf[:n]), local, nil
		}
		if errors.Is(err, os.ErrDeadlineExceeded) && time.Now().Before(deadline) {
			continue
		}
		return "", local, err
	}
}

func dialSCTP(dst netip.AddrPort, timeout time.Duration) (string, netip.AddrPort, error) {
	deadline := time.Now().Add(timeout)
	fd, err := sctpSocket(dst.Addr().Is6())
	if err != nil {
		return "", netip.AddrPort{}, err
	}
	defer unix.Close(fd)
	// As for UDP: without IP_RECVERR an SCTP socket keeps an ICMP port
	// unreachable as a soft error that only the INIT's timeout reports.
	if dst.Addr().Is6() {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVERR, 1)
	} else {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVERR, 1)
	}
	if err != nil {
		return "", netip.AddrPort{}, err
	}
	if err := setSCTPInitialRTO(fd, sctpInitialRTO); err != nil {
		return "", netip.AddrPort{}, err
	}
	err = unix.Connect(fd, sockaddrOf(dst))
	if err != nil && !errors.Is(err, unix.EINPROGRESS) {
		return "", netip.AddrPort{}, err
	}
	if err := pollFD(fd, unix.POLLOUT, deadline); err != nil {
		return "", netip.AddrPort{}, err
	}
	if soerr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil {
		return "", netip.AddrPort{}, err
	} else if soerr != 0 {
		return "", netip.AddrPort{}, syscall.Errno(soerr)
	}
	var local netip.AddrPort
	if sa, err := unix.Getsockname(fd); err == nil {
		local = addrPortFromSockaddr(sa)
	}
	var out []byte
	buf := make([]byte, 2048)
	for {
		if err := pollFD(fd, unix.POLLIN, deadline); err != nil {
			return "", local, err
		}
		n, err := unix.Read(fd, buf)
		switch {
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return "", local, err
		case n == 0:
			return string(out), local, nil
		}
		out = append(out, buf[:n]...)
		if strings.Contains(string(out), "\n") {
			return string(out), local, nil
		}
	}
}

// sctpInitialRTO is the client's initial SCTP retransmission timeout. The kernel's
// default (net.sctp.rto_initial, 3 s) is a dial's whole timeout, so one INIT or
// COOKIE ECHO lost under load (seen in the emulated IPVS guest) failed the dial where
// TCP resends its SYN after 1 s. With 250 ms, a dial of 3 s sends up to four INITs
// (0, 0.25, 0.75, 1.75 s): a probe the rules drop still times out, a served one
// survives one lost chunk, as a TCP dial does.
const sctpInitialRTO = 250 * time.Millisecond

// setSCTPInitialRTO sets the socket's SCTP_RTOINFO initial timeout (struct
// sctp_rtoinfo, assoc id 0: the socket's default for its associations; 0 for max and
// min keeps theirs).
func setSCTPInitialRTO(fd int, rto time.Duration) error {
	const solSCTP, sctpRTOInfo = 132, 0
	var b [16]byte
	binary.NativeEndian.PutUint32(b[4:], uint32(rto.Milliseconds()))
	if err := unix.SetsockoptString(fd, solSCTP, sctpRTOInfo, string(b[:])); err != nil {
		return fmt.Errorf("sctp SCTP_RTOINFO: %w", err)
	}
	return nil
}

// pollFD waits until fd has one of events (or an error/hangup) or the deadline.
func pollFD(fd int, events int16, deadline time.Time) error {
	for {
		ms := int(time.Until(deadline) / time.Millisecond)
		if ms <= 0 {
			return ErrTimeout
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: events}}
		n, err := unix.Poll(fds, ms)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
	}
}

func sockaddrOf(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}
	}
	return &unix.SockaddrInet6{Addr: ap.Addr().As16(), Port: int(ap.Port())}
}

func addrPortFromSockaddr(sa unix.Sockaddr) netip.AddrPort {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(sa.Port))
	}
	return netip.AddrPort{}
}

func setRecvErr(conn *net.UDPConn, v6 bool) error {
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		if v6 {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVERR, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVERR, 1)
		}
	})
	if err != nil {
		return err
	}
	return serr
}
