package app

import (
	"testing"
	"time"

	"github.com/dsproxy/dsproxy/pkg/config"
	"github.com/dsproxy/dsproxy/pkg/runner"
)

// kube-proxy's sync settings map onto the runner as kube-proxy v1.36 uses them:
// syncPeriod is no longer the full-sync period.
func TestRunnerOptions(t *testing.T) {
	got := runnerOptions(&config.Config{SyncPeriod: 30 * time.Second, MinSyncPeriod: 2 * time.Second})
	want := runner.Options{MinInterval: 2 * time.Second, FullResyncPeriod: time.Hour, CheckPeriod: 30 * time.Second, RetryMax: 30 * time.Second}
	if got != want {
		t.Errorf("runnerOptions = %+v, want %+v", got, want)
	}
}
