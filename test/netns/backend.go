package netns

import (
	"context"

	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// InNS runs a backend's syncs, checks and cleanups on a thread inside a network
// namespace, so that the commands it starts (iptables-restore) and the sysctls it
// writes are that namespace's. Backends that talk netlink to a namespace of their
// own (nftables with nft.WithNetNSFd) need no wrapper.
type InNS struct {
	NS      *NS
	Backend proxier.Backend
}

var _ proxier.FlushDetector = InNS{}

// Sync implements proxier.Backend.
func (n InNS) Sync(ctx context.Context, req *proxier.SyncRequest) (res proxier.SyncResult, err error) {
	err = RunIn(n.NS, func() error {
		var serr error
		res, serr = n.Backend.Sync(ctx, req)
		return serr
	})
	return res, err
}

// Flushed forwards proxier.FlushDetector to a backend that has it.
func (n InNS) Flushed(ctx context.Context) bool {
	d, ok := n.Backend.(proxier.FlushDetector)
	if !ok {
		return false
	}
	flushed := false
	if err := RunIn(n.NS, func() error { flushed = d.Flushed(ctx); return nil }); err != nil {
		return true
	}
	return flushed
}

// Cleanup implements proxier.Backend.
func (n InNS) Cleanup(ctx context.Context) error {
	return RunIn(n.NS, func() error { return n.Backend.Cleanup(ctx) })
}
