//go:build linux

package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/dsproxy/dsproxy/internal/nlsock"
	"github.com/dsproxy/dsproxy/pkg/family"
)

// Netlink is the Cleaner that talks ctnetlink to the kernel.
//
// It does not use vishvananda/netlink's ConntrackFlow parser because that one only
// decodes ports for TCP and UDP (SCTP flows come back with port 0); it reuses the
// library's netlink request plumbing and parses the few attributes it needs itself.
type Netlink struct {
	ns netns.NsHandle
	// Timeout bounds each netlink send and receive.
	Timeout time.Duration
}

var _ Cleaner = (*Netlink)(nil)

// New returns a Cleaner for the network namespace of the calling thread at the time
// of each call (for the proxy: the host namespace).
func New() *Netlink { return &Netlink{ns: netns.None(), Timeout: 30 * time.Second} }

// NewAt returns a Cleaner whose netlink sockets are opened in the namespace ns. The
// caller keeps ns open while the Cleaner is in use.
func NewAt(ns netns.NsHandle) *Netlink { return &Netlink{ns: ns, Timeout: 30 * time.Second} }

// dumpAttempts bounds the retries of a dump the kernel reported as interrupted
// (NLM_F_DUMP_INTR: the table changed during the dump).
const dumpAttempts = 3

// Clear implements Cleaner.
func (c *Netlink) Clear(fam *family.Family, filters ...Filter) (int, error) {
	if len(filters) == 0 {
		return 0, nil
	}
	if err := validateAll(fam, filters); err != nil {
		return 0, err
	}
	sockets, closeFn, err := c.socket()
	if err != nil {
		return 0, err
	}
	defer closeFn()

	var (
		victims          [][]byte
		skipped, dumpErr error
	)
	for range dumpAttempts {
		victims = victims[:0]
		skipped, dumpErr = dump(sockets, fam, func(fl Flow, raw []byte) {
			if matchAny(filters, fl) {
				victims = append(victims, append([]byte(nil), raw...))
			}
		})
		if !errors.Is(dumpErr, nl.ErrDumpInterrupted) {
			break
		}
	}
	if dumpErr != nil && !errors.Is(dumpErr, nl.ErrDumpInterrupted) {
		return 0, fmt.Errorf("conntrack: dump %s table: %w", fam, dumpErr)
	}

	deleted := 0
	errs := []error{skipped}
	if dumpErr != nil {
		// Best effort: delete what the partial dump found, and say it was partial.
		errs = append(errs, fmt.Errorf("conntrack: dump %s table: %w", fam, dumpErr))
	}
	failed := 0
	var firstErr error
	for _, raw := range victims {
		req := newRequest(nl.IPCTNL_MSG_CT_DELETE, unix.NLM_F_ACK, fam)
		req.Sockets = sockets
		// raw starts with the nfgenmsg header, which newRequest already added. The
		// rest carries the original tuple, the zone and the entry ID, so the kernel
		// deletes exactly the dumped entry and not a newer one with the same tuple.
		req.AddRawData(raw[4:])
		_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
		switch {
		case err == nil:
			deleted++
		case errors.Is(err, unix.ENOENT):
			// Already gone (expired, or deleted by someone else).
		default:
			failed++
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	if failed > 0 {
		errs = append(errs, fmt.Errorf("conntrack: failed to delete %d of %d %s entries: %w", failed, len(victims), fam, firstErr))
	}
	return deleted, errors.Join(errs...)
}

// List implements Cleaner.
func (c *Netlink) List(fam *family.Family) ([]Flow, error) {
	if fam == nil {
		return nil, fmt.Errorf("conntrack: nil family")
	}
	sockets, closeFn, err := c.socket()
	if err != nil {
		return nil, err
	}
	defer closeFn()
	var (
		flows   []Flow
		skipped error
	)
	for range dumpAttempts {
		flows = flows[:0]
		skipped, err = dump(sockets, fam, func(fl Flow, _ []byte) { flows = append(flows, fl) })
		if !errors.Is(err, nl.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		err = fmt.Errorf("conntrack: dump %s table: %w", fam, err)
	}
	return flows, errors.Join(err, skipped)
}

// socket opens one NETLINK_NETFILTER socket for a Clear or List: the dump and all
// deletions share it.
func (c *Netlink) socket() (map[int]*nl.SocketHandle, func(), error) {
	sockets, closeFn, err := nlsock.Open(c.ns, unix.NETLINK_NETFILTER, c.Timeout)
	if err != nil {
		return nil, nil, fmt.Errorf("conntrack: %w", err)
	}
	return sockets, closeFn, nil
}

func newRequest(op, flags int, fam *family.Family) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_CTNETLINK<<8|op, flags)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: fam.NFProto, Version: nl.NFNETLINK_V0})
	return req
}

