package family

import (
	"fmt"
	"testing"
)

// Addresses and CIDRs of API objects are read as kube-proxy reads them: objects
// stored before v1.36's StrictIPCIDRValidation may hold leading zeros and
// IPv4-mapped forms.
func TestParseIPAndCIDR(t *testing.T) {
	ips := map[string]string{
		"10.1.2.3":         "10.1.2.3",
		"010.001.002.003":  "10.1.2.3",
		"::ffff:1.2.3.5":   "1.2.3.5",
		"fd00::1":          "fd00::1",
		"FD00:0::0001":     "fd00::1",
		"fe80::1%eth0":     "",
		"1.2.3":            "",
		"":                 "",
		"256.1.1.1":        "",
		"10.1.2.3/32":      "",
		"::ffff:010.1.2.3": "10.1.2.3",
	}
	checkParse(t, "ParseIP", ips, func(s string) (fmt.Stringer, bool) { return ParseIP(s) })
	if _, ok := IPv6.ParseAddr("::ffff:1.2.3.5"); ok {
		t.Error("an IPv4-mapped address parsed as IPv6")
	}
	if a, ok := IPv4.ParseAddr("010.000.001.001"); !ok || a.String() != "10.0.1.1" {
		t.Errorf("IPv4.ParseAddr(010.000.001.001) = %v, %v", a, ok)
	}
	cidrs := map[string]string{
		"10.0.0.0/8":           "10.0.0.0/8",
		"010.0.0.0/8":          "10.0.0.0/8",
		"10.1.2.3/8":           "10.0.0.0/8",
		"::ffff:10.0.0.0/104":  "10.0.0.0/8",
		"::ffff:0.0.0.0/96":    "0.0.0.0/0",
		"::ffff:0:0/95":        "::fffe:0:0/95", // wider than the mapped range: IPv6
		"fd00::1/64":           "fd00::/64",
		"0.0.0.0/0":            "0.0.0.0/0",
		"10.0.0.0/33":          "",
		"10.0.0.0":             "",
		"fe80::%eth0/64":       "",
		"not a cidr":           "",
		"010.000.000.000/008":  "10.0.0.0/8",
		"2001:db8::/129":       "",
		"::ffff:192.0.2.7/128": "192.0.2.7/32",
	}
	checkParse(t, "ParseCIDR", cidrs, func(s string) (fmt.Stringer, bool) { return ParseCIDR(s) })
}

// checkParse checks that parse reads each input as its want ("": refused).
func checkParse(t *testing.T, name string, cases map[string]string, parse func(string) (fmt.Stringer, bool)) {
	t.Helper()
	for in, want := range cases {
		v, ok := parse(in)
		got := ""
		if ok {
			got = v.String()
		}
		if got != want {
			t.Errorf("%s(%q) = %q (%v), want %q", name, in, got, ok, want)
		}
	}
}
