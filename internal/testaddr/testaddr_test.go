package testaddr

import (
	"net/netip"
	"testing"
)

func TestPlus(t *testing.T) {
	for _, c := range []struct {
		a    string
		n    int
		want string
	}{
		{"203.0.113.0", 0, "203.0.113.0"},
		{"203.0.113.0", 255, "203.0.113.255"},
		{"203.0.113.0", 2499, "203.0.122.195"},
		{"198.51.100.0", 65535, "198.52.99.255"},
		{"2001:db8:e::", 2000, "2001:db8:e::7d0"},
		{"2001:db8:e::ffff", 1, "2001:db8:e::1:0"},
	} {
		if got := Plus(netip.MustParseAddr(c.a), c.n); got != netip.MustParseAddr(c.want) {
			t.Errorf("Plus(%s, %d) = %s, want %s", c.a, c.n, got, c.want)
		}
	}
}
