package proxier_test

import (
	"context"
	"testing"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/proxier"
	"github.com/dsproxy/dsproxy/pkg/proxier/ipv4"
	"github.com/dsproxy/dsproxy/pkg/proxier/ipv6"
)

type nopBackend struct{}

func (nopBackend) Sync(context.Context, *proxier.SyncRequest) (proxier.SyncResult, error) {
	return proxier.SyncResult{}, nil
}
func (nopBackend) Cleanup(context.Context) error { return nil }

// TestFamilyConstructors: pkg/proxier/ipv4 and ipv6 return a proxier of their
// own family whatever family the configuration names (none, or the other one).
func TestFamilyConstructors(t *testing.T) {
	for _, tc := range []struct {
		want *family.Family
		pkg  *family.Family // the package's Family
		new  func(proxier.Config) (*proxier.Proxier, error)
	}{
		{family.IPv4, ipv4.Family, ipv4.New},
		{family.IPv6, ipv6.Family, ipv6.New},
	} {
		for _, f := range []*family.Family{nil, family.IPv4, family.IPv6} {
			p, err := tc.new(proxier.Config{Family: f, NodeName: "n", Backend: nopBackend{}})
			if err != nil {
				t.Fatal(err)
			}
			if p.Family() != tc.want || tc.pkg != tc.want {
				t.Errorf("%s constructor, config family %v: proxier family %v, package Family %v", tc.want, f, p.Family(), tc.pkg)
			}
		}
	}
}
