package app

import (
	"runtime/debug"
	"testing"
	"time"

	"github.com/dsproxy/dsproxy/pkg/family"
)

func TestColdStartReleasesOnceAfterEveryFamily(t *testing.T) {
	released := make(chan struct{}, 4)
	c := newColdStart(family.All, func() { released <- struct{}{} })
	none := func(what string) {
		t.Helper()
		select {
		case <-released:
			t.Fatalf("released %s", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
	once := func(what string) {
		t.Helper()
		select {
		case <-released:
		case <-time.After(5 * time.Second):
			t.Fatalf("not released %s", what)
		}
	}
	c.synced(family.IPv4)
	c.synced(family.IPv4) // a second sync of the same family
	none("before every family synced")
	c.synced(family.IPv6)
	once("after every family synced")
	c.synced(family.IPv4)
	c.synced(family.IPv6)
	none("twice")

	// A single-family daemon releases after its one family.
	one := newColdStart([]*family.Family{family.IPv6}, func() { released <- struct{}{} })
	one.synced(family.IPv4) // not one of its families
	none("after a family the daemon does not run")
	one.synced(family.IPv6)
	once("single family, after it synced")
}

// gcPercent reads the collector's target.
func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

func TestTightenGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	for _, tc := range []struct{ before, during int }{
		{100, 50}, // the default: halved until restored
		{200, 50},
		{30, 30}, // already tighter: left alone
		{50, 50},
		{-1, -1}, // GOGC=off: left off
	} {
		debug.SetGCPercent(tc.before)
		restore := tightenGC(50)
		if got := gcPercent(); got != tc.during {
			t.Errorf("GOGC %d: %d during the cold start, want %d", tc.before, got, tc.during)
		}
		restore()
		if got := gcPercent(); got != tc.before {
			t.Errorf("GOGC %d: %d once restored", tc.before, got)
		}
	}
}
