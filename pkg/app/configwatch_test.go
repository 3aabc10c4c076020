package app

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

const conf = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

func writeConf(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
}

func watchConf(t *testing.T, ctx context.Context, path string) context.Context {
	t.Helper()
	watched, stop, err := WatchConfigFile(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return watched
}

func wantStopped(t *testing.T, ctx context.Context, want error) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not stopped 5 s after the change")
	}
	if got := StopCause(ctx); !errors.Is(got, want) {
		t.Fatalf("StopCause = %v, want %v", got, want)
	}
}

func wantRunning(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	select {
	case <-ctx.Done():
		t.Fatalf("stopped after %s: %v", what, context.Cause(ctx))
	case <-time.After(300 * time.Millisecond):
	}
	if err := StopCause(ctx); err != nil {
		t.Fatalf("StopCause = %v while running", err)
	}
}

// TestWatchConfigFile: kube-proxy v1.36 exits when its --config file is written
// or renamed (Options.eventHandler), and on nothing else.
func TestWatchConfigFile(t *testing.T) {
	t.Run("write", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "config.conf")
		writeConf(t, path)
		ctx := watchConf(t, context.Background(), path)
		wantRunning(t, ctx, "nothing")
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString("mode: iptables\n"); err != nil {
			t.Fatal(err)
		}
		_ = f.Close()
		wantStopped(t, ctx, ErrConfigFileUpdated)
	})

	t.Run("rename", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "config.conf")
		writeConf(t, path)
		ctx := watchConf(t, context.Background(), path)
		if err := os.Rename(path, filepath.Join(dir, "old.conf")); err != nil {
			t.Fatal(err)
		}
		wantStopped(t, ctx, ErrConfigFileUpdated)
	})

	t.Run("chmod, then write", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "config.conf")
		writeConf(t, path)
		ctx := watchConf(t, context.Background(), path)
		if err := os.Chmod(path, 0o600); err != nil {
			t.Fatal(err)
		}
		wantRunning(t, ctx, "a chmod")
		writeConf(t, path)
		wantStopped(t, ctx, ErrConfigFileUpdated)
	})

	// A ConfigMap volume: config.conf -> ..data/config.conf, ..data -> a
	// timestamped directory; the kubelet updates it by swapping ..data and
	// removing the old directory. The watched file is removed, not written:
	// kube-proxy goes on with its old configuration, and so does dsproxy.
	t.Run("ConfigMap volume update", func(t *testing.T) {
		dir := t.TempDir()
		for _, ts := range []string{"..ts1", "..ts2"} {
			if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
				t.Fatal(err)
			}
			writeConf(t, filepath.Join(dir, ts, "config.conf"))
		}
		if err := os.Symlink("..ts1", filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "config.conf")
		if err := os.Symlink(filepath.Join("..data", "config.conf"), path); err != nil {
			t.Fatal(err)
		}
		ctx := watchConf(t, context.Background(), path)
		if err := os.Symlink("..ts2", filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(filepath.Join(dir, "..ts1")); err != nil {
			t.Fatal(err)
		}
		wantRunning(t, ctx, "the volume's update")
	})

	t.Run("SIGTERM is no error", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "config.conf")
		writeConf(t, path)
		parent, cancel := context.WithCancel(context.Background())
		ctx := watchConf(t, parent, path)
		cancel()
		<-ctx.Done()
		if err := StopCause(ctx); err != nil {
			t.Fatalf("StopCause = %v after the parent's cancel, want nil", err)
		}
	})

	t.Run("missing file", func(t *testing.T) {
		if _, _, err := WatchConfigFile(context.Background(), filepath.Join(t.TempDir(), "none")); err == nil {
			t.Fatal("watching a missing file: no error")
		}
	})
}
