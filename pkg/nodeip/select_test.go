package nodeip

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// addrs builds Addresses from "I:ip" (InternalIP) and "E:ip" (ExternalIP).
func addrs(t testing.TB, in ...string) []Address {
	t.Helper()
	var out []Address
	for _, s := range in {
		typ := map[string]v1.NodeAddressType{"I": v1.NodeInternalIP, "E": v1.NodeExternalIP}[s[:1]]
		out = append(out, Address{Type: typ, Addr: netip.MustParseAddr(s[2:])})
	}
	return out
}

// ofType builds Addresses of one type.
func ofType(t testing.TB, typ v1.NodeAddressType, ips ...string) []Address {
	t.Helper()
	var out []Address
	for _, ip := range ips {
		out = append(out, Address{Type: typ, Addr: netip.MustParseAddr(ip)})
	}
	return out
}

// stack renders IPs in the KEP tables' notation: "SS IPv4", "DS IPv6-primary".
func stack(ips IPs) string {
	switch {
	case !ips.Primary.IsValid():
		return ""
	case !ips.Secondary.IsValid():
		return "SS " + ips.PrimaryFamily().Name
	}
	return "DS " + ips.PrimaryFamily().Name + "-primary"
}

func ipStrings(as []Address) []string {
	out := []string{}
	for _, a := range as {
		out = append(out, a.Addr.String())
	}
	return out
}

type kepRow struct {
	nodeIP string
	want   []string // resulting node addresses; nil on error
	stack  string
	err    error
}

