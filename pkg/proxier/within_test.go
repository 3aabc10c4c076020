package proxier

import (
	"context"
	"errors"
	"testing"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// flushingBackend is a recordingBackend that reports a flush when told to.
type flushingBackend struct {
	recordingBackend
	flushed bool
}

func (b *flushingBackend) Flushed(context.Context) bool { return b.flushed }

func TestWithin(t *testing.T) {
	b := &flushingBackend{}
	runs := 0
	w := Within(b, func(fn func() error) error { runs++; return fn() })
	if _, err := w.Sync(context.Background(), &SyncRequest{Full: true}); err != nil || len(b.reqs) != 1 {
		t.Fatalf("Sync through Within: %v, %d backend calls", err, len(b.reqs))
	}
	b.flushed = true
	if !w.(FlushDetector).Flushed(context.Background()) {
		t.Error("Flushed not forwarded")
	}
	if err := w.Cleanup(context.Background()); err != nil {
		t.Error(err)
	}
	if runs != 3 {
		t.Errorf("run called %d times, want one per call (3)", runs)
	}
	broken := Within(&flushingBackend{}, func(func() error) error { return errors.New("setns") })
	if _, err := broken.Sync(context.Background(), &SyncRequest{}); err == nil {
		t.Error("Sync succeeded although run failed")
	}
	if !broken.(FlushDetector).Flushed(context.Background()) {
		t.Error("Flushed false although run failed; a full sync is the safe answer")
	}
	if Within(&recordingBackend{}, func(fn func() error) error { return fn() }).(FlushDetector).Flushed(context.Background()) {
		t.Error("a backend without FlushDetector reported a flush")
	}
}

// A sync with nothing to do asks a FlushDetector backend, and turns into a full
// sync when it reports a flush.
func TestNothingToDoChecksForFlush(t *testing.T) {
	f := family.IPv4
	p, _ := newTestProxier(t, f, nil)
	b := &flushingBackend{}
	p.cfg.Backend = b
	if err := p.Sync(context.Background(), true); err != nil {
		t.Fatal(err)
	}
	if err := p.Sync(context.Background(), false); err != nil || len(b.reqs) != 1 {
		t.Fatalf("a sync with nothing to do called the backend (%d calls, %v)", len(b.reqs), err)
	}
	b.flushed = true
	if err := p.Sync(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if len(b.reqs) != 2 || !b.reqs[1].Full {
		t.Fatalf("after a flush: %d backend calls, last %+v; want a full sync", len(b.reqs), b.reqs[len(b.reqs)-1])
	}
}
