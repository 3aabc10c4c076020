//go:build netns

package netns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Proto is a transport protocol for servers and Dial.
type Proto string

// The protocols the harness speaks.
const (
	TCP  Proto = "tcp"
	UDP  Proto = "udp"
	SCTP Proto = "sctp"
)

// Protos lists all protocols.
var Protos = []Proto{TCP, UDP, SCTP}

// ErrSCTPUnsupported is returned (wrapped) when the kernel has no SCTP sockets
// (socket() fails with EPROTONOSUPPORT, e.g. no sctp module).
var ErrSCTPUnsupported = errors.New("kernel does not support SCTP sockets (EPROTONOSUPPORT)")

// SCTPSupported reports whether SCTP sockets can be opened in ns.
func SCTPSupported(ns *NS) error {
	return RunIn(ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		if err != nil {
			if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ESOCKTNOSUPPORT) {
				return fmt.Errorf("%w: %v", ErrSCTPUnsupported, err)
			}
			return err
		}
		return unix.Close(fd)
	})
}

// RequireSCTP skips the test with a clear message when the kernel lacks SCTP.
func (c *Cluster) RequireSCTP() {
	c.tb.Helper()
	if err := SCTPSupported(c.Node); err != nil {
		SkipSCTP(c.tb, err)
	}
}

// SkipSCTP skips tb because the kernel lacks SCTP (err says why), or fails it
// when DSPROXY_REQUIRE_SCTP is set (make test-ipvs: the guest kernel has SCTP,
// and its SCTP scenarios must not pass by skipping).
func SkipSCTP(tb testing.TB, err error) {
	tb.Helper()
	if os.Getenv("DSPROXY_REQUIRE_SCTP") != "" {
		tb.Fatalf("DSPROXY_REQUIRE_SCTP is set and the kernel has no SCTP sockets: %v", err)
	}
	tb.Skipf("skipping SCTP: %v", err)
}

// replyTimeout bounds how long a server spends on one connection.
const replyTimeout = 2 * time.Second

// Serve starts a server for proto on port in the namespace, on both families
// (0.0.0.0 and [::] with IPV6_V6ONLY). For every TCP or SCTP connection and every UDP
// datagram it answers "<name> <client addr:port>\n" with the client address the
// server observes, then (TCP, SCTP) closes the connection. UDP replies are sent from
// the address the datagram was sent to. The server runs until Close. Errors are fatal
// to the test; SCTP on a kernel without SCTP skips the test.
func (n *NS) Serve(proto Proto, port uint16) {
	n.c.tb.Helper()
	if err := n.serve(proto, port); err != nil {
		if errors.Is(err, ErrSCTPUnsupported) {
			n.c.tb.Skipf("skipping: %v", err)
		}
		n.c.tb.Fatalf("netns: %s: serve %s/%d: %v", n.Name, proto, port, err)
	}
}

func (n *NS) serve(proto Proto, port uint16) error {
	for _, v6 := range []bool{false, true} {
		var (
			closer func() error
			run    func()
		)
		err := RunIn(n, func() error {
			switch proto {
			case TCP, SCTP:
				var ln net.Listener
				var err error
				if proto == TCP {
					network, addr := "tcp4", fmt.Sprintf("0.0.0.0:%d", port)
					if v6 {
						network, addr = "tcp6", fmt.Sprintf("[::]:%d", port)
					}
					ln, err = net.Listen(network, addr)
				} else {
					ln, err = listenSCTP(v6, port)
				}
				if err != nil {
					return err
				}
				closer = ln.Close
				run = func() { n.acceptLoop(ln) }
			case UDP:
				network, addr := "udp4", fmt.Sprintf("0.0.0.0:%d", port)
				if v6 {
					network, addr = "udp6", fmt.Sprintf("[::]:%d", port)
				}
				pc, err := net.ListenPacket(network, addr)
				if err != nil {
					return err
				}
				conn := pc.(*net.UDPConn)
				if err := setPktInfo(conn, v6); err != nil {
					conn.Close()
					return err
				}
				closer = conn.Close
				run = func() { n.udpLoop(conn, v6) }
			default:
				return fmt.Errorf("unknown protocol %q", proto)
			}
			return nil
		})
		if err != nil {
			return err
		}
		n.srvMu.Lock()
		n.closers = append(n.closers, closer)
		n.srvWG.Add(1)
		n.srvMu.Unlock()
		go func() {
			defer n.srvWG.Done()
			run()
		}()
	}
	return nil
}

