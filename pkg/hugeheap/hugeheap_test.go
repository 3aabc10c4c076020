package hugeheap

import (
	"bufio"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// vma is one mapping of /proc/self/smaps: its range, VmFlags and AnonHugePages.
type vma struct {
	lo, hi    uintptr
	flags     []string
	hugeBytes uint64
}

func smaps(t *testing.T) []vma {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	var out []vma
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if r := strings.SplitN(fields[0], "-", 2); len(r) == 2 && !strings.HasSuffix(fields[0], ":") {
			lo, err1 := strconv.ParseUint(r[0], 16, 64)
			hi, err2 := strconv.ParseUint(r[1], 16, 64)
			if err1 == nil && err2 == nil {
				out = append(out, vma{lo: uintptr(lo), hi: uintptr(hi)})
				continue
			}
		}
		if len(out) == 0 {
			continue
		}
		cur := &out[len(out)-1]
		switch fields[0] {
		case "VmFlags:":
			cur.flags = fields[1:]
		case "AnonHugePages:":
			if v, err := strconv.ParseUint(fields[1], 10, 64); err == nil {
				cur.hugeBytes = v << 10
			}
		}
	}
	return out
}

func find(vs []vma, p uintptr) (vma, bool) {
	for _, v := range vs {
		if v.lo <= p && p < v.hi {
			return v, true
		}
	}
	return vma{}, false
}

// TestAdvise checks, on this machine's kernel, that the heap the program
// allocates after Advise lands in mappings marked for huge pages ("hg") and is
// backed by them: what the daemon relies on for its cold start.
func TestAdvise(t *testing.T) {
	mode, err := thpMode()
	if err != nil || mode != "madvise" {
		t.Skipf("transparent huge pages not in madvise mode here (%q, %v)", mode, err)
	}
	r := Advise(256 << 20)
	if r.Advised == 0 {
		t.Fatalf("nothing advised: %s", r.Skipped)
	}
	// What a cold start allocates: many small objects, 64 MiB in all.
	type obj struct{ a [8]uint64 }
	objs := make([]*obj, 0, 1<<20)
	for range 1 << 20 {
		o := &obj{}
		o.a[0] = 1 // touch
		objs = append(objs, o)
	}
	vs := smaps(t)
	advised, huge := 0, uint64(0)
	seen := map[uintptr]bool{}
	for i := 0; i < len(objs); i += 1 << 12 {
		v, ok := find(vs, uintptr(unsafe.Pointer(objs[i])))
		if !ok {
			t.Fatalf("object %p in no mapping", objs[i])
		}
		if slices.Contains(v.flags, "hg") {
			advised++
			if !seen[v.lo] {
				seen[v.lo] = true
				huge += v.hugeBytes
			}
		}
	}
	runtime.KeepAlive(objs)
	samples := (len(objs) + 1<<12 - 1) >> 12
	if advised < samples*9/10 {
		t.Errorf("%d of %d sampled objects in mappings advised for huge pages, want nearly all", advised, samples)
	}
	// How many huge pages the kernel finds depends on its free memory's
	// fragmentation; a few are enough to show the advice took.
	if huge < 8<<20 {
		t.Errorf("advised mappings holding the objects have %d MiB of huge pages, want at least 8 of the 64 MiB", huge>>20)
	}
	t.Logf("advised %d MiB; %d/%d sampled objects in advised mappings, %d MiB of huge pages there", r.Advised>>20, advised, samples, huge>>20)
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAdviseSkips checks the settings under which Advise does nothing.
func TestAdviseSkips(t *testing.T) {
	saved := [...]string{thpEnabledPath, overcommitPath, meminfoPath}
	t.Cleanup(func() { thpEnabledPath, overcommitPath, meminfoPath = saved[0], saved[1], saved[2] })
	dir := t.TempDir()
	for _, c := range []struct {
		name, thp, overcommit, meminfo, want string
	}{
		{"always", "[always] madvise never\n", "0\n", "MemTotal: 8000000 kB\n", "is always, not madvise"},
		{"never", "always madvise [never]\n", "0\n", "MemTotal: 8000000 kB\n", "is never, not madvise"},
		{"garbled", "madvise\n", "0\n", "MemTotal: 8000000 kB\n", "unexpected"},
		{"missing", "", "0\n", "MemTotal: 8000000 kB\n", "no transparent huge pages"},
		{"strict overcommit", "always [madvise] never\n", "2\n", "MemTotal: 8000000 kB\n", "overcommit_memory is 2"},
		{"tiny machine", "always [madvise] never\n", "0\n", "MemTotal: 16000 kB\n", "too small"},
	} {
		t.Run(c.name, func(t *testing.T) {
			thpEnabledPath = filepath.Join(dir, "absent")
			if c.thp != "" {
				thpEnabledPath = writeFile(t, dir, "thp", c.thp)
			}
			overcommitPath = writeFile(t, dir, "oc", c.overcommit)
			meminfoPath = writeFile(t, dir, "mi", c.meminfo)
			r := Advise(1 << 30)
			if r.Advised != 0 || !strings.Contains(r.Skipped, c.want) {
				t.Errorf("Advise = %+v, want skipped with %q", r, c.want)
			}
		})
	}
	t.Run("GODEBUG", func(t *testing.T) {
		thpEnabledPath = writeFile(t, dir, "thp", "always [madvise] never\n")
		overcommitPath = writeFile(t, dir, "oc", "0\n")
		t.Setenv("GODEBUG", "disablethp=1")
		if r := Advise(1 << 30); r.Advised != 0 || !strings.Contains(r.Skipped, "disablethp") {
			t.Errorf("Advise = %+v, want skipped for GODEBUG", r)
		}
	})
}

// TestRelease checks that Release takes the advice off the region: afterwards
// no mapping of the region is marked for huge pages, and a second Release has
// nothing to do.
func TestRelease(t *testing.T) {
	if mode, err := thpMode(); err != nil || mode != "madvise" {
		t.Skipf("transparent huge pages not in madvise mode here (%q, %v)", mode, err)
	}
	if r := Advise(64 << 20); r.Advised == 0 {
		t.Fatalf("nothing advised: %s", r.Skipped)
	}
	advised.Lock()
	beg, end := advised.beg, advised.end
	advised.Unlock()
	marked := func() int {
		n := 0
		for _, v := range smaps(t) {
			if v.lo < end && beg < v.hi && slices.Contains(v.flags, "hg") {
				n++
			}
		}
		return n
	}
	if marked() == 0 {
		t.Fatal("no mapping of the advised region is marked hg")
	}
	if had, err := Release(); !had || err != nil {
		t.Fatalf("Release = %v, %v; want true, nil", had, err)
	}
	if n := marked(); n != 0 {
		t.Errorf("%d mappings of the region still marked hg after Release", n)
	}
	if had, err := Release(); had || err != nil {
		t.Errorf("second Release = %v, %v; want false, nil", had, err)
	}
}
