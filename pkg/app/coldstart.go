package app

import (
	"runtime/debug"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/hugeheap"
)

// coldStart returns the cold start's memory to the system once every family has
// synced for the first time. The first sync builds each family's whole ruleset;
// the heap it leaves behind (netlink batches, element lists, decoded API objects:
// at 10k Services 60 MB beyond what stays live) would otherwise stay with the
// process, since Go's collector paces itself from the cold start's peak and a proxy
// that only follows changes allocates too little to bring the next collection on.
type coldStart struct {
	mu      sync.Mutex
	pending map[*family.Family]bool // nil once released
	release func()
}

func newColdStart(fams []*family.Family, release func()) *coldStart {
	c := &coldStart{pending: map[*family.Family]bool{}, release: release}
	for _, f := range fams {
		c.pending[f] = true
	}
	return c
}

// synced records a successful sync of f; the last family's first one releases
// the memory, once, on a goroutine of its own.
func (c *coldStart) synced(f *family.Family) {
	c.mu.Lock()
	if c.pending == nil || !c.pending[f] {
		c.mu.Unlock()
		return
	}
	delete(c.pending, f)
	done := len(c.pending) == 0
	if done {
		c.pending = nil
	}
	c.mu.Unlock()
	if done {
		go c.release()
	}
}

// coldStartGCPercent is the collector's target (GOGC) from the informers' sync
// until the cold start is released. While the first syncs build every ruleset
// the live heap only grows, and GOGC=100 lets the heap reach twice what was
// live at the last collection: that peak, not the steady state, is what a
// DaemonSet's memory limit must hold. The informers' lists are left at the
// usual target: their collections cost the most CPU at 30k Services and do not
// make the peak.
const coldStartGCPercent = 50

// tightenGC sets the collector's target to percent unless it is lower already
// (or off), and returns the function that restores the previous target.
func tightenGC(percent int) (restore func()) {
	prev := debug.SetGCPercent(percent)
	if prev < 0 || prev <= percent {
		debug.SetGCPercent(prev)
		return func() {}
	}
	return func() { debug.SetGCPercent(prev) }
}

// releaseMemory collects garbage and returns the free heap to the system. The
// heap the cold start grew into loses its huge-page advice first (hugeheap), so
// that the steady state keeps Go's usual footprint.
func releaseMemory() {
	start := time.Now()
	if had, err := hugeheap.Release(); err != nil {
		klog.InfoS("Could not take back the heap's huge-page advice", "err", err)
	} else if had {
		klog.V(2).InfoS("Took back the heap's huge-page advice")
	}
	debug.FreeOSMemory()
	klog.V(2).InfoS("Returned the cold start's free memory to the system", "elapsed", time.Since(start))
}
