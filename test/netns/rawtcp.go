//go:build netns

package netns

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// TCP header flags for SendTCPSegment.
const (
	TCPFin = 0x01
	TCPSyn = 0x02
	TCPRst = 0x04
	TCPAck = 0x10
)

// SendTCPSegment sends one bare TCP segment (no payload) with the given flags from
// from's address of dst's family to dst, through a raw socket: for packets no TCP
// stack would send, such as a SYN+FIN that conntrack marks invalid. The checksum
// is correct.
func SendTCPSegment(from *NS, dst netip.AddrPort, srcPort uint16, flags uint8) error {
	src := from.IPv4
	af := unix.AF_INET
	if dst.Addr().Is6() {
		src, af = from.IPv6, unix.AF_INET6
	}
	seg := make([]byte, 20)
	binary.BigEndian.PutUint16(seg[0:], srcPort)
	binary.BigEndian.PutUint16(seg[2:], dst.Port())
	binary.BigEndian.PutUint32(seg[4:], 0x01020304) // sequence number
	seg[12] = 5 << 4                                // data offset: 5 words
	seg[13] = flags
	binary.BigEndian.PutUint16(seg[14:], 65535) // window
	binary.BigEndian.PutUint16(seg[16:], tcpChecksum(src, dst.Addr(), seg))
	return RunIn(from, func() error {
		fd, err := unix.Socket(af, unix.SOCK_RAW, unix.IPPROTO_TCP)
		if err != nil {
			return fmt.Errorf("raw socket: %w", err)
		}
		defer unix.Close(fd)
		var sa unix.Sockaddr
		if af == unix.AF_INET {
			sa = &unix.SockaddrInet4{Addr: dst.Addr().As4()}
		} else {
			sa = &unix.SockaddrInet6{Addr: dst.Addr().As16()}
		}
		if err := unix.Sendto(fd, seg, 0, sa); err != nil {
			return fmt.Errorf("sending a TCP segment to %s: %w", dst, err)
		}
		return nil
	})
}

// tcpChecksum is the Internet checksum of seg (checksum field zero) with the
// IPv4 or IPv6 pseudo-header.
func tcpChecksum(src, dst netip.Addr, seg []byte) uint16 {
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	add(src.AsSlice())
	add(dst.AsSlice())
	sum += unix.IPPROTO_TCP + uint32(len(seg))
	add(seg)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
