package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/fsnotify/fsnotify"
)

// ErrConfigFileUpdated ends the daemon when its --config file is written or
// renamed, with kube-proxy v1.36's message: the DaemonSet then restarts it with
// the new file. The rules stay in place, as on SIGTERM.
var ErrConfigFileUpdated = errors.New("content of the proxy server's configuration file was updated")

// WatchConfigFile watches the --config file as kube-proxy v1.36 does (an inotify
// watch on the path, following a symlink to the file): the context it returns
// is cancelled, with ErrConfigFileUpdated as its cause, once the file is written
// or renamed, or with the watch's error if the watch fails. Other events
// (attributes, the file's removal) change nothing, as in kube-proxy; so the
// update of a ConfigMap volume, which replaces the file the link names, is not
// noticed by either. stop releases the watch.
func WatchConfigFile(ctx context.Context, path string) (watched context.Context, stop func(), err error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, nil, fmt.Errorf("watching the configuration file: %w", err)
	}
	if err := w.Add(path); err != nil {
		_ = w.Close()
		return nil, nil, fmt.Errorf("watching the configuration file %s: %w", path, err)
	}
	watched, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-watched.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if ev.Has(fsnotify.Write) || ev.Has(fsnotify.Rename) {
					cancel(ErrConfigFileUpdated)
					return
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				cancel(fmt.Errorf("watching the configuration file %s: %w", path, err))
				return
			}
		}
	}()
	return watched, func() {
		cancel(context.Canceled)
		_ = w.Close()
		<-done
	}, nil
}

// StopCause is why ctx (from WatchConfigFile, or any context) ended when that
// is an error to exit with: nil while it runs and when it was cancelled without
// a cause of its own (SIGTERM).
func StopCause(ctx context.Context) error {
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
