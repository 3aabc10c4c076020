// Package testaddr gives tests one table of cases for both families: each helper
// returns the n-th address of a role (service, pod, external, node) in a family, so a
// case written once runs over IPv4 and IPv6.
package testaddr

import (
	"fmt"
	"net/netip"

	"github.com/dsproxy/dsproxy/pkg/family"
)

type ranges struct{ svc, pod, ext, node, client string }

var byFamily = map[*family.Family]ranges{
	family.IPv4: {svc: "10.96.0.%d", pod: "10.64.0.%d", ext: "203.0.113.%d", node: "192.0.2.%d", client: "198.51.100.%d"},
	family.IPv6: {svc: "fd00:96::%x", pod: "fd00:64::%x", ext: "2001:db8:e::%x", node: "2001:db8:2::%x", client: "2001:db8:c::%x"},
}

func mk(format string, n int) netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf(format, n))
}

// Svc returns the n-th service address (10.96.0.n, fd00:96::n).
func Svc(f *family.Family, n int) netip.Addr { return mk(byFamily[f].svc, n) }

// Pod returns the n-th pod address (10.64.0.n, fd00:64::n).
func Pod(f *family.Family, n int) netip.Addr { return mk(byFamily[f].pod, n) }

// Ext returns the n-th external / load-balancer address (203.0.113.n, 2001:db8:e::n).
func Ext(f *family.Family, n int) netip.Addr { return mk(byFamily[f].ext, n) }

// Node returns the n-th node address (192.0.2.n, 2001:db8:2::n).
func Node(f *family.Family, n int) netip.Addr { return mk(byFamily[f].node, n) }

// Client returns the n-th outside client address (198.51.100.n, 2001:db8:c::n).
func Client(f *family.Family, n int) netip.Addr { return mk(byFamily[f].client, n) }

// PodCIDR returns the pod range holding Pod addresses (10.64.0.0/16, fd00:64::/64).
func PodCIDR(f *family.Family) netip.Prefix {
	return netip.PrefixFrom(Pod(f, 0), map[int]int{32: 16, 128: 64}[f.BitLen]).Masked()
}

// Prefix returns a /bits prefix around a.
func Prefix(a netip.Addr, bits int) netip.Prefix { return netip.PrefixFrom(a, bits).Masked() }

// Plus returns a + n, for more addresses of a role than one byte numbers (n
// carries into the higher bytes, in either family).
func Plus(a netip.Addr, n int) netip.Addr {
	b := a.AsSlice()
	for i := len(b) - 1; i >= 0 && n > 0; i-- {
		sum := int(b[i]) + n%256
		b[i], n = byte(sum), n/256+sum/256
	}
	out, _ := netip.AddrFromSlice(b)
	return out
}
