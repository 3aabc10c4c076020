//go:build linux

package nfacct

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/dsproxy/dsproxy/internal/nlsock"
)

// nfnetlink_acct's message types and attributes (linux/netfilter/nfnetlink_acct.h).
const (
	subsysAcct = 7 // NFNL_SUBSYS_ACCT

	msgNew = 0 // NFNL_MSG_ACCT_NEW
	msgGet = 1 // NFNL_MSG_ACCT_GET
	msgDel = 3 // NFNL_MSG_ACCT_DEL

	attrName  = 1 // NFACCT_NAME, a NUL-terminated string
	attrPkts  = 2 // NFACCT_PKTS, big-endian u64
	attrBytes = 3 // NFACCT_BYTES, big-endian u64
)

// Netlink talks nfnetlink_acct to the kernel; every call opens its own socket.
type Netlink struct {
	ns netns.NsHandle
	// Timeout bounds each netlink send and receive.
	Timeout time.Duration
}

var _ Interface = (*Netlink)(nil)

// New returns a client for the network namespace of the calling thread at the
// time of each call (for the proxy: the host namespace).
func New() *Netlink { return &Netlink{ns: netns.None(), Timeout: 5 * time.Second} }

// NewAt returns a client whose sockets are opened in the namespace ns. The
// caller keeps ns open while the client is in use.
func NewAt(ns netns.NsHandle) *Netlink { return &Netlink{ns: ns, Timeout: 5 * time.Second} }

// Ensure implements Interface.
func (c *Netlink) Ensure(name string) error {
	_, err := c.Get(name)
	if !errors.Is(err, ErrNotFound) {
		return err
	}
	// Without NLM_F_EXCL or NLM_F_REPLACE, the kernel answers EBUSY for an
	// object that exists (created since the Get): it keeps its counts.
	if _, err := c.execute(msgNew, unix.NLM_F_CREATE|unix.NLM_F_ACK, name); err != nil && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("nfacct: creating %q: %w", name, err)
	}
	return nil
}

// Get implements Interface.
func (c *Netlink) Get(name string) (Counter, error) {
	msgs, err := c.execute(msgGet, unix.NLM_F_ACK, name)
	if errors.Is(err, unix.ENOENT) {
		return Counter{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if err != nil {
		return Counter{}, fmt.Errorf("nfacct: reading %q: %w", name, err)
	}
	if len(msgs) != 1 {
		return Counter{}, fmt.Errorf("nfacct: reading %q: %d answers, want 1", name, len(msgs))
	}
	ctr, err := parse(msgs[0])
	if err != nil {
		return Counter{}, fmt.Errorf("nfacct: reading %q: %w", name, err)
	}
	if ctr.Name != name {
		return Counter{}, fmt.Errorf("nfacct: reading %q: the kernel answered for %q", name, ctr.Name)
	}
	return ctr, nil
}

// Delete removes an object. The kernel refuses (EBUSY) while a rule names it.
func (c *Netlink) Delete(name string) error {
	if _, err := c.execute(msgDel, unix.NLM_F_ACK, name); err != nil {
		return fmt.Errorf("nfacct: deleting %q: %w", name, err)
	}
	return nil
}

func (c *Netlink) execute(msg, flags int, name string) ([][]byte, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	sockets, closeFn, err := nlsock.Open(c.ns, unix.NETLINK_NETFILTER, c.Timeout)
	if err != nil {
		return nil, fmt.Errorf("nfacct: %w", err)
	}
	defer closeFn()
	req := nl.NewNetlinkRequest(subsysAcct<<8|msg, flags)
	req.Sockets = sockets
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_UNSPEC, Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(attrName, nl.ZeroTerminated(name)))
	return req.Execute(unix.NETLINK_NETFILTER, 0)
}

// parse decodes one NFNL_MSG_ACCT_NEW answer: the nfgenmsg header, then the
// attributes.
func parse(msg []byte) (Counter, error) {
	const nfgenmsgLen = 4
	if len(msg) < nfgenmsgLen {
		return Counter{}, fmt.Errorf("short message (%d bytes)", len(msg))
	}
	attrs, err := nl.ParseRouteAttr(msg[nfgenmsgLen:])
	if err != nil {
		return Counter{}, err
	}
	var (
		ctr            Counter
		named, counted bool
	)
	for _, a := range attrs {
		switch a.Attr.Type & nl.NLA_TYPE_MASK {
		case attrName:
			v := a.Value
			for i, b := range v {
				if b == 0 {
					v = v[:i]
					break
				}
			}
			ctr.Name, named = string(v), true
		case attrPkts:
			if len(a.Value) != 8 {
				return Counter{}, fmt.Errorf("packet count of %d bytes", len(a.Value))
			}
			ctr.Packets, counted = binary.BigEndian.Uint64(a.Value), true
		case attrBytes:
			if len(a.Value) != 8 {
				return Counter{}, fmt.Errorf("byte count of %d bytes", len(a.Value))
			}
			ctr.Bytes = binary.BigEndian.Uint64(a.Value)
		}
	}
	if !named || !counted {
		return Counter{}, fmt.Errorf("answer without name or packet count")
	}
	return ctr, nil
}
