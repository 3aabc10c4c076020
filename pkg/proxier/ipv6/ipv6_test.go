package ipv6

import (
	"context"
	"testing"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

type nopBackend struct{}

func (nopBackend) Sync(context.Context, *proxier.SyncRequest) (proxier.SyncResult, error) {
	return proxier.SyncResult{}, nil
}
func (nopBackend) Cleanup(context.Context) error { return nil }

// TestNewBindsFamily: the proxier New returns is for IPv6 whatever family the
// configuration names (none, or IPv4).
func TestNewBindsFamily(t *testing.T) {
	for _, f := range []*family.Family{nil, family.IPv4} {
		p, err := New(proxier.Config{Family: f, NodeName: "n", Backend: nopBackend{}})
		if err != nil {
			t.Fatal(err)
		}
		if p.Family() != family.IPv6 || Family != family.IPv6 {
			t.Errorf("config family %v: proxier family %v, package Family %v; want %v", f, p.Family(), Family, family.IPv6)
		}
	}
}
