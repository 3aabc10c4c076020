package nodeip

import (
	"strings"
	"testing"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// sample holds per-family strings for family-generic tables.
type sample struct{ a1, a2, any, kw string }

var samples = map[*family.Family]sample{
	family.IPv4: {a1: "10.0.0.1", a2: "10.0.0.2", any: "0.0.0.0", kw: "IPv4"},
	family.IPv6: {a1: "fd00::1", a2: "fd00::2", any: "::", kw: "IPv6"},
}

// expand replaces {a1} {a2} {any} {kw} with f's sample and {b1} {bany} {bkw} with
// the other family's.
func expand(s string, f *family.Family) string {
	me, other := samples[f], samples[f.Other()]
	return strings.NewReplacer("{a1}", me.a1, "{a2}", me.a2, "{any}", me.any, "{kw}", me.kw,
		"{b1}", other.a1, "{bany}", other.any, "{bkw}", other.kw, "{f}", f.Name).Replace(s)
}

func TestParseNodeIPBothFamilies(t *testing.T) {
	tests := []struct {
		in      string
		kinds   []Kind // nil when an error is expected
		wantErr string // substring
	}{
		{in: "{a1}", kinds: []Kind{KindAddr}},
		{in: "{any}", kinds: []Kind{KindAny}},
		{in: "{kw}", kinds: []Kind{KindFamily}},
		{in: "{a1},{b1}", kinds: []Kind{KindAddr, KindAddr}},
		{in: "{kw},{b1}", kinds: []Kind{KindFamily, KindAddr}},
		{in: "{b1},{kw}", kinds: []Kind{KindAddr, KindFamily}},
		{in: "{kw},{bkw}", kinds: []Kind{KindFamily, KindFamily}},
		{in: "{a1},{a2}", wantErr: `"{a1}" and "{a2}" are both {f}; a dual-stack pair needs one IPv4 and one IPv6 value`},
		{in: "{kw},{a1}", wantErr: `"{kw}" and "{a1}" are both {f}`},
		{in: "{kw},{kw}", wantErr: `"{kw}" and "{kw}" are both {f}`},
		{in: "{any},{b1}", wantErr: `"{any}" (any {f} address) is only allowed on its own; use "{kw}" in a dual-stack pair`},
		{in: "{bkw},{any}", wantErr: `"{any}" (any {f} address) is only allowed on its own`},
		{in: "{any},{bany}", wantErr: `only allowed on its own`},
	}
	for _, f := range family.All {
		for _, tt := range tests {
			in := expand(tt.in, f)
			t.Run(f.Name+"/"+in, func(t *testing.T) {
				spec, err := ParseNodeIP(in)
				if tt.wantErr != "" {
					if want := expand(tt.wantErr, f); err == nil || !strings.Contains(err.Error(), want) {
						t.Fatalf("ParseNodeIP(%q) = %v, %v; want error containing %q", in, spec, err, want)
					}
					return
				}
				if err != nil {
					t.Fatalf("ParseNodeIP(%q): %v", in, err)
				}
				if spec.String() != in {
					t.Errorf("String() = %q, want %q", spec, in)
				}
				els := spec.Elements()
				if len(els) != len(tt.kinds) {
					t.Fatalf("elements %v, want %d", els, len(tt.kinds))
				}
				for i, e := range els {
					if e.Kind != tt.kinds[i] {
						t.Errorf("element %d kind %d, want %d", i, e.Kind, tt.kinds[i])
					}
					if got, ok := spec.For(e.Family); !ok || got != e {
						t.Errorf("For(%s) = %v, %v; want %v", e.Family, got, ok, e)
					}
				}
			})
		}
	}
}

func TestParseNodeIP(t *testing.T) {
	tests := []struct {
		in, want string // want is String() on success
		wantErr  string // substring
	}{
		{in: "", want: ""},
		{in: " 1.2.3.4 , abcd::1 ", want: "1.2.3.4,abcd::1"},
		{in: "ABCD::0001", want: "abcd::1"},
		{in: "ipv6,5.6.7.8", want: "IPv6,5.6.7.8"},
		{in: "IPv4,abcd::ef01", want: "IPv4,abcd::ef01"},
		{in: "1.2.3.4,abcd::1,IPv4", wantErr: `invalid --node-ip "1.2.3.4,abcd::1,IPv4": 3 values; at most 2`},
		{in: "1.2.3.4,", wantErr: `invalid --node-ip "1.2.3.4,": value 2: empty value`},
		{in: ",abcd::1", wantErr: `value 1: empty value`},
		{in: " ", wantErr: `value 1: empty value`},
		{in: "garbage", wantErr: `"garbage" is neither an IP address nor IPv4/IPv6: ParseAddr`},
		{in: "IPv5", wantErr: `"IPv5" is neither an IP address nor IPv4/IPv6`},
		{in: "1.2.3.4/24", wantErr: `"1.2.3.4/24" is neither an IP address`},
		{in: "01.2.3.4", wantErr: `"01.2.3.4" is neither an IP address`},
		{in: "1.2.3.4,fe80::1%eth0", wantErr: `value 2: "fe80::1%eth0" has a zone`},
		{in: "::ffff:1.2.3.4", wantErr: `"::ffff:1.2.3.4" is an IPv4-mapped IPv6 address; write "1.2.3.4"`},
		{in: "127.0.0.1", wantErr: `"127.0.0.1": a loopback address cannot be a node IP`},
		{in: "::1", wantErr: `"::1": a loopback address`},
		{in: "169.254.0.5", wantErr: `"169.254.0.5": a link-local address`},
		{in: "fe80::1", wantErr: `"fe80::1": a link-local address`},
		{in: "224.0.0.1", wantErr: `"224.0.0.1": a multicast address`},
		{in: "ff02::1", wantErr: `"ff02::1": a multicast address`},
		{in: "255.255.255.255", wantErr: `a non-unicast address`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			spec, err := ParseNodeIP(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseNodeIP(%q) = %v, %v; want error containing %q", tt.in, spec, err, tt.wantErr)
				}
				return
			}
			if err != nil || spec.String() != tt.want {
				t.Fatalf("ParseNodeIP(%q) = %q, %v; want %q", tt.in, spec, err, tt.want)
			}
		})
	}
}

func TestParseNodeIPUnset(t *testing.T) {
	spec, err := ParseNodeIP("")
	if err != nil || !spec.IsZero() || spec != (Spec{}) || len(spec.Elements()) != 0 {
		t.Fatalf("ParseNodeIP(\"\") = %#v, %v; want the zero Spec", spec, err)
	}
}
