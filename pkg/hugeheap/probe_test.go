package hugeheap

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func minorFaults(t *testing.T) int64 {
	t.Helper()
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		t.Fatal(err)
	}
	return ru.Minflt
}

// TestProbeFaultCost checks that the probe times real first touches: the
// thread running it takes a minor fault for every small page it touches.
func TestProbeFaultCost(t *testing.T) {
	// Keep the probe and both readings of the thread's counters on one thread.
	done := make(chan struct{})
	var faults int64
	var cost time.Duration
	var err error
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		before := minorFaults(t)
		cost, err = probeFaultCost()
		faults = minorFaults(t) - before
	}()
	<-done
	if err != nil {
		t.Fatal(err)
	}
	pages := int64(probeBytes / unix.Getpagesize())
	if faults < pages {
		t.Errorf("probe took %d minor faults, want at least one per page (%d)", faults, pages)
	}
	if cost <= 0 {
		t.Errorf("probe measured %v per fault", cost)
	}
	t.Logf("%d minor faults; %v per small page (advise from %v)", faults, cost, CostlyFault)
}

// TestAdviseIfFaultsCostly checks the decision on a measured fault cost.
func TestAdviseIfFaultsCostly(t *testing.T) {
	saved := faultCost
	t.Cleanup(func() { faultCost = saved })
	if mode, err := thpMode(); err != nil || mode != "madvise" {
		t.Skipf("transparent huge pages not in madvise mode here (%q, %v)", mode, err)
	}

	faultCost = func() (time.Duration, error) { return 2 * time.Microsecond, nil }
	if r := AdviseIfFaultsCostly(64 << 20); r.Advised != 0 || r.FaultCost != 2*time.Microsecond || !strings.Contains(r.Skipped, "under "+CostlyFault.String()) {
		t.Errorf("cheap faults: %+v, want skipped with the cost", r)
	}

	faultCost = func() (time.Duration, error) { return 0, errors.New("no memory") }
	if r := AdviseIfFaultsCostly(64 << 20); r.Advised != 0 || !strings.Contains(r.Skipped, "timing page faults: no memory") {
		t.Errorf("failed probe: %+v, want skipped with the error", r)
	}

	faultCost = func() (time.Duration, error) { return 15 * time.Microsecond, nil }
	r := AdviseIfFaultsCostly(64 << 20)
	if r.Advised == 0 || r.FaultCost != 15*time.Microsecond {
		t.Errorf("costly faults: %+v, want advised with the cost", r)
	}
	if had, err := Release(); !had || err != nil {
		t.Errorf("Release = %v, %v; want the region advised above", had, err)
	}
}
