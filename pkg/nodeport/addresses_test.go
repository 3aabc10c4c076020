package nodeport

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// Family-specific address data. Case values refer to it as {name} for the family under
// test and {o:name} for the other one.
var addrData = map[*family.Family]map[string]string{
	family.IPv4: {
		"loopback": "127.0.0.1", "loopback2": "127.0.0.53", "node": "10.0.0.5", "second": "192.168.1.5",
		"linklocal": "169.254.1.1", "notlocal": "10.9.9.9",
		"net1": "10.0.0.0/8", "net1sloppy": "10.1.2.3/8", "net2": "192.168.0.0/16", "any": "0.0.0.0/0",
		"loopnet": "127.0.0.0/8", "nodehost": "10.0.0.5/32",
	},
	family.IPv6: {
		"loopback": "::1", "loopback2": "::1", "node": "2001:db8::5", "second": "fd00::5",
		"linklocal": "fe80::1", "notlocal": "2001:db8::99",
		"net1": "2001:db8::/32", "net1sloppy": "2001:db8:1::1/32", "net2": "fd00::/8", "any": "::/0",
		"loopnet": "::1/128", "nodehost": "2001:db8::5/128",
	},
}

func expand(f *family.Family, s string) string {
	var args []string
	for k, v := range addrData[f] {
		args = append(args, "{"+k+"}", v)
	}
	for k, v := range addrData[f.Other()] {
		args = append(args, "{o:"+k+"}", v)
	}
	return strings.NewReplacer(args...).Replace(s)
}

// fakeLister returns every address of addrData, plus an IPv4-mapped and a zoned form.
var fakeLister = AddrListerFunc(func() ([]netip.Addr, error) {
	var out []netip.Addr
	for _, f := range family.All {
		for _, k := range []string{"loopback", "loopback2", "node", "second", "linklocal"} {
			out = append(out, netip.MustParseAddr(addrData[f][k]))
		}
	}
	return append(out,
		netip.AddrFrom16(netip.MustParseAddr(addrData[family.IPv4]["second"]).As16()),
		netip.MustParseAddr(addrData[family.IPv6]["linklocal"]+"%eth0"),
		netip.Addr{}), nil
})

func TestNodePortAddresses(t *testing.T) {
	tests := []struct {
		name      string
		values    []string
		primary   string // node's primary IP of the family under test
		wantSpec  string // Spec.String() for the family under test
		wantOther string // and for the other family
		// Resolve for the family under test:
		wantMatchAll bool
		wantAddrs    []string
		wantLoopback []string
	}{{
		name: "unset: all local addresses, never loopback", wantSpec: "all", wantOther: "all",
		wantMatchAll: true, wantAddrs: []string{"{node}", "{second}"},
	}, {
		name: "a CIDR of the family", values: []string{"{net1}"}, wantSpec: "{net1}", wantOther: "all",
		wantAddrs: []string{"{node}"},
	}, {
		name: "only the other family's CIDRs leave this family unrestricted", values: []string{"{o:net1}"},
		wantSpec: "all", wantOther: "{o:net1}",
		wantMatchAll: true, wantAddrs: []string{"{node}", "{second}"},
	}, {
		name: "CIDRs of both families, repeated, unmasked", values: []string{"{net2}", "{o:net1}", "{net1sloppy}", " {net2} "},
		wantSpec: "{net1},{net2}", wantOther: "{o:net1}",
		wantAddrs: []string{"{node}", "{second}"},
	}, {
		name: "a zero-length CIDR overrides the others", values: []string{"{net1}", "{any}"},
		wantSpec: "all", wantOther: "all",
		wantMatchAll: true, wantAddrs: []string{"{node}", "{second}"},
	}, {
		name: "a host CIDR", values: []string{"{nodehost}"}, wantSpec: "{nodehost}", wantOther: "all",
		wantAddrs: []string{"{node}"},
	}, {
		name: "a loopback CIDR matches loopback addresses, reported apart", values: []string{"{loopnet}"},
		wantSpec: "{loopnet}", wantOther: "all",
		wantLoopback: []string{"{loopback}", "{loopback2}"},
	}, {
		name: "primary", values: []string{"primary"}, primary: "{node}", wantSpec: "primary", wantOther: "primary",
		wantAddrs: []string{"{node}"},
	}, {
		name: "primary that is not local matches nothing", values: []string{"primary"}, primary: "{notlocal}",
		wantSpec: "primary", wantOther: "primary",
	}, {
		name: "primary unknown: all, as kube-proxy", values: []string{"primary"}, wantSpec: "primary", wantOther: "primary",
		wantMatchAll: true, wantAddrs: []string{"{node}", "{second}"},
	}, {
		name: "primary loopback (kube-proxy's no node IP): all", values: []string{"primary"}, primary: "{loopback}",
		wantSpec: "primary", wantOther: "primary",
		wantMatchAll: true, wantAddrs: []string{"{node}", "{second}"},
	}, {
		name: "primary of the other family: all", values: []string{"primary"}, primary: "{o:node}",
		wantSpec: "primary", wantOther: "primary",
		wantMatchAll: true, wantAddrs: []string{"{node}", "{second}"},
	}}
	for _, tc := range tests {
		for _, f := range family.All {
			t.Run(tc.name+"/"+f.Name, func(t *testing.T) {
				var values []string
				for _, v := range tc.values {
					values = append(values, expand(f, v))
				}
				specs, err := ParseAddresses(values)
				if err != nil {
					t.Fatalf("ParseAddresses(%q): %v", values, err)
				}
				s := specs[f]
				if s.Family != f || s.String() != expand(f, tc.wantSpec) {
					t.Errorf("spec for %v = %v %q, want %q", f, s.Family, s, expand(f, tc.wantSpec))
				}
				if got := specs[f.Other()]; got.Family != f.Other() || got.String() != expand(f, tc.wantOther) {
					t.Errorf("spec for %v = %v %q, want %q", f.Other(), got.Family, got, expand(f, tc.wantOther))
				}
				var primary netip.Addr
				if tc.primary != "" {
					primary = netip.MustParseAddr(expand(f, tc.primary))
				}
				got, err := s.Resolve(fakeLister, primary)
				if err != nil {
					t.Fatalf("Resolve: %v", err)
				}
				if got.Family != f || got.MatchAll != tc.wantMatchAll {
					t.Errorf("Resolve: family %v MatchAll %v, want %v %v", got.Family, got.MatchAll, f, tc.wantMatchAll)
				}
				checkAddrs(t, "Addrs", got.Addrs, f, tc.wantAddrs)
				checkAddrs(t, "Loopback", got.Loopback, f, tc.wantLoopback)
			})
		}
	}
}

