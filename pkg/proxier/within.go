package proxier

import "context"

// Within returns a Backend that makes each call of b (including
// FlushDetector.Flushed, when b has it) inside run: run calls its argument, for
// example on a thread it moved into another network namespace, so that the
// commands a backend starts (iptables-restore) and the sysctls it writes are that
// namespace's. Tests and benchmarks use it; the daemon runs in its node's namespace.
func Within(b Backend, run func(func() error) error) Backend {
	return within{b: b, run: run}
}

type within struct {
	b   Backend
	run func(func() error) error
}

var _ FlushDetector = within{}

func (w within) Sync(ctx context.Context, req *SyncRequest) (res SyncResult, err error) {
	err = w.run(func() error {
		var serr error
		res, serr = w.b.Sync(ctx, req)
		return serr
	})
	return res, err
}

func (w within) Flushed(ctx context.Context) bool {
	d, ok := w.b.(FlushDetector)
	if !ok {
		return false
	}
	flushed := true // when run fails, a full sync is the safe answer
	_ = w.run(func() error { flushed = d.Flushed(ctx); return nil })
	return flushed
}

func (w within) Cleanup(ctx context.Context) error {
	return w.run(func() error { return w.b.Cleanup(ctx) })
}
