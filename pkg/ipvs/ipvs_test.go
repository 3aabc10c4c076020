package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// The virtual server's flags as kube-proxy sets them: persistence for ClientIP
// affinity, and the mh scheduler hashing the source port too.
func TestServiceFlags(t *testing.T) {
	key := Key{Addr: netip.MustParseAddr("10.96.0.1"), Proto: 6, Port: 80}
	for _, c := range []struct {
		s    Service
		want uint32
	}{
		{Service{Key: key, Scheduler: "rr"}, 0},
		{Service{Key: key, Scheduler: "rr", Persistent: true, Timeout: 60}, 0x1},
		{Service{Key: key, Scheduler: "mh", HashPort: true}, 0x10},
		{Service{Key: key, Scheduler: "mh", HashPort: true, Persistent: true, Timeout: 60}, 0x11},
	} {
		k := &Kernel{f: family.IPv4}
		if got := k.mipvsService(c.s).Flags; got != c.want {
			t.Errorf("%+v: flags %#x, want %#x", c.s, got, c.want)
		}
	}
}

// RetryDump reads a table again while the kernel says it changed under the
// read, up to dumpAttempts times, and passes any other answer through at once.
func TestRetryDump(t *testing.T) {
	interrupted := fmt.Errorf("addresses: %w", netlink.ErrDumpInterrupted)
	other := errors.New("EPERM")
	for _, c := range []struct {
		name      string
		answers   []error // the dump's error on each call; the last repeats
		wantCalls int
		wantErr   error
	}{
		{"clean", []error{nil}, 1, nil},
		{"interrupted twice", []error{interrupted, interrupted, nil}, 3, nil},
		{"always interrupted", []error{interrupted}, dumpAttempts, netlink.ErrDumpInterrupted},
		{"other error", []error{other}, 1, other},
	} {
		calls := 0
		v, err := RetryDump(func() (int, error) {
			calls++
			return calls, c.answers[min(calls, len(c.answers))-1]
		})
		if calls != c.wantCalls || v != calls || !errors.Is(err, c.wantErr) || (c.wantErr == nil) != (err == nil) {
			t.Errorf("%s: %d calls, answer %d, %v; want %d calls, the last answer, %v", c.name, calls, v, err, c.wantCalls, c.wantErr)
		}
	}
}
