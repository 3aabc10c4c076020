//go:build linux

// Package nlsock opens the netlink sockets that dsproxy's hand-built netfilter
// requests (conntrack, nfacct) go through, in a chosen network namespace and
// with a bound on every send and receive.
package nlsock

import (
	"fmt"
	"time"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Open opens a netlink socket of protocol (unix.NETLINK_NETFILTER...) in the
// namespace ns (netns.None(): the calling thread's) and returns it in the form
// nl.NetlinkRequest.Sockets takes, with its close function. A positive timeout
// bounds each send and receive.
func Open(ns netns.NsHandle, protocol int, timeout time.Duration) (map[int]*nl.SocketHandle, func(), error) {
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), protocol)
	if err != nil {
		return nil, nil, fmt.Errorf("netlink socket: %w", err)
	}
	if timeout > 0 {
		tv := unix.NsecToTimeval(timeout.Nanoseconds())
		_ = s.SetSendTimeout(&tv)
		_ = s.SetReceiveTimeout(&tv)
	}
	return map[int]*nl.SocketHandle{protocol: {Socket: s}}, s.Close, nil
}
