package hugeheap

import (
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// CostlyFault is the cost of a small page's first touch from which
// AdviseIfFaultsCostly advises huge pages. Measured (bench/README.md, "Page
// faults"): 12.9–17.3 µs on a PVM guest (shadow paging), where huge pages took
// a second off a 30k cold start; 1.5–5 µs on a KVM guest with hardware paging,
// where a huge page's first touch cost 0.2–10 ms (up to 20 µs per small page it
// holds) and a Go program filling 3 M small objects was slower with them
// (1.05–1.97 s against 0.72–1.02 s). On bare metal a fault is well under
// 1 µs (not measured here).
const CostlyFault = 8 * time.Microsecond

// probeBytes is how much memory the probe touches: 1024 small pages, 2–4 ms
// on the KVM guest and about 15 ms where faults are costly.
const probeBytes = 4 << 20

// faultCost is what the probe measures; tests replace it.
var faultCost = probeFaultCost

// probeFaultCost maps probeBytes of fresh anonymous memory marked
// MADV_NOHUGEPAGE, writes one byte in each small page in eight runs, and
// returns the median run's time per page. The median keeps one run that hit
// memory the hypervisor had to back first, or a preemption, from deciding.
func probeFaultCost() (time.Duration, error) {
	m, err := unix.Mmap(-1, 0, probeBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return 0, err
	}
	defer unix.Munmap(m)
	if err := unix.Madvise(m, unix.MADV_NOHUGEPAGE); err != nil {
		return 0, err
	}
	const runs = 8
	page := unix.Getpagesize()
	per := len(m) / runs
	times := make([]time.Duration, runs)
	for r := range runs {
		b := m[r*per : (r+1)*per]
		t0 := time.Now()
		for i := 0; i < len(b); i += page {
			b[i] = 1
		}
		times[r] = time.Since(t0) / time.Duration(per/page)
	}
	slices.Sort(times)
	return (times[runs/2-1] + times[runs/2]) / 2, nil
}
