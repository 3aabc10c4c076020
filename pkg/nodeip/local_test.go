package nodeip

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
)

func TestLocalAddresses(t *testing.T) {
	a := netip.MustParseAddr
	lister := &fakeLister{addrs: []InterfaceAddr{
		{Index: 5, Name: "cni0", Addr: a("10.244.0.1")},
		{Index: 3, Name: "eth1", Addr: a("fd00::2")},
		{Index: 1, Name: "lo", Addr: a("127.0.0.1")},
		{Index: 1, Name: "lo", Addr: a("::1")},
		{Index: 2, Name: "eth0", Addr: a("fe80::1")},
		{Index: 2, Name: "eth0", Addr: a("169.254.10.1")},
		{Index: 2, Name: "eth0", Addr: a("fe80::2%eth0")},
		{Index: 2, Name: "eth0", Addr: a("224.0.0.1")},
		{Index: 2, Name: "eth0", Addr: a("0.0.0.0")},
		{Index: 2, Name: "eth0", Addr: a("2001:db8::9")},
		{Index: 2, Name: "eth0", Addr: a("::ffff:192.168.1.20")},
		{Index: 2, Name: "eth0", Addr: a("192.168.1.10")},
		{Index: 3, Name: "eth1", Addr: a("192.168.1.10")}, // repeated on another interface
		{Index: 3, Name: "eth1", Addr: a("172.16.0.1")},
		{Index: 2, Name: "eth0", Addr: netip.Addr{}},
	}}
	got, err := LocalAddresses(lister)
	if err != nil {
		t.Fatal(err)
	}
	want := "[192.168.1.10 (InternalIP) 192.168.1.20 (InternalIP) 172.16.0.1 (InternalIP) 10.244.0.1 (InternalIP) " +
		"2001:db8::9 (InternalIP) fd00::2 (InternalIP)]"
	if fmt.Sprint(got) != want {
		t.Errorf("LocalAddresses = %v\nwant %s", got, want)
	}
	// Deterministic: the same set in another order gives the same result.
	rev := &fakeLister{}
	for i := len(lister.addrs) - 1; i >= 0; i-- {
		rev.addrs = append(rev.addrs, lister.addrs[i])
	}
	if got2, _ := LocalAddresses(rev); fmt.Sprint(got2) != want {
		t.Errorf("reversed input: %v", got2)
	}
}

func TestLocalAddressesError(t *testing.T) {
	_, err := LocalAddresses(&fakeLister{err: errBoom})
	if !errors.Is(err, errBoom) {
		t.Errorf("err = %v, want wrapping %v", err, errBoom)
	}
}

// HostInterfaces runs against this host: whatever it has, the candidates must be
// usable, unmapped addresses.
func TestHostInterfaces(t *testing.T) {
	got, err := LocalAddresses(HostInterfaces{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range got {
		if a.Addr.Is4In6() || a.Addr.Zone() != "" || checkUsable(a.Addr) != nil {
			t.Errorf("unusable candidate %v", a)
		}
	}
	t.Logf("local candidates: %v", got)
}
