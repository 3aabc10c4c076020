package nodeip

import (
	"errors"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/dsproxy/dsproxy/pkg/family"
)

func FuzzParseNodeIP(f *testing.F) {
	for _, s := range []string{"", "1.2.3.4", "abcd::5678", "0.0.0.0", "::", "IPv4", "ipv6", "IPv6,5.6.7.8",
		"1.2.3.4,abcd::1234", "IPv4,IPv6", "1.2.3.4,5.6.7.8", "::ffff:1.2.3.4", "fe80::1%eth0", " 1.2.3.4 ,", "a,b,c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		spec, err := ParseNodeIP(s)
		if err != nil {
			if spec != (Spec{}) {
				t.Fatalf("error %v with non-zero spec %v", err, spec)
			}
			return
		}
		again, err := ParseNodeIP(spec.String())
		if err != nil || again != spec {
			t.Fatalf("%q: String %q re-parses to %v, %v", s, spec, again, err)
		}
		els := spec.Elements()
		if len(els) > 2 || (len(els) == 2 && els[0].Family == els[1].Family) {
			t.Fatalf("%q: elements %v", s, els)
		}
		for _, e := range els {
			if e.Family == nil || (e.Kind == KindAny && len(els) != 1) || (e.Kind != KindFamily && !e.Family.Contains(e.Addr)) {
				t.Fatalf("%q: bad element %#v", s, e)
			}
			if e.Addr.Zone() != "" || e.Addr.Is4In6() {
				t.Fatalf("%q: element address %v", s, e.Addr)
			}
		}
	})
}

// FuzzSelect takes a --node-ip value and an address list written as
// "I=ip;E=ip;H=name;...".
func FuzzSelect(f *testing.F) {
	f.Add("", "I=1.2.3.4;I=5.6.7.8;I=abcd::1234;I=abcd::5678")
	f.Add("fd00::1", "I=10.0.0.1;I=10.0.0.2;I=fd00::1;I=fd00::2;E=192.168.0.1")
	f.Add("192.168.0.1,IPv6", "I=10.0.0.1;I=::ffff:10.0.0.1;E=192.168.0.1;E=fd00::1;H=x;I=junk")
	f.Add("::", "E=1.2.3.4;I=1.2.3.4;I=fe80::1%eth0;I=fd00::1")
	f.Fuzz(func(t *testing.T, nodeIP, list string) {
		spec, err := ParseNodeIP(nodeIP)
		if err != nil {
			return
		}
		var in []v1.NodeAddress
		for _, item := range strings.Split(list, ";") {
			typ, addr, _ := strings.Cut(item, "=")
			types := map[string]v1.NodeAddressType{"I": v1.NodeInternalIP, "E": v1.NodeExternalIP, "H": v1.NodeHostName}
			in = append(in, v1.NodeAddress{Type: types[typ], Address: addr})
		}
		parsed, _ := ParseAddresses(in)
		for _, mode := range []Mode{NoCloud, ExternalCloud} {
			ips, err := Select(parsed, spec, mode)
			checkSelection(t, parsed, spec, ips, err)
			node := &v1.Node{Status: v1.NodeStatus{Addresses: in}}
			if _, err := NodeIPs(node, spec, Options{Mode: mode}); err != nil && !isSelectionError(err) {
				t.Fatalf("NodeIPs: unexpected error %v", err)
			}
		}
	})
}

func isSelectionError(err error) bool {
	return errors.Is(err, ErrNoAddresses) || errors.Is(err, ErrNodeIPNotFound) || errors.Is(err, ErrNoFamilyAddress)
}

func checkSelection(t *testing.T, in []Address, spec Spec, ips IPs, err error) {
	t.Helper()
	if err != nil {
		if !isSelectionError(err) {
			t.Fatalf("unexpected error %v", err)
		}
		return
	}
	for i, a := range ips.Addresses {
		if !slices.Contains(in, a) || slices.Contains(ips.Addresses[:i], a) {
			t.Fatalf("output %v: %v repeated or not in input %v", ips.Addresses, a, in)
		}
	}
	has := func(a Address) bool { return a.Addr == ips.Primary }
	if !ips.Primary.IsValid() || !slices.ContainsFunc(ips.Addresses, has) {
		t.Fatalf("primary %v not in output %v", ips.Primary, ips.Addresses)
	}
	if s := ips.Secondary; s.IsValid() && (family.Of(s) == family.Of(ips.Primary) ||
		!slices.ContainsFunc(ips.Addresses, func(a Address) bool { return a.Addr == s })) {
		t.Fatalf("secondary %v bad (primary %v, output %v)", s, ips.Primary, ips.Addresses)
	}
	for _, e := range spec.Elements() {
		if e.Kind == KindAddr && ips.For(e.Family) != e.Addr {
			t.Fatalf("spec %q: node IP of %s is %v", spec, e.Family, ips.For(e.Family))
		}
	}
	if h := ips.HostIPs(); len(h) == 0 || len(h) > 2 || h[0] != ips.Primary {
		t.Fatalf("HostIPs %v, primary %v", h, ips.Primary)
	}
}
