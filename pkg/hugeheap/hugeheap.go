// Package hugeheap backs the Go heap that a cold start grows into with
// transparent huge pages where the kernel only gives them to memory that asks
// (transparent_hugepage/enabled = madvise, the default of Debian and Ubuntu).
//
// A cold start at 30k Services grows the heap to about 360 MiB, most of it in
// the first seconds, and every 4 KiB page of that is a page fault. On a VM with
// shadow paging a fault costs 12–17 µs (bench/README.md, "Page faults"): a
// first touch of 360 MiB takes 1.2–1.6 s there. Go does not advise huge pages
// for its heap (since Go 1.21.1), so under "madvise" the heap never gets them.
//
// Advise makes the runtime map a region of heap address space at once, by
// allocating one large untouched buffer, marks the region MADV_HUGEPAGE and
// frees the buffer. Go's page allocator hands out the lowest free addresses
// first, so the heap's next growth lands in the advised region; its first touch
// of each 2 MiB then takes one fault instead of 512. The buffer is never
// written, so the kernel backs only what the heap later uses (and the
// runtime's page bookkeeping for the region, about 1 MiB per GiB).
//
// Huge pages pay only where a fault is dear in itself. AdviseIfFaultsCostly,
// what the daemon calls, first times a few small pages' first touch and
// advises only from CostlyFault up: on a KVM guest with hardware paging a small
// page's first touch costs 1.5–5 µs but a huge page's up to 10 ms (the host
// backs the guest's memory on demand), and there a heap grown into advised
// memory was slower to fill than Go's own.
package hugeheap

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// advised is the region Advise marked, for Release.
var advised struct {
	sync.Mutex
	beg, end uintptr
}

// Result says what Advise did.
type Result struct {
	// Advised is the size of the region marked MADV_HUGEPAGE (0 if none).
	Advised uintptr
	// Skipped says why nothing was advised, when Advised is 0.
	Skipped string
	// FaultCost is the first touch of a small page as AdviseIfFaultsCostly
	// measured it (0 when not measured).
	FaultCost time.Duration
}

// Paths of the kernel settings Advise reads; tests point them elsewhere.
var (
	thpEnabledPath = "/sys/kernel/mm/transparent_hugepage/enabled"
	hpageSizePath  = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"
	overcommitPath = "/proc/sys/vm/overcommit_memory"
	meminfoPath    = "/proc/meminfo"
)

// Advise marks up to size bytes of heap address space for huge pages, capped
// at a quarter of the machine's memory. It does nothing (and says why) unless
// transparent huge pages are in madvise mode, or when the kernel accounts
// address space strictly (vm.overcommit_memory = 2: there the region would
// count against the commit limit even untouched). Call it early, before the
// heap grows.
func Advise(size uintptr) Result { return adviseHeap(size, false) }

// AdviseIfFaultsCostly is Advise where page faults are costly: it first times
// the first touch of a few fresh small pages and advises only when one costs
// CostlyFault or more. Where faults are cheap, huge pages save little on the
// heap's growth, and a huge page's first touch can cost more than its 512
// small pages' (a hypervisor backing guest memory on demand, 4 KiB at a time).
func AdviseIfFaultsCostly(size uintptr) Result { return adviseHeap(size, true) }

func adviseHeap(size uintptr, probe bool) Result {
	mode, err := thpMode()
	if err != nil {
		return Result{Skipped: err.Error()}
	}
	if strings.Contains(os.Getenv("GODEBUG"), "disablethp=1") {
		return Result{Skipped: "GODEBUG has disablethp=1"}
	}
	if mode != "madvise" {
		return Result{Skipped: "transparent_hugepage/enabled is " + mode + ", not madvise"}
	}
	if b, err := os.ReadFile(overcommitPath); err == nil && strings.TrimSpace(string(b)) == "2" {
		return Result{Skipped: "vm.overcommit_memory is 2 (strict accounting)"}
	}
	var cost time.Duration
	if probe {
		if cost, err = faultCost(); err != nil {
			return Result{Skipped: "timing page faults: " + err.Error()}
		}
		if cost < CostlyFault {
			return Result{Skipped: fmt.Sprintf("a page fault costs %v here, under %v", cost, CostlyFault), FaultCost: cost}
		}
	}
	huge := uintptr(2 << 20)
	if b, err := os.ReadFile(hpageSizePath); err == nil {
		if v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil && v > 0 && v&(v-1) == 0 {
			huge = uintptr(v)
		}
	}
	if total := memTotal(); total > 0 && size > total/4 {
		size = total / 4
	}
	if size < 4*huge {
		return Result{Skipped: fmt.Sprintf("region of %d bytes too small for huge pages of %d", size, huge), FaultCost: cost}
	}
	n, err := advise(size, huge)
	// Free the buffer now: its pages go back to the heap, still advised.
	runtime.GC()
	if err != nil {
		return Result{Skipped: "madvise: " + err.Error(), FaultCost: cost}
	}
	return Result{Advised: n, FaultCost: cost}
}

// advise allocates an untouched buffer of size bytes (new heap address space,
// mapped by the runtime and never written) and marks its huge-page-aligned
// part MADV_HUGEPAGE. The buffer is garbage once it returns.
func advise(size, huge uintptr) (uintptr, error) {
	buf := make([]byte, size)
	p := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	beg := (p + huge - 1) &^ (huge - 1)
	end := (p + size) &^ (huge - 1)
	if err := unix.Madvise(buf[beg-p:end-p], unix.MADV_HUGEPAGE); err != nil {
		return 0, err
	}
	advised.Lock()
	advised.beg, advised.end = beg, end
	advised.Unlock()
	return end - beg, nil
}

// Release takes the advice back (MADV_NOHUGEPAGE) once the cold start is over,
// before its free memory goes back to the system. Left advised, the region
// would have khugepaged fill the holes the scavenger makes back into whole
// huge pages (it collapses a 2 MiB range with a single 4 KiB page present, by
// default), and the steady state would hold more memory than Go's own. It
// reports whether there was a region to release.
func Release() (bool, error) {
	advised.Lock()
	defer advised.Unlock()
	if advised.beg == 0 {
		return false, nil
	}
	beg, end := advised.beg, advised.end
	advised.beg, advised.end = 0, 0
	// The region is heap address space the runtime mapped and never unmaps; it
	// is kept as numbers, not a pointer, so that the buffer could be freed.
	if _, _, errno := unix.Syscall(unix.SYS_MADVISE, beg, end-beg, unix.MADV_NOHUGEPAGE); errno != 0 {
		return true, errno
	}
	return true, nil
}

// thpMode returns the bracketed word of transparent_hugepage/enabled
// ("always [madvise] never" → "madvise").
func thpMode() (string, error) {
	b, err := os.ReadFile(thpEnabledPath)
	if err != nil {
		return "", fmt.Errorf("no transparent huge pages: %w", err)
	}
	s := string(b)
	i, j := strings.IndexByte(s, '['), strings.IndexByte(s, ']')
	if i < 0 || j < i {
		return "", fmt.Errorf("transparent_hugepage/enabled: unexpected %q", strings.TrimSpace(s))
	}
	return s[i+1 : j], nil
}

// memTotal is MemTotal from /proc/meminfo in bytes (0 if unreadable).
func memTotal() uintptr {
	b, err := os.ReadFile(meminfoPath)
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			f := strings.Fields(rest)
			if len(f) == 2 && f[1] == "kB" {
				if v, err := strconv.ParseUint(f[0], 10, 64); err == nil {
					return uintptr(v) << 10
				}
			}
		}
	}
	return 0
}
