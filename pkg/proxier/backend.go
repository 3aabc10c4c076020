// Package proxier is the family-generic proxier: it owns one family's trackers and
// desired state, decides what each sync must reprogram, and hands that to a Backend
// (nftables, iptables or IPVS) that talks to the kernel. pkg/proxier/ipv4 and
// pkg/proxier/ipv6 construct it for their family.
package proxier

import (
	"context"
	"net/netip"
	"slices"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nodeport"
)

// Backend programs one family's kernel state.
type Backend interface {
	// Sync makes the kernel match req for the service ports in req.Changed, for the
	// node-level settings when req.NodeChanged, and for everything when req.Full.
	// A full sync must also repair state someone else changed or deleted. Sync is
	// called from one goroutine at a time. On error the caller retries with a full
	// sync, so a backend may leave a partial sync half-applied only if a later full
	// sync repairs it.
	Sync(ctx context.Context, req *SyncRequest) (SyncResult, error)
	// Cleanup removes everything the backend ever created for its family.
	Cleanup(ctx context.Context) error
}

// FlushDetector is the optional part of a Backend that can tell cheaply whether
// someone else flushed its kernel state since its last full sync (kube-proxy's
// iptables canary chains: a firewall reload empties every table). The proxier
// asks it when a sync finds nothing to do, so the periodic check sync repairs a
// flush within one check period, and turns such a sync into a full one.
type FlushDetector interface {
	Flushed(ctx context.Context) bool
}

// SyncRequest is what one sync must program.
type SyncRequest struct {
	Full bool
	// State is the whole desired state; only the goroutine running Sync reads it.
	State *model.State
	// Changed lists the service ports whose state changed; a name missing from
	// State.Ports was deleted.
	Changed []model.ServicePortName
	// Node holds the family-wide settings; NodeChanged says they differ from the
	// previous successful sync's.
	Node        *NodeConfig
	NodeChanged bool
}

// SyncResult describes what a sync did, for metrics and tests.
type SyncResult struct {
	// Operations counts the kernel objects and elements added or removed.
	Operations int
	// Transactions counts the kernel transactions committed.
	Transactions int
	// Repairs counts differences between kernel and cache found by a full sync.
	Repairs int
	// RulesWritten and RulesTotal count, per table, the rules the sync wrote and
	// the rules the backend owns after it (the iptables backend; kube-proxy's
	// sync_proxy_rules_iptables_last and _total). Nil for other backends.
	RulesWritten, RulesTotal map[string]int
	// RestoreFailed says the sync's iptables-restore failed, and PartialRestore
	// that the sync was a partial one (kube-proxy's
	// sync_proxy_rules_iptables_restore_failures_total and
	// sync_proxy_rules_iptables_partial_restore_failures_total).
	RestoreFailed, PartialRestore bool
	// NFTablesFailed says the sync's nftables transactions or reads failed
	// (kube-proxy's sync_proxy_rules_nftables_sync_failures_total).
	NFTablesFailed bool
}

// LocalMode is how traffic from local pods is told apart, as kube-proxy's
// --detect-local-mode.
type LocalMode string

// The local-traffic detection modes.
const (
	LocalModeNone                LocalMode = ""
	LocalModeClusterCIDR         LocalMode = "ClusterCIDR"
	LocalModeNodeCIDR            LocalMode = "NodeCIDR"
	LocalModeBridgeInterface     LocalMode = "BridgeInterface"
	LocalModeInterfaceNamePrefix LocalMode = "InterfaceNamePrefix"
)

// LocalDetector says which traffic comes from pods: sources in CIDRs (ClusterCIDR
// and NodeCIDR modes) or packets entering through Interface (an exact bridge name or
// a name prefix).
type LocalDetector struct {
	Mode      LocalMode
	CIDRs     []netip.Prefix
	Interface string
}

// Equal reports whether two detectors tell local traffic the same way.
func (d LocalDetector) Equal(o LocalDetector) bool {
	return d.Mode == o.Mode && d.Interface == o.Interface && slices.Equal(d.CIDRs, o.CIDRs)
}

// NodeConfig holds one family's node-wide settings.
type NodeConfig struct {
	Family *family.Family
	// NodeIP is the node's IP of this family (may be invalid when unknown).
	NodeIP netip.Addr
	// LocalAddrs are the family's addresses on the node's interfaces (those
	// Config.Addrs lists: in IPVS mode not the dummy links'), loopback
	// included, link-local ones aside, sorted; only with Config.LocalAddrs.
	// IPVS mode binds no Service address that is one of them, as kube-proxy's.
	LocalAddrs []netip.Addr
	// NodePortAddresses are where NodePorts are served.
	NodePortAddresses nodeport.Addresses
	// ReservedNodePorts are ports Services of the other family hold: rejected here.
	ReservedNodePorts []nodeport.Key
	// ServiceCIDRs are this family's service ranges; unallocated addresses inside
	// them are dropped.
	ServiceCIDRs  []netip.Prefix
	Local         LocalDetector
	MasqueradeAll bool
}

// Equal reports whether two configs program the same rules.
func (c *NodeConfig) Equal(o *NodeConfig) bool {
	if c == nil || o == nil {
		return c == o
	}
	return c.Family == o.Family && c.NodeIP == o.NodeIP && slices.Equal(c.LocalAddrs, o.LocalAddrs) &&
		c.NodePortAddresses.MatchAll == o.NodePortAddresses.MatchAll &&
		slices.Equal(c.NodePortAddresses.Addrs, o.NodePortAddresses.Addrs) &&
		slices.Equal(c.NodePortAddresses.Loopback, o.NodePortAddresses.Loopback) &&
		slices.Equal(c.ReservedNodePorts, o.ReservedNodePorts) &&
		slices.Equal(c.ServiceCIDRs, o.ServiceCIDRs) &&
		c.Local.Equal(o.Local) && c.MasqueradeAll == o.MasqueradeAll
}