func checkAddrs(t *testing.T, what string, got []netip.Addr, f *family.Family, want []string) {
	t.Helper()
	var w []netip.Addr
	for _, s := range want {
		w = append(w, netip.MustParseAddr(expand(f, s)))
	}
	slices.SortFunc(w, netip.Addr.Compare)
	w = slices.Compact(w)
	if !slices.Equal(got, w) {
		t.Errorf("%s = %v, want %v", what, got, w)
	}
}

func TestParseAddressesErrors(t *testing.T) {
	tests := []struct {
		values  []string
		wantErr string
	}{
		{[]string{"primary", "{net1}"}, `"primary" can't be combined`},
		{[]string{"{net1}", "primary"}, `"primary" can't be combined`},
		{[]string{"primary", "primary"}, `"primary" can't be combined`},
		{[]string{"{node}"}, `"{node}" is not a valid CIDR`},
		{[]string{"{net1}", "garbage"}, `"garbage" is not a valid CIDR`},
		{[]string{"Primary"}, `"Primary" is not a valid CIDR`},
		{[]string{"{net1}/"}, `"{net1}/" is not a valid CIDR`},
		{[]string{""}, "empty value"},
		{[]string{"  "}, "empty value"},
		{[]string{"::ffff:10.0.0.0/104"}, `"::ffff:10.0.0.0/104" is an IPv4-mapped`},
		{[]string{"fe80::%eth0/64"}, `"fe80::%eth0/64" is not a valid CIDR`},
		{[]string{"010.0.0.0/8"}, `"010.0.0.0/8" is not a valid CIDR`},
		{[]string{"10.0.0.0/33"}, `"10.0.0.0/33" is not a valid CIDR`},
	}
	for _, tc := range tests {
		for _, f := range family.All {
			var values []string
			for _, v := range tc.values {
				values = append(values, expand(f, v))
			}
			specs, err := ParseAddresses(values)
			if want := expand(f, tc.wantErr); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("ParseAddresses(%q) = %v, %v; want error containing %q", values, specs, err, want)
			}
		}
	}
}

func TestResolveErrors(t *testing.T) {
	errBoom := errors.New("netlink: boom")
	for _, f := range family.All {
		specs, err := ParseAddresses(nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = specs[f].Resolve(AddrListerFunc(func() ([]netip.Addr, error) { return nil, errBoom }), netip.Addr{})
		if !errors.Is(err, errBoom) || !strings.Contains(err.Error(), f.Name) {
			t.Errorf("%v: Resolve with a failing lister = %v, want it wrapped and naming the family", f, err)
		}
		if _, err := specs[f].Resolve(nil, netip.Addr{}); err == nil {
			t.Errorf("%v: Resolve(nil lister) succeeded", f)
		}
	}
	if _, err := (Spec{}).Resolve(fakeLister, netip.Addr{}); err == nil {
		t.Error("Resolve of a Spec without family succeeded")
	}
}

func TestSystemAddrs(t *testing.T) {
	addrs, err := SystemAddrs{}.InterfaceAddrs()
	if err != nil {
		t.Skipf("no interface addresses here: %v", err)
	}
	for _, a := range addrs {
		if !a.IsValid() || a.Is4In6() || a.Zone() != "" {
			t.Errorf("InterfaceAddrs returned %v", a)
		}
	}
	for _, f := range family.All {
		if _, err := (Spec{Family: f}).Resolve(SystemAddrs{}, netip.Addr{}); err != nil {
			t.Errorf("Resolve(%v, SystemAddrs): %v", f, err)
		}
	}
}