// runKEPRows checks rows against Select in ExternalCloud mode, the setting of the
// KEP-3705 examples.
func runKEPRows(t *testing.T, in []Address, rows []kepRow) {
	t.Helper()
	for _, r := range rows {
		t.Run(r.nodeIP, func(t *testing.T) {
			spec, err := ParseNodeIP(r.nodeIP)
			if err != nil {
				t.Fatal(err)
			}
			ips, err := Select(in, spec, ExternalCloud)
			if r.err != nil {
				if !errors.Is(err, r.err) {
					t.Fatalf("Select(%q) = %v, %v; want error %v", r.nodeIP, ipStrings(ips.Addresses), err, r.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Select(%q): %v", r.nodeIP, err)
			}
			if got := ipStrings(ips.Addresses); !slices.Equal(got, r.want) || stack(ips) != r.stack {
				t.Errorf("Select(%q) = %q (%s), want %q (%s)", r.nodeIP, got, stack(ips), r.want, r.stack)
			}
		})
	}
}

// The KEPs do not say which type the cloud's four IPs have; the rows hold for any
// single type, so both are tested.
var kepTypes = []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP}

// KEP-3705 (seeds 001 and 003): "Assume a node where the cloud has assigned the IPs
// `1.2.3.4`, `5.6.7.8`, `abcd::1234` and `abcd::5678`, in that order of preference."
// The first seven rows are in both drafts; the keyword rows are 001's only.
func TestKEP3705DualStackCloud(t *testing.T) {
	all := []string{"1.2.3.4", "5.6.7.8", "abcd::1234", "abcd::5678"}
	rows := []kepRow{
		// | (none)               | no   | (unset)                | `["1.2.3.4", "5.6.7.8", "abcd::1234", "abcd::5678"]` (DS IPv4-primary) |
		{nodeIP: "", want: all, stack: "DS IPv4-primary"},
		// | `0.0.0.0`            | no   | (unset)                | `["1.2.3.4", "5.6.7.8", "abcd::1234", "abcd::5678"]` (DS IPv4-primary) |
		{nodeIP: "0.0.0.0", want: all, stack: "DS IPv4-primary"},
		// | `::`                 | no   | (unset)                | `["1.2.3.4", "5.6.7.8", "abcd::1234", "abcd::5678"]` (DS IPv4-primary *) |
		// (*: kubelet does not pass "::" to the cloud, so the cloud's IPv4-first order stands.)
		{nodeIP: "::", want: all, stack: "DS IPv4-primary"},
		// | `1.2.3.4`            | no   | `"1.2.3.4"`            | `["1.2.3.4"]` (SS IPv4) |
		{nodeIP: "1.2.3.4", want: []string{"1.2.3.4"}, stack: "SS IPv4"},
		// | `9.10.11.12`         | no   | `"9.10.11.12"`         | (error, because the requested IP is not available) |
		{nodeIP: "9.10.11.12", err: ErrNodeIPNotFound},
		// | `abcd::5678`         | no   | `"abcd::5678"`         | `["abcd::5678"]` (SS IPv6) |
		{nodeIP: "abcd::5678", want: []string{"abcd::5678"}, stack: "SS IPv6"},
		// | `1.2.3.4,abcd::1234` | yes* | `"1.2.3.4,abcd::1234"` | `["1.2.3.4", "abcd::1234"]` (DS IPv4-primary) |
		{nodeIP: "1.2.3.4,abcd::1234", want: []string{"1.2.3.4", "abcd::1234"}, stack: "DS IPv4-primary"},
		// | `IPv4`               | yes  | `"IPv4"`               | `["1.2.3.4"]` (SS IPv4) |
		{nodeIP: "IPv4", want: []string{"1.2.3.4"}, stack: "SS IPv4"},
		// | `IPv6`               | yes  | `"IPv6"`               | `["abcd::1234"]` (SS IPv6) |
		{nodeIP: "IPv6", want: []string{"abcd::1234"}, stack: "SS IPv6"},
		// | `IPv4,IPv6`          | yes  | `"IPv4,IPv6"`          | `["1.2.3.4", "abcd::1234"]` (DS IPv4-primary) |
		{nodeIP: "IPv4,IPv6", want: []string{"1.2.3.4", "abcd::1234"}, stack: "DS IPv4-primary"},
		// | `IPv6,5.6.7.8`       | yes  | `"IPv6,5.6.7.8"`       | `["abcd::1234", "5.6.7.8"]` (DS IPv6-primary) |
		{nodeIP: "IPv6,5.6.7.8", want: []string{"abcd::1234", "5.6.7.8"}, stack: "DS IPv6-primary"},
		// | `IPv4,abcd::ef01`    | yes  | `"IPv4,abcd::ef01"`    | (error, because the requested IPv6 IP is not available) |
		{nodeIP: "IPv4,abcd::ef01", err: ErrNodeIPNotFound},
	}
	for _, typ := range kepTypes {
		t.Run(string(typ), func(t *testing.T) { runKEPRows(t, ofType(t, typ, all...), rows) })
	}
}

// KEP-3705 (seeds 001 and 003): "If the cloud only had IPv4 IPs for the node, then
// the same examples would look like:"
func TestKEP3705IPv4OnlyCloud(t *testing.T) {
	all := []string{"1.2.3.4", "5.6.7.8"}
	rows := []kepRow{
		// | (none)               | no   | (unset)                | `["1.2.3.4", "5.6.7.8"]` (SS IPv4) |
		{nodeIP: "", want: all, stack: "SS IPv4"},
		// | `0.0.0.0`            | no   | (unset)                | `["1.2.3.4", "5.6.7.8"]` (SS IPv4) |
		{nodeIP: "0.0.0.0", want: all, stack: "SS IPv4"},
		// | `::`                 | no   | (unset)                | `["1.2.3.4", "5.6.7.8"]` (SS IPv4 *) |
		{nodeIP: "::", want: all, stack: "SS IPv4"},
		// | `1.2.3.4`            | no   | `"1.2.3.4"`            | `["1.2.3.4"]` (SS IPv4) |
		{nodeIP: "1.2.3.4", want: []string{"1.2.3.4"}, stack: "SS IPv4"},
		// | `9.10.11.12`         | no   | `"9.10.11.12"`         | (error, because the requested IP is not available) |
		{nodeIP: "9.10.11.12", err: ErrNodeIPNotFound},
		// | `abcd::5678`         | no   | `"abcd::5678"`         | (error, because the requested IP is not available) |
		{nodeIP: "abcd::5678", err: ErrNodeIPNotFound},
		// | `1.2.3.4,abcd::1234` | yes* | `"1.2.3.4,abcd::1234"` | (error, because the requested IPv6 IP is not available) |
		{nodeIP: "1.2.3.4,abcd::1234", err: ErrNodeIPNotFound},
		// | `IPv4`               | yes  | `"IPv4"`               | `["1.2.3.4"]` (SS IPv4) |
		{nodeIP: "IPv4", want: []string{"1.2.3.4"}, stack: "SS IPv4"},
		// | `IPv6`               | yes  | `"IPv6"`               | (error, because no IPv6 IPs are available) |
		{nodeIP: "IPv6", err: ErrNoFamilyAddress},
		// | `IPv4,IPv6`          | yes  | `"IPv4,IPv6"`          | (error, because no IPv6 IPs are available) |
		{nodeIP: "IPv4,IPv6", err: ErrNoFamilyAddress},
		// | `IPv6,5.6.7.8`       | yes  | `"IPv6,5.6.7.8"`       | (error, because no IPv6 IPs are available) |
		{nodeIP: "IPv6,5.6.7.8", err: ErrNoFamilyAddress},
		// | `IPv4,abcd::ef01`    | yes  | `"IPv4,abcd::ef01"`    | (error, because the requested IPv6 IP is not available) |
		{nodeIP: "IPv4,abcd::ef01", err: ErrNodeIPNotFound},
	}
	for _, typ := range kepTypes {
		t.Run(string(typ), func(t *testing.T) { runKEPRows(t, ofType(t, typ, all...), rows) })
	}
}

// KEP-3705 (seed 003), the third example, with the NodeAddress list
// InternalIP 10.0.0.1, 10.0.0.2, fd00::1, fd00::2 and ExternalIP 192.168.0.1.
func TestKEP3705ExternalIPExample(t *testing.T) {
	in := addrs(t, "I:10.0.0.1", "I:10.0.0.2", "I:fd00::1", "I:fd00::2", "E:192.168.0.1")
	rows := []kepRow{
		// "You can request to get a single-stack IPv4 cluster with any of the three IPv4
		// IPs as the node IP (`--node-ip 10.0.0.1`, `--node-ip 10.0.0.2`, `--node-ip
		// 192.168.0.1`);"
		{nodeIP: "10.0.0.1", want: []string{"10.0.0.1", "192.168.0.1"}, stack: "SS IPv4"},
		{nodeIP: "10.0.0.2", want: []string{"10.0.0.2", "192.168.0.1"}, stack: "SS IPv4"},
		{nodeIP: "192.168.0.1", want: []string{"192.168.0.1"}, stack: "SS IPv4"},
		// "a dual-stack IPv4-primary cluster with any combination of the IPv4 and IPv6
		// IPs (`--node-ip 10.0.0.2,fd00::2`, etc);"
		{nodeIP: "10.0.0.2,fd00::2", want: []string{"10.0.0.2", "fd00::2", "192.168.0.1"}, stack: "DS IPv4-primary"},
		{nodeIP: "192.168.0.1,fd00::1", want: []string{"192.168.0.1", "fd00::1"}, stack: "DS IPv4-primary"},
		// "or a dual-stack IPv6-primary cluster with any combination of IPs (`--node-ip
		// fd00::1,192.168.0.1`, etc)."
		{nodeIP: "fd00::1,192.168.0.1", want: []string{"fd00::1", "192.168.0.1"}, stack: "DS IPv6-primary"},
		{nodeIP: "fd00::2,10.0.0.1", want: []string{"fd00::2", "10.0.0.1", "192.168.0.1"}, stack: "DS IPv6-primary"},
		// "But there is no way to get a single-stack IPv6 cluster, because passing
		// `--node-ip fd00::1` results in a _dual-stack_ cluster, because the current,
		// backward-compatible semantics of single-valued `--node-ip` values means that
		// the IPv4 `ExternalIP` will be preserved."
		{nodeIP: "fd00::1", want: []string{"fd00::1", "192.168.0.1"}, stack: "DS IPv6-primary"},
		// Alternatives (quoting the original draft's implementation): "or an IPv6
		// single-stack cluster using the _first_ IPv6 IP (`--node-ip IPv6`)."
		{nodeIP: "IPv6", want: []string{"fd00::1"}, stack: "SS IPv6"},
		// "But there is no way to get a single-stack IPv6 cluster using the second IPv6
		// IP, because passing `--node-ip fd00::2` results in a _dual-stack_ cluster"
		{nodeIP: "fd00::2", want: []string{"fd00::2", "192.168.0.1"}, stack: "DS IPv6-primary"},
	}
	runKEPRows(t, in, rows)
}

// The third example generalised to either family: a1, a2 and b1, b2 are
// InternalIPs of family f and of the other family, x is an ExternalIP of f.
func TestSelectBothFamilies(t *testing.T) {
	ext := map[*family.Family]string{family.IPv4: "192.168.0.1", family.IPv6: "2001:db8::1"}
	tests := []struct{ nodeIP, want, stack string }{
		{"", "{a1} {a2} {b1} {b2} {x}", "DS {f}-primary"},
		{"{a1}", "{a1} {x}", "SS {f}"},
		{"{x}", "{x}", "SS {f}"},
		{"{b1}", "{b1} {x}", "DS {o}-primary"},
		{"{b2},{x}", "{b2} {x}", "DS {o}-primary"},
		{"{a2},{b2}", "{a2} {b2} {x}", "DS {f}-primary"},
		{"{kw}", "{a1} {x}", "SS {f}"}, // like "{a1}": x is another type, and of family f
		{"{bkw}", "{b1}", "SS {o}"},
		{"{kw},{bkw}", "{a1} {b1} {x}", "DS {f}-primary"},
		{"{x},{bkw}", "{x} {b1}", "DS {f}-primary"},
	}
	for _, f := range family.All {
		o := f.Other()
		r := strings.NewReplacer("{x}", ext[f], "{b2}", samples[o].a2, "{o}", o.Name)
		ex := func(s string) string { return r.Replace(expand(s, f)) }
		in := addrs(t, "I:"+ex("{a1}"), "I:"+ex("{a2}"), "I:"+ex("{b1}"), "I:"+ex("{b2}"), "E:"+ex("{x}"))
		for _, tt := range tests {
			nodeIP := ex(tt.nodeIP)
			t.Run(f.Name+"/"+nodeIP, func(t *testing.T) {
				ips, err := Select(in, mustSpec(t, nodeIP), ExternalCloud)
				if err != nil {
					t.Fatal(err)
				}
				if got, want := strings.Join(ipStrings(ips.Addresses), " "), ex(tt.want); got != want || stack(ips) != ex(tt.stack) {
					t.Errorf("got %q (%s), want %q (%s)", got, stack(ips), want, ex(tt.stack))
				}
			})
		}
	}
}

func mustSpec(t testing.TB, s string) Spec {
	t.Helper()
	spec, err := ParseNodeIP(s)
	if err != nil {
		t.Fatal(err)
	}
	return spec
}

// "0.0.0.0" / "::" sort by family on bare metal, but leave a cloud's order alone.
func TestSelectModes(t *testing.T) {
	in := addrs(t, "I:1.2.3.4", "I:abcd::1", "I:5.6.7.8", "I:abcd::2")
	tests := []struct {
		nodeIP string
		mode   Mode
		want   string
	}{
		{"", NoCloud, "1.2.3.4 abcd::1 5.6.7.8 abcd::2"},
		{"", ExternalCloud, "1.2.3.4 abcd::1 5.6.7.8 abcd::2"},
		{"::", NoCloud, "abcd::1 abcd::2 1.2.3.4 5.6.7.8"},
		{"::", ExternalCloud, "1.2.3.4 abcd::1 5.6.7.8 abcd::2"},
		{"0.0.0.0", NoCloud, "1.2.3.4 5.6.7.8 abcd::1 abcd::2"},
		{"0.0.0.0", ExternalCloud, "1.2.3.4 abcd::1 5.6.7.8 abcd::2"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.nodeIP, tt.mode), func(t *testing.T) {
			ips, err := Select(in, mustSpec(t, tt.nodeIP), tt.mode)
			if got := strings.Join(ipStrings(ips.Addresses), " "); err != nil || got != tt.want {
				t.Errorf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestSelectErrors(t *testing.T) {
	if _, err := Select(nil, Spec{}, NoCloud); !errors.Is(err, ErrNoAddresses) {
		t.Errorf("empty list: %v, want ErrNoAddresses", err)
	}
	_, err := Select(addrs(t, "I:1.2.3.4"), mustSpec(t, "9.10.11.12"), ExternalCloud)
	if want := "the requested node IP is not available: 9.10.11.12 is not among [1.2.3.4 (InternalIP)]"; err == nil || err.Error() != want {
		t.Errorf("got %v, want %q", err, want)
	}
	_, err = Select(addrs(t, "I:1.2.3.4"), mustSpec(t, "IPv6"), ExternalCloud)
	if want := "no address of the requested family is available: no IPv6 address among [1.2.3.4 (InternalIP)]"; err == nil || err.Error() != want {
		t.Errorf("got %v, want %q", err, want)
	}
}

// KEP-1664: the primary is the first InternalIP, else the first ExternalIP; the
// secondary is the same rule for the other family.
func TestPrimaryNodeIPs(t *testing.T) {
	tests := []struct {
		in       []string
		pri, sec string
	}{
		{nil, "invalid IP", "invalid IP"},
		{[]string{"E:1.2.3.4", "I:abcd::1", "I:5.6.7.8"}, "abcd::1", "5.6.7.8"},
		{[]string{"E:1.2.3.4", "E:abcd::1"}, "1.2.3.4", "abcd::1"},
		{[]string{"I:fd00::1", "E:1.2.3.4", "I:fd00::2"}, "fd00::1", "1.2.3.4"},
		{[]string{"I:10.0.0.1", "I:10.0.0.2"}, "10.0.0.1", "invalid IP"},
	}
	for _, tt := range tests {
		p, s := PrimaryNodeIPs(addrs(t, tt.in...))
		if p.String() != tt.pri || s.String() != tt.sec {
			t.Errorf("PrimaryNodeIPs(%v) = %s, %s; want %s, %s", tt.in, p, s, tt.pri, tt.sec)
		}
	}
}

func TestParseAddresses(t *testing.T) {
	in := []v1.NodeAddress{
		{Type: v1.NodeHostName, Address: "node-1"},
		{Type: v1.NodeInternalIP, Address: "10.0.0.1"},
		{Type: v1.NodeInternalIP, Address: "not-an-ip"},
		{Type: v1.NodeExternalIP, Address: "::ffff:192.168.0.1"},
		{Type: v1.NodeInternalIP, Address: "fe80::1%eth0"},
		{Type: v1.NodeInternalIP, Address: "127.0.0.1"},
		{Type: v1.NodeInternalIP, Address: "10.0.0.1"},
		{Type: v1.NodeExternalIP, Address: "10.0.0.1"},
		{Type: v1.NodeInternalDNS, Address: "1.1.1.1"},
		{Type: v1.NodeInternalIP, Address: ""},
	}
	got, skipped := ParseAddresses(in)
	if want := "[10.0.0.1 (InternalIP) 192.168.0.1 (ExternalIP) 10.0.0.1 (ExternalIP)]"; fmt.Sprint(got) != want {
		t.Errorf("addresses %v, want %s", got, want)
	}
	wantSkipped := []string{
		`skipping InternalIP "not-an-ip": ParseAddr("not-an-ip"): unable to parse IP`,
		`skipping InternalIP "fe80::1%eth0": a node address cannot have a zone`,
		`skipping InternalIP "127.0.0.1": a loopback address cannot be a node IP`,
		`skipping InternalIP "": ParseAddr(""): unable to parse IP`,
	}
	if len(skipped) != len(wantSkipped) {
		t.Fatalf("skipped %v, want %d", skipped, len(wantSkipped))
	}
	for i, err := range skipped {
		if err.Error() != wantSkipped[i] {
			t.Errorf("skipped[%d] = %q, want %q", i, err, wantSkipped[i])
		}
	}
}

func TestHostIPs(t *testing.T) {
	a := netip.MustParseAddr
	tests := []struct {
		in   []netip.Addr
		want string
	}{
		{nil, "[]"},
		{[]netip.Addr{{}, {}}, "[]"},
		{[]netip.Addr{a("10.0.0.1"), a("fd00::1")}, "[10.0.0.1 fd00::1]"},
		{[]netip.Addr{a("fd00::1"), a("10.0.0.1")}, "[fd00::1 10.0.0.1]"},
		{[]netip.Addr{a("10.0.0.1"), a("10.0.0.1"), a("10.0.0.2"), a("fd00::1"), a("fd00::2")}, "[10.0.0.1 fd00::1]"},
		{[]netip.Addr{{}, a("::ffff:10.0.0.1"), a("fe80::1%eth0"), a("10.0.0.1"), a("fd00::1")}, "[10.0.0.1 fd00::1]"},
	}
	for _, tt := range tests {
		if got := fmt.Sprint(HostIPs(tt.in...)); got != tt.want {
			t.Errorf("HostIPs(%v) = %s, want %s", tt.in, got, tt.want)
		}
	}
	ips := IPs{Primary: a("fd00::1"), Secondary: a("10.0.0.1")}
	if got := fmt.Sprint(ips.HostIPs()); got != "[fd00::1 10.0.0.1]" {
		t.Errorf("IPs.HostIPs() = %s", got)
	}
}

func TestUsable(t *testing.T) {
	in := addrs(t, "I:10.0.0.1", "I:fd00::1")
	for _, f := range family.All {
		o := f.Other()
		tests := []struct {
			nodeIP  string
			usable  bool   // for family o
			wantErr string // for family o
		}{
			{"", true, ""},
			{"{kw},{bkw}", true, ""},
			{"{kw}", false, `IP family unavailable on this node: {o}: --node-ip "{kw}" asks for a single-stack {f} node`},
			{"{a1}", false, `IP family unavailable on this node: no {o} address left in the node's addresses after --node-ip "{a1}"`},
		}
		for _, tt := range tests {
			nodeIP := expand(tt.nodeIP, f)
			t.Run(f.Name+"/"+nodeIP, func(t *testing.T) {
				ips, err := Select(in, mustSpec(t, nodeIP), ExternalCloud)
				if err != nil {
					t.Fatal(err)
				}
				if err := ips.Usable(f); err != nil {
					t.Errorf("Usable(%s) = %v", f, err)
				}
				err = ips.Usable(o)
				if tt.usable != (err == nil) || (err != nil && !errors.Is(err, ErrFamilyUnavailable)) {
					t.Fatalf("Usable(%s) = %v, want usable=%v", o, err, tt.usable)
				}
				if want := strings.ReplaceAll(expand(tt.wantErr, f), "{o}", o.Name); err != nil && err.Error() != want {
					t.Errorf("Usable(%s) = %q, want %q", o, err, want)
				}
			})
		}
	}
	ips := IPs{Primary: netip.MustParseAddr("10.0.0.1"), Source: `node "n" status.addresses`}
	if err := ips.Usable(family.IPv6); err == nil || err.Error() != `IP family unavailable on this node: no IPv6 address in node "n" status.addresses` {
		t.Errorf("Usable(IPv6) = %v", err)
	}
}

func TestIPsString(t *testing.T) {
	a := netip.MustParseAddr
	for _, tt := range []struct {
		ips  IPs
		want string
	}{
		{IPs{}, "no node IP"},
		{IPs{Primary: a("10.0.0.1")}, "single-stack IPv4 10.0.0.1"},
		{IPs{Primary: a("fd00::1"), Secondary: a("10.0.0.1")}, "dual-stack IPv6-primary fd00::1,10.0.0.1"},
	} {
		if got := tt.ips.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
}

type fakeLister struct {
	addrs []InterfaceAddr
	err   error
	calls int
}

func (f *fakeLister) InterfaceAddrs() ([]InterfaceAddr, error) {
	f.calls++
	return f.addrs, f.err
}

func ifAddrs(in ...string) []InterfaceAddr {
	var out []InterfaceAddr
	for i, s := range in {
		out = append(out, InterfaceAddr{Index: 2 + i, Name: fmt.Sprint("eth", i), Addr: netip.MustParseAddr(s)})
	}
	return out
}

func TestNodeIPs(t *testing.T) {
	node := func(as ...v1.NodeAddress) *v1.Node {
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: v1.NodeStatus{Addresses: as}}
	}
	cloudNode := node(
		v1.NodeAddress{Type: v1.NodeInternalIP, Address: "bogus"},
		v1.NodeAddress{Type: v1.NodeInternalIP, Address: "10.0.0.1"},
		v1.NodeAddress{Type: v1.NodeInternalIP, Address: "fd00::1"},
		v1.NodeAddress{Type: v1.NodeHostName, Address: "n1"},
	)
	junkOnly := node(v1.NodeAddress{Type: v1.NodeInternalIP, Address: "bogus"})
	local := ifAddrs("fd00::9", "10.0.0.9")
	tests := []struct {
		name        string
		node        *v1.Node
		nodeIP      string
		mode        Mode
		lister      *fakeLister
		want        string // IPs.String()
		wantErr     error
		wantSkipped int
		wantCalls   int
	}{
		{name: "cloud node", node: cloudNode, mode: ExternalCloud, lister: &fakeLister{addrs: local},
			want: "dual-stack IPv4-primary 10.0.0.1,fd00::1", wantSkipped: 1},
		{name: "cloud node single keyword", node: cloudNode, nodeIP: "IPv6", mode: ExternalCloud,
			want: "single-stack IPv6 fd00::1", wantSkipped: 1},
		{name: "cloud nil node", mode: ExternalCloud, lister: &fakeLister{addrs: local}, wantErr: ErrNoAddresses},
		{name: "cloud junk only", node: junkOnly, mode: ExternalCloud, wantErr: ErrNoAddresses, wantSkipped: 1},
		{name: "bare metal node wins over interfaces", node: cloudNode, lister: &fakeLister{addrs: local},
			want: "dual-stack IPv4-primary 10.0.0.1,fd00::1", wantSkipped: 1},
		{name: "bare metal nil node", lister: &fakeLister{addrs: local},
			want: "dual-stack IPv4-primary 10.0.0.9,fd00::9", wantCalls: 1},
		{name: "bare metal ::", nodeIP: "::", lister: &fakeLister{addrs: local},
			want: "dual-stack IPv6-primary fd00::9,10.0.0.9", wantCalls: 1},
		{name: "bare metal junk node", node: junkOnly, nodeIP: "10.0.0.9", lister: &fakeLister{addrs: local},
			want: "single-stack IPv4 10.0.0.9", wantSkipped: 1, wantCalls: 1},
		{name: "bare metal IP not local", nodeIP: "10.9.9.9", lister: &fakeLister{addrs: local},
			wantErr: ErrNodeIPNotFound, wantCalls: 1},
		{name: "bare metal no lister", wantErr: ErrNoAddresses},
		{name: "lister error", lister: &fakeLister{err: errBoom}, wantErr: errBoom, wantCalls: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := Options{Mode: tt.mode}
			if tt.lister != nil {
				opts.Interfaces = tt.lister
			}
			ips, err := NodeIPs(tt.node, mustSpec(t, tt.nodeIP), opts)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
			} else if err != nil || ips.String() != tt.want {
				t.Fatalf("NodeIPs = %s, %v; want %s", ips, err, tt.want)
			}
			if len(ips.Skipped) != tt.wantSkipped {
				t.Errorf("skipped %v, want %d", ips.Skipped, tt.wantSkipped)
			}
			if tt.lister != nil && tt.lister.calls != tt.wantCalls {
				t.Errorf("lister called %d times, want %d", tt.lister.calls, tt.wantCalls)
			}
		})
	}
}

var errBoom = errors.New("boom")
