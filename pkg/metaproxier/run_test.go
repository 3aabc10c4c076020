package metaproxier

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/runner"
)

// wait bounds every blocking step of a test; nothing here sleeps for it in a passing run.
const wait = 5 * time.Second

// eventually polls cond every millisecond until it holds, failing after wait.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// startRun runs m.Run on a fake clock; the returned stop cancels it and checks that
// it returns nil promptly.
func startRun(t *testing.T, m *MetaProxier) (clk *clocktesting.FakeClock, stop func()) {
	t.Helper()
	clk = clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	m.clock = clk
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	stopped := false
	stop = func() {
		t.Helper()
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run = %v, want nil", err)
			}
		case <-time.After(wait):
			t.Fatal("Run did not return after cancel")
		}
	}
	t.Cleanup(stop)
	return clk, stop
}

// withRunner makes r a real runner-driven proxier: every event triggers a sync, and
// each sync is reported on the returned channel.
func withRunner(r *recorder) <-chan bool {
	synced := make(chan bool, 100)
	rn := runner.New(r.fam.Name, func(_ context.Context, full bool) error {
		synced <- full
		return nil
	}, runner.Options{})
	r.onEvent = rn.Trigger
	r.runs = []func(context.Context) error{rn.Run}
	return synced
}

func expectSync(t *testing.T, synced <-chan bool) {
	t.Helper()
	select {
	case <-synced:
	case <-time.After(wait):
		t.Fatal("family did not sync")
	}
}

func TestFailedFamilyIsRestartedWhileOtherKeepsSyncing(t *testing.T) {
	m, recs := setup(t, family.IPv4, family.IPv6)
	v4, v6 := recs[family.IPv4], recs[family.IPv6]
	release := make(chan error)
	v4.runs = []func(context.Context) error{
		func(context.Context) error { return errors.New("nftables: table busy") },
		func(context.Context) error { panic("nil map") },
		func(context.Context) error { return <-release }, // stuck, then fails
		func(ctx context.Context) error { <-ctx.Done(); return nil },
	}
	synced := withRunner(v6)
	clk, stop := startRun(t, m)

	// IPv4 failed once and waits 1s to restart; IPv6 runs and syncs meanwhile.
	eventually(t, "IPv4 restart timer", clk.HasWaiters)
	h := m.Health()
	if h[family.IPv4].Healthy || h[family.IPv4].Running || h[family.IPv4].RunError == nil {
		t.Errorf("failed IPv4: %+v", h[family.IPv4])
	}
	m.OnServiceAdd(svc("a"))
	expectSync(t, synced)
	if !m.Health()[family.IPv6].Healthy {
		t.Errorf("IPv6 unhealthy: %+v", m.Health()[family.IPv6])
	}

	// The second Run panics; the next restart waits 2s.
	clk.Step(time.Second)
	eventually(t, "IPv4 second restart timer", func() bool { return v4.runCount() == 2 && clk.HasWaiters() })
	if err := m.Health()[family.IPv4].RunError; err == nil || !strings.Contains(err.Error(), "nil map") {
		t.Errorf("RunError = %v, want the panic", err)
	}
	clk.Step(2*time.Second - time.Millisecond)
	if !clk.HasWaiters() { // Step fires due timers synchronously
		t.Fatal("IPv4 restart timer fired before 2s")
	}
	clk.Step(time.Millisecond)
	eventually(t, "IPv4 third run", func() bool { return m.Health()[family.IPv4].Running && v4.runCount() == 3 })

	// IPv4 is stuck inside Run; IPv6 still gets events and syncs.
	m.OnServiceAdd(svc("b"))
	expectSync(t, synced)
	if st := m.Health()[family.IPv4]; !st.Healthy || st.Restarts != 2 {
		t.Errorf("restarted IPv4: %+v", st)
	}

	// After running for restartMax, a failure restarts after restartMin again.
	clk.Step(restartMax)
	release <- errors.New("netlink: ENOBUFS")
	eventually(t, "IPv4 third restart timer", clk.HasWaiters)
	clk.Step(restartMin)
	eventually(t, "IPv4 fourth run", func() bool { return v4.runCount() == 4 })
	if n := v6.runCount(); n != 1 {
		t.Errorf("IPv6 Run called %d times, want 1", n)
	}
	stop()
	for f, st := range m.Health() {
		if st.Running {
			t.Errorf("%s still running after Run returned", f)
		}
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	m, recs := setup(t, family.IPv4, family.IPv6)
	// IPv4 always fails, so cancel finds it in its restart backoff.
	recs[family.IPv4].runs = []func(context.Context) error{
		func(context.Context) error { return errors.New("broken") },
	}
	clk, stop := startRun(t, m)
	eventually(t, "IPv4 restart timer", clk.HasWaiters)
	eventually(t, "IPv6 running", func() bool { return m.Health()[family.IPv6].Running })
	if err := m.Run(context.Background()); !errors.Is(err, ErrRunning) {
		t.Errorf("second Run = %v, want ErrRunning", err)
	}
	stop()
	if clk.HasWaiters() {
		t.Error("restart timer left armed")
	}
	if st := m.Health()[family.IPv6]; st.RunError != nil || st.Running || st.Restarts != 0 {
		t.Errorf("IPv6 after a clean stop: %+v", st)
	}
}

func TestHealth(t *testing.T) {
	m, recs := setup(t, family.IPv4, family.IPv6)
	recs[family.IPv6].health = Health{Healthy: false, ConsecutiveFailures: 3, LastError: errors.New("EPERM")}
	// Before the first Run (the informers listing) a family is as healthy as its
	// proxier says, as kube-proxy's while its caches sync.
	if h := m.Health(); !h[family.IPv4].Healthy || h[family.IPv4].Running || h[family.IPv6].Healthy {
		t.Errorf("before Run: IPv4 %+v, IPv6 %+v", h[family.IPv4], h[family.IPv6])
	}
	_, stop := startRun(t, m)
	eventually(t, "both families running", func() bool {
		h := m.Health()
		return h[family.IPv4].Running && h[family.IPv6].Running
	})
	h := m.Health()
	if !h[family.IPv4].Healthy {
		t.Errorf("IPv4: %+v", h[family.IPv4])
	}
	if st := h[family.IPv6]; st.Healthy || st.Proxier.ConsecutiveFailures != 3 || st.Proxier.LastError == nil {
		t.Errorf("IPv6 reporting failures: %+v", st)
	}
	stop()
	// Once it has run, a family that is not running is unhealthy.
	if st := m.Health()[family.IPv4]; st.Healthy || st.Running {
		t.Errorf("IPv4 after Run returned: %+v", st)
	}
}
