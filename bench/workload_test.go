package bench

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// The generated addresses must be distinct, or the endpoint cache merges them and
// the benchmarks measure less work than they claim.
func TestWorkloadAddressesAreDistinct(t *testing.T) {
	for _, f := range family.All {
		seen := map[netip.Addr]bool{}
		for i := 0; i < 30000; i += 7 {
			for j := 0; j < 12; j++ {
				a := EndpointIP(f, i, j)
				if seen[a] || !f.Contains(a) {
					t.Fatalf("%s: endpoint %d/%d address %s repeated or of the wrong family", f, i, j, a)
				}
				seen[a] = true
			}
			if s := ServiceIP(f, i); seen[s] || !f.Contains(s) {
				t.Fatalf("%s: service address %s clashes", f, s)
			}
		}
	}
	if got := ServiceIP(family.IPv6, 1).String(); got != "fd00:96::1" {
		t.Fatalf("ServiceIP(IPv6, 1) = %s", got)
	}
	if got := EndpointIP(family.IPv6, 0, 1).String(); got != "fd00:64::1" {
		t.Fatalf("EndpointIP(IPv6, 0, 1) = %s", got)
	}
}

func TestEndpointCount(t *testing.T) {
	w := Workload{Services: 8, EndpointsPerFamily: 10}
	for i := range w.Services {
		if got := w.EndpointCount(i); got != 10 {
			t.Errorf("no spread: service %d has %d endpoints, want 10", i, got)
		}
	}
	w.CountSpread = 3
	var got []int
	for i := range w.Services {
		got = append(got, w.EndpointCount(i))
	}
	if want := []int{1, 2, 3, 1, 2, 3, 1, 2}; !slices.Equal(got, want) {
		t.Errorf("spread 3: counts %v, want %v", got, want)
	}
}
