//go:build e2e && netns

package e2e

import (
	"fmt"
	"os/exec"
	"testing"
	"time"
)

func TestParseStatTicks(t *testing.T) {
	// A command may hold spaces and parentheses; fields count from the last ')'.
	line := "4242 (a) (b c) S 17 4242 4242 0 -1 4194304 100 0 0 0 120 30 7 3 20 0 1 0 55 1000 10 18446744073709551615"
	ticks, ppid, err := parseStatTicks(line)
	if err != nil {
		t.Fatal(err)
	}
	if ticks != 160 || ppid != 17 {
		t.Errorf("ticks %d ppid %d, want 160 17", ticks, ppid)
	}
	for _, bad := range []string{"", "4242 no-paren S 1 2", "1 (x) S 1 2 3", "1 (x) S one 1 1 0 -1 0 0 0 0 0 1 2 3 4", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 1 x 3 4"} {
		if _, _, err := parseStatTicks(bad); err == nil {
			t.Errorf("parseStatTicks(%q): no error", bad)
		}
	}
}

// TestTreeCPUTicksCountsRunningDescendants: a shell whose grandchild spins has
// spent the grandchild's CPU before anything waits for it.
func TestTreeCPUTicksCountsRunningDescendants(t *testing.T) {
	cmd := exec.Command("sh", "-c", `sh -c 'while :; do :; done' & wait`)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = exec.Command("pkill", "-KILL", "-P", fmt.Sprint(cmd.Process.Pid)).Run()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		self, _, err := statTicks(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		tree, err := treeCPUTicks(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if tree-self >= 20 { // the spinning grandchild's 0.2 s
			t.Logf("shell %d ticks, with its running descendants %d", self, tree)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s: shell %d ticks, with its running descendants %d: the spinning child is not counted", self, tree)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestInformersSynced reads when each proxy's log says its informers had synced:
// dsproxy's one line, the later of kube-proxy's service and endpoint slice
// configs (not its node or ServiceCIDR configs, nor the unnamed line).
func TestInformersSynced(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 4, 17, 47, 0, time.Local)
	for name, c := range map[string]struct {
		log  string
		want time.Duration
		ok   bool
	}{
		"dsproxy": {log: `I1127 04:17:47.010000   11741 main.go:67] "dsproxy starting"
I1127 04:17:49.840712   11741 watch.go:108] "Informer caches synced" node="bench-dsp11171-1"
`, want: 2840712 * time.Microsecond, ok: true},
		"kube-proxy": {log: `I1127 04:17:48.475900   27564 shared_informer.go:409] "Caches are synced"
I1127 04:17:48.716296   27564 shared_informer.go:388] "Caches are synced" controller="node config"
I1127 04:17:49.917041   27564 shared_informer.go:388] "Caches are synced" controller="endpoint slice config"
I1127 04:17:49.816703   27564 shared_informer.go:388] "Caches are synced" controller="service config"
I1127 04:17:52.820746   27564 shared_informer.go:388] "Caches are synced" controller="serviceCIDR config"
`, want: 2917041 * time.Microsecond, ok: true},
		"none yet": {log: "I1127 04:17:47.010000   11741 main.go:67] \"dsproxy starting\"\n"},
	} {
		got, ok := informersSynced(c.log, t0)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: %v %v, want %v %v", name, got, ok, c.want, c.ok)
		}
	}
}
