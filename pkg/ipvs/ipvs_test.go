package ipvs

import (
	"net/netip"
	"testing"

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