// dump calls fn for every entry of the family's conntrack table; raw is only valid
// during the call. Entries that cannot be parsed are skipped and reported in
// skipped; err is the dump's own (transport) error.
func dump(sockets map[int]*nl.SocketHandle, fam *family.Family, fn func(fl Flow, raw []byte)) (skipped, err error) {
	req := newRequest(nl.IPCTNL_MSG_CT_GET, unix.NLM_F_DUMP, fam)
	req.Sockets = sockets
	n := 0
	var first error
	err = req.ExecuteIter(unix.NETLINK_NETFILTER, 0, func(msg []byte) bool {
		fl, perr := parseFlow(msg)
		if perr != nil {
			n++
			if first == nil {
				first = perr
			}
			return true
		}
		if fl.Family() == fam {
			fn(fl, msg)
		}
		return true
	})
	if n > 0 {
		skipped = fmt.Errorf("conntrack: skipped %d unparseable %s entries: %w", n, fam, first)
	}
	return skipped, err
}

// Attribute numbers of ctnetlink (linux/netfilter/nfnetlink_conntrack.h).
const (
	ctaTupleOrig  = 1
	ctaTupleReply = 2
	ctaMark       = 8
	ctaZone       = 18

	ctaTupleIP    = 1
	ctaTupleProto = 2

	ctaIPv4Src = 1
	ctaIPv4Dst = 2
	ctaIPv6Src = 3
	ctaIPv6Dst = 4

	ctaProtoNum     = 1
	ctaProtoSrcPort = 2
	ctaProtoDstPort = 3

	nlaTypeMask = 0x3fff // strips NLA_F_NESTED and NLA_F_NET_BYTEORDER
)

// parseFlow decodes a ctnetlink message (nfgenmsg header plus attributes).
func parseFlow(msg []byte) (Flow, error) {
	if len(msg) < 4 {
		return Flow{}, fmt.Errorf("conntrack: short message (%d bytes)", len(msg))
	}
	var fl Flow
	var origProto, replyProto Protocol
	err := walkAttrs(msg[4:], func(typ uint16, val []byte) error {
		var err error
		switch typ {
		case ctaTupleOrig:
			origProto, fl.OrigSrc, fl.OrigDst, err = parseTuple(val)
		case ctaTupleReply:
			replyProto, fl.ReplySrc, fl.ReplyDst, err = parseTuple(val)
		case ctaMark:
			if len(val) >= 4 {
				fl.Mark = binary.BigEndian.Uint32(val)
			}
		case ctaZone:
			if len(val) >= 2 {
				fl.Zone = binary.BigEndian.Uint16(val)
			}
		}
		return err
	})
	if err != nil {
		return Flow{}, err
	}
	if !fl.OrigDst.Addr().IsValid() || !fl.ReplySrc.Addr().IsValid() {
		return Flow{}, fmt.Errorf("conntrack: entry without original or reply tuple")
	}
	fl.Protocol = origProto
	if replyProto != origProto {
		return Flow{}, fmt.Errorf("conntrack: entry with protocol %d/%d in its tuples", origProto, replyProto)
	}
	return fl, nil
}

func parseTuple(b []byte) (proto Protocol, src, dst netip.AddrPort, err error) {
	var srcIP, dstIP netip.Addr
	var sport, dport uint16
	err = walkAttrs(b, func(typ uint16, val []byte) error {
		switch typ {
		case ctaTupleIP:
			return walkAttrs(val, func(typ uint16, val []byte) error {
				a, ok := netip.AddrFromSlice(val)
				switch {
				case (typ == ctaIPv4Src || typ == ctaIPv4Dst) && (!ok || !a.Is4()),
					(typ == ctaIPv6Src || typ == ctaIPv6Dst) && (!ok || !a.Is6()):
					return fmt.Errorf("conntrack: bad address attribute %d (%d bytes)", typ, len(val))
				case typ == ctaIPv4Src || typ == ctaIPv6Src:
					srcIP = a
				case typ == ctaIPv4Dst || typ == ctaIPv6Dst:
					dstIP = a
				}
				return nil
			})
		case ctaTupleProto:
			return walkAttrs(val, func(typ uint16, val []byte) error {
				switch typ {
				case ctaProtoNum:
					if len(val) < 1 {
						return fmt.Errorf("conntrack: empty protocol attribute")
					}
					proto = Protocol(val[0])
				case ctaProtoSrcPort, ctaProtoDstPort:
					if len(val) < 2 {
						return fmt.Errorf("conntrack: short port attribute")
					}
					p := binary.BigEndian.Uint16(val)
					if typ == ctaProtoSrcPort {
						sport = p
					} else {
						dport = p
					}
				}
				return nil
			})
		}
		return nil
	})
	return proto, netip.AddrPortFrom(srcIP, sport), netip.AddrPortFrom(dstIP, dport), err
}

// walkAttrs calls fn for each netlink attribute in b.
func walkAttrs(b []byte, fn func(typ uint16, val []byte) error) error {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		typ := binary.NativeEndian.Uint16(b[2:4]) & nlaTypeMask
		if l < 4 || l > len(b) {
			return fmt.Errorf("conntrack: bad attribute length %d (%d bytes left)", l, len(b))
		}
		if err := fn(typ, b[4:l]); err != nil {
			return err
		}
		next := (l + 3) &^ 3
		if next > len(b) {
			next = len(b)
		}
		b = b[next:]
	}
	return nil
}