func (n *NS) stopServers() error {
	n.srvMu.Lock()
	closers := n.closers
	n.closers = nil
	n.srvMu.Unlock()
	var errs []error
	for _, c := range closers {
		if err := c(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	n.srvWG.Wait()
	return errors.Join(errs...)
}

func (n *NS) acceptLoop(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			// ECONNABORTED and friends: keep serving.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		n.srvWG.Add(1)
		go func() {
			defer n.srvWG.Done()
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(replyTimeout))
			src := addrPortOf(conn.RemoteAddr())
			_, _ = fmt.Fprintf(conn, "%s %s\n", n.Name, src)
		}()
	}
}

func (n *NS) udpLoop(conn *net.UDPConn, v6 bool) {
	buf := make([]byte, 2048)
	oob := make([]byte, 512)
	for {
		_, oobn, _, from, err := conn.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// ICMP errors on the unconnected socket (e.g. ECONNREFUSED from an earlier
			// reply) are not fatal to the server.
			continue
		}
		reply := fmt.Appendf(nil, "%s %s\n", n.Name, unmapAddrPort(from))
		_, _, _ = conn.WriteMsgUDPAddrPort(reply, replyPktInfo(oob[:oobn], v6), from)
	}
}

// setPktInfo asks for the destination address of each datagram, so replies can be
// sent from it (a wildcard socket would otherwise pick the source by route, which
// breaks clients on namespaces with several addresses).
func setPktInfo(conn *net.UDPConn, v6 bool) error {
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		if v6 {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1)
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// replyPktInfo turns a received packet-info control message into one that sets the
// reply's source address (and lets routing choose the interface).
func replyPktInfo(oob []byte, v6 bool) []byte {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	for _, m := range msgs {
		switch {
		case !v6 && m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_PKTINFO && len(m.Data) >= unix.SizeofInet4Pktinfo:
			var info unix.Inet4Pktinfo
			copy(info.Spec_dst[:], m.Data[8:12]) // received ipi_addr: the header destination
			return unix.PktInfo4(&info)
		case v6 && m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_PKTINFO && len(m.Data) >= unix.SizeofInet6Pktinfo:
			var info unix.Inet6Pktinfo
			copy(info.Addr[:], m.Data[:16]) // received ipi6_addr: the header destination
			return unix.PktInfo6(&info)
		}
	}
	return nil
}

// listenSCTP opens a one-to-one style SCTP listener. Linux one-to-one SCTP sockets
// behave like TCP sockets for accept/read/write/close, so the socket is handed to the
// Go runtime poller through net.FileListener (which wraps it as a TCPListener).
func listenSCTP(v6 bool, port uint16) (net.Listener, error) {
	fd, err := sctpSocket(v6)
	if err != nil {
		return nil, err
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		unix.Close(fd)
		return nil, err
	}
	var sa unix.Sockaddr = &unix.SockaddrInet4{Port: int(port)}
	if v6 {
		sa = &unix.SockaddrInet6{Port: int(port)}
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sctp bind: %w", err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sctp listen: %w", err)
	}
	f := os.NewFile(uintptr(fd), "sctp-listener")
	defer f.Close() // FileListener dups the descriptor
	return net.FileListener(f)
}

// sctpSocket opens a non-blocking one-to-one SCTP socket (IPv6 sockets are V6ONLY).
func sctpSocket(v6 bool) (int, error) {
	af := unix.AF_INET
	if v6 {
		af = unix.AF_INET6
	}
	fd, err := unix.Socket(af, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.ESOCKTNOSUPPORT) {
			return -1, fmt.Errorf("%w: %v", ErrSCTPUnsupported, err)
		}
		return -1, fmt.Errorf("sctp socket: %w", err)
	}
	if v6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
			unix.Close(fd)
			return -1, err
		}
	}
	return fd, nil
}

func addrPortOf(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.TCPAddr:
		return unmapAddrPort(a.AddrPort())
	case *net.UDPAddr:
		return unmapAddrPort(a.AddrPort())
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return unmapAddrPort(ap)
}

func unmapAddrPort(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
