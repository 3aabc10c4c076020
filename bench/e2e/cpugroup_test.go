//go:build e2e && netns

package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dsproxy/dsproxy/test/e2e/framework"
	"golang.org/x/sys/unix"
)

// The control plane shares this machine's two cores with the proxy under test,
// its pods and the probe; in a cluster it runs on machines of its own. With
// -control-plane-cpu=background the bench models that: etcd, kube-apiserver and
// kube-controller-manager go into a CPU cgroup of the least weight the kernel
// takes (cgroup v1 cpu.shares 2, v2 cpu.weight 1, against 1024 / 100 for
// everything else), so that they run on what the node side leaves. Every proxy
// is measured so; the API server's own latency (call → event) then grows
// whenever the node side is busy.

// cpuGroupName is the cgroup the bench puts the control plane in.
const cpuGroupName = "dsproxy-bench-cp"

// cpuHier is the mounted hierarchy with the cpu controller.
type cpuHier struct {
	root string // mount point
	v2   bool
}

// findCPUHier finds the cpu controller's hierarchy in /proc/self/mountinfo: a
// cgroup (v1) mount with the cpu option, or else the cgroup2 mount if its
// cgroup.subtree_control enables cpu for children.
func findCPUHier() (cpuHier, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return cpuHier{}, err
	}
	defer f.Close()
	var v2 string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent maj:min root mountpoint opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		a, b := strings.Fields(pre), strings.Fields(post)
		if len(a) < 5 || len(b) < 3 {
			continue
		}
		switch b[0] {
		case "cgroup":
			if slices.Contains(strings.Split(b[2], ","), "cpu") {
				return cpuHier{root: a[4]}, nil
			}
		case "cgroup2":
			v2 = a[4]
		}
	}
	if err := sc.Err(); err != nil {
		return cpuHier{}, err
	}
	if v2 == "" {
		return cpuHier{}, errors.New("no cgroup hierarchy with the cpu controller is mounted")
	}
	b, err := os.ReadFile(filepath.Join(v2, "cgroup.subtree_control"))
	if err != nil {
		return cpuHier{}, err
	}
	if !slices.Contains(strings.Fields(string(b)), "cpu") {
		return cpuHier{}, fmt.Errorf("cgroup2 at %s does not enable the cpu controller for its children (cgroup.subtree_control: %q)", v2, strings.TrimSpace(string(b)))
	}
	return cpuHier{root: v2, v2: true}, nil
}

// cgroupOf returns pid's cgroup path (from the hierarchy's root) in h.
func (h cpuHier) cgroupOf(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", err
	}
	for l := range strings.Lines(string(b)) {
		// hierarchy-ID:controller-list:path
		parts := strings.SplitN(strings.TrimSpace(l), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if h.v2 && parts[0] == "0" && parts[1] == "" ||
			!h.v2 && slices.Contains(strings.Split(parts[1], ","), "cpu") {
			return parts[2], nil
		}
	}
	return "", fmt.Errorf("pid %d: no cpu cgroup in /proc/%d/cgroup", pid, pid)
}

// move puts process pid (all its threads) into the cgroup at path.
func (h cpuHier) move(pid int, path string) error {
	return os.WriteFile(filepath.Join(h.root, path, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
}

// cpuGroup is a cgroup of least CPU weight holding some processes, each of which
// goes back to the cgroup it came from on restore.
type cpuGroup struct {
	h    cpuHier
	name string
	from map[int]string // pid → its cgroup before
}

// background puts pids into a new cgroup called name (at the hierarchy's root)
// of the least CPU weight. A group of that name left by a killed run is emptied
// into the root and made again.
func background(name string, pids []int) (*cpuGroup, error) {
	h, err := findCPUHier()
	if err != nil {
		return nil, err
	}
	if err := removeGroup(h, name); err != nil {
		return nil, err
	}
	if err := os.Mkdir(filepath.Join(h.root, name), 0o755); err != nil {
		return nil, err
	}
	g := &cpuGroup{h: h, name: name, from: map[int]string{}}
	file, weight := "cpu.shares", "2"
	if h.v2 {
		file, weight = "cpu.weight", "1"
	}
	if err := os.WriteFile(filepath.Join(h.root, name, file), []byte(weight), 0o644); err != nil {
		return nil, errors.Join(fmt.Errorf("%s: %w", file, err), g.restore())
	}
	for _, pid := range pids {
		from, err := h.cgroupOf(pid)
		if err == nil {
			err = h.move(pid, name)
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("pid %d: %w", pid, err), g.restore())
		}
		g.from[pid] = from
	}
	return g, nil
}

// restore moves every process still running back where it was and removes the
// group.
func (g *cpuGroup) restore() error {
	var errs []error
	for pid, from := range g.from {
		if err := g.h.move(pid, from); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("pid %d back to %s: %w", pid, from, err))
		}
	}
	return errors.Join(append(errs, removeGroup(g.h, g.name))...)
}

