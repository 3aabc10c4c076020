// Package metaproxier fans cluster changes out to the per-family proxiers of a node
// and runs their sync loops.
//
// Services, Nodes and ServiceCIDRs concern every family; an EndpointSlice concerns
// the one family named by its addressType. The MetaProxier isolates the families from
// each other: a panic in one family's handler, or a family whose Run fails, is logged,
// counted and reported unhealthy, and never keeps the other family from receiving
// events or syncing.
package metaproxier

import (
	"context"
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/dsproxy/dsproxy/pkg/endpointslice"
	"github.com/dsproxy/dsproxy/pkg/family"
)

// FamilyProxier programs the rules of one IP family. The MetaProxier calls the event
// handlers from informer goroutines, possibly concurrently with each other and with
// Run; they must be safe for that, must not block on the sync (record the change and
// trigger the sync loop), and must not modify the objects they are given.
//
// A handler that panics is recovered by the MetaProxier; the event is then lost for
// that family, so handlers should not panic on bad cluster input.
type FamilyProxier interface {
	// Family returns the family this proxier programs; it must not change.
	Family() *family.Family

	OnServiceAdd(svc *v1.Service)
	OnServiceUpdate(old, cur *v1.Service)
	OnServiceDelete(svc *v1.Service)

	// The EndpointSlice handlers receive only slices whose addressType is the
	// proxier's family, ingested (parsed) once for every family.
	OnEndpointSliceAdd(slice *endpointslice.Object)
	OnEndpointSliceUpdate(old, cur *endpointslice.Object)
	OnEndpointSliceDelete(slice *endpointslice.Object)

	OnNodeAdd(node *v1.Node)
	OnNodeUpdate(old, cur *v1.Node)
	OnNodeDelete(node *v1.Node)

	// OnServiceCIDRsChanged receives the complete, sorted, de-duplicated list of this
	// family's service CIDRs (possibly empty) whenever it changes. The slice is the
	// proxier's to keep.
	OnServiceCIDRsChanged(cidrs []netip.Prefix)

	// Run runs the family's sync loop until ctx is done and then returns (nil or an
	// error). If it returns an error or panics before ctx is done, the MetaProxier
	// logs it, reports the family unhealthy and calls Run again after a backoff, so
	// Run must be callable again after it returned.
	Run(ctx context.Context) error

	// Health reports the family's sync status. It is called from health and metrics
	// handlers at any time and must be cheap and safe for concurrent use.
	Health() Health
}

// Health is a family proxier's own report of its sync status; runner.Status carries
// all of it for a proxier driven by a runner.Runner.
type Health struct {
	// Healthy is the proxier's verdict, typically runner.Status.Healthy: no change
	// has waited too long for a successful sync.
	Healthy bool
	// LastSync is when the last successful sync finished; zero if none has.
	LastSync time.Time
	// Started is when the sync loop started; zero before.
	Started time.Time
	// LastQueued is when the oldest change not yet synced arrived; zero if none.
	LastQueued time.Time
	// LastError is the error of the most recent sync, or nil if it succeeded.
	LastError error
	// ConsecutiveFailures counts failed syncs since the last success.
	ConsecutiveFailures int
	// FullSyncPending is true while the next sync will rebuild everything.
	FullSyncPending bool
}

// FamilyStatus is the MetaProxier's view of one family: the proxier's Health plus
// the state of its Run loop and handlers as seen from outside.
type FamilyStatus struct {
	// Healthy is Proxier.Healthy && Running.
	Healthy bool
	// Proxier is what the family proxier's Health returned (a zero Health with
	// LastError set if Health panicked).
	Proxier Health
	// Running is true while the family's Run is executing; false before
	// MetaProxier.Run, after it, and while a failed Run waits to be restarted.
	Running bool
	// Restarts counts how often Run was called again after failing.
	Restarts int
	// RunError is why Run last failed (an error, a panic, or returning early); nil if
	// it never did.
	RunError error
	// HandlerPanics counts panics recovered from this family's event handlers and
	// Health.
	HandlerPanics int64
}