// removeGroup moves whatever is left in the group called name into the
// hierarchy's root and removes it; no such group is no error.
func removeGroup(h cpuHier, name string) error {
	dir := filepath.Join(h.root, name)
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, f := range strings.Fields(string(b)) {
		if err := os.WriteFile(filepath.Join(h.root, "cgroup.procs"), []byte(f), 0o644); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("pid %s out of %s: %w", f, dir, err)
		}
	}
	return os.Remove(dir)
}

// controlPlaneCPU applies -control-plane-cpu to the running control plane for
// the rest of the test; it returns what to record in the report.
func controlPlaneCPU(t *testing.T, cp *framework.ControlPlane) string {
	t.Helper()
	switch *flagCPCPU {
	case "shared":
		// A group left by a killed background run must not hold the control
		// plane back now.
		if h, err := findCPUHier(); err == nil {
			if err := removeGroup(h, cpuGroupName); err != nil {
				t.Fatalf("control plane's CPU group left by an earlier run: %v", err)
			}
		}
		return "shared"
	case "background":
	default:
		t.Fatalf("-control-plane-cpu=%q: want shared or background", *flagCPCPU)
	}
	pids, err := cp.ProcessPIDs()
	if err != nil {
		t.Fatal(err)
	}
	g, err := background(cpuGroupName, pids)
	if err != nil {
		t.Fatalf("-control-plane-cpu=background: %v", err)
	}
	t.Cleanup(func() {
		if err := g.restore(); err != nil {
			t.Errorf("control plane's CPU group: %v", err)
		}
	})
	desc := "background (cgroup v1 cpu.shares 2)"
	if g.h.v2 {
		desc = "background (cgroup v2 cpu.weight 1)"
	}
	t.Logf("control plane CPU: %s: etcd, kube-apiserver and kube-controller-manager run on what the node side leaves", desc)
	return desc
}

// TestCPUGroup puts one of two busy loops sharing a CPU into a background group:
// it must then get a small share of the CPU, where before it got about half, and
// go back to its own cgroup afterwards.
func TestCPUGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	h, err := findCPUHier()
	if err != nil {
		t.Skipf("-control-plane-cpu=background cannot work here: %v", err)
	}
	// Groups of runs of this test that were killed before their cleanup.
	if stale, err := filepath.Glob(filepath.Join(h.root, "dsproxy-bench-test-*")); err == nil {
		for _, dir := range stale {
			if err := removeGroup(h, filepath.Base(dir)); err != nil {
				t.Logf("stale group %s: %v", dir, err)
			}
		}
	}
	var own unix.CPUSet
	if err := unix.SchedGetaffinity(0, &own); err != nil {
		t.Fatal(err)
	}
	cpu := -1
	for c := range 1024 {
		if own.IsSet(c) {
			cpu = c
		}
	}
	var one unix.CPUSet
	one.Set(cpu)
	loop := func() int {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		// A test binary killed before its cleanup must not leave the loops
		// spinning on the host.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		if err := unix.SchedSetaffinity(cmd.Process.Pid, &one); err != nil {
			t.Fatal(err)
		}
		return cmd.Process.Pid
	}
	fg, bg := loop(), loop()
	// share returns bg's CPU time over fg's, over one second.
	share := func() float64 {
		f0, _, err1 := statTicks(fg)
		b0, _, err2 := statTicks(bg)
		time.Sleep(time.Second)
		f1, _, err3 := statTicks(fg)
		b1, _, err4 := statTicks(bg)
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			t.Fatal(err)
		}
		if f1 == f0 {
			t.Fatalf("the foreground loop got no CPU in a second (bg got %d ticks)", b1-b0)
		}
		return float64(b1-b0) / float64(f1-f0)
	}
	if s := share(); s < 0.5 {
		t.Fatalf("before the group: the second loop got %.2f of the first's CPU, want about 1", s)
	}

	before, err := h.cgroupOf(bg)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("dsproxy-bench-test-%d", os.Getpid())
	g, err := background(name, []int{bg})
	if err != nil {
		t.Fatal(err)
	}
	restored := false
	t.Cleanup(func() {
		if !restored {
			_ = g.restore()
		}
	})
	if in, err := h.cgroupOf(bg); err != nil || in != "/"+name {
		t.Fatalf("in group: cgroup %q (%v), want /%s", in, err, name)
	}
	if s := share(); s > 0.1 {
		t.Errorf("in the background group: the loop got %.2f of the foreground's CPU, want < 0.1", s)
	} else {
		t.Logf("in the background group: %.3f of the foreground's CPU (cgroup v2: %v)", s, h.v2)
	}

	restored = true
	if err := g.restore(); err != nil {
		t.Fatal(err)
	}
	if in, err := h.cgroupOf(bg); err != nil || in != before {
		t.Errorf("after restore: cgroup %q (%v), want %q", in, err, before)
	}
	if _, err := os.Stat(filepath.Join(h.root, name)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("group directory left after restore: %v", err)
	}
}
