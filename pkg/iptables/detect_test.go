package iptables

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestDetect: the kubelet's hint chains decide; without them the flavour with
// more rules (dsproxy's own not counted); without either, the default. Missing
// binaries count as empty tables.
func TestDetect(t *testing.T) {
	const hint = "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n"
	const hintElsewhere = "*filter\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n"
	const rules = "*filter\n-A INPUT -j ACCEPT\n-A INPUT -j DROP\nCOMMIT\n"
	const ours = "*nat\n-A DSPROXY-SERVICES -j DROP\n-A DSPROXY-SERVICES -j DROP\n-A DSPROXY-SERVICES -j DROP\nCOMMIT\n"
	cases := []struct {
		name string
		out  map[string]string // "<cmd> <args>" → output; missing → error
		want Flavor
	}{
		{"legacy hint", map[string]string{"iptables-legacy-save": hint, "iptables-nft-save": rules}, FlavorLegacy},
		{"nft hint", map[string]string{"ip6tables-nft-save": hint, "iptables-legacy-save": rules}, FlavorNFT},
		{"hints in both: rules decide", map[string]string{"iptables-legacy-save": hint, "iptables-nft-save": hint,
			"ip6tables-legacy-save": rules}, FlavorLegacy},
		{"a hint chain outside mangle is no hint", map[string]string{"iptables-legacy-save": hintElsewhere, "iptables-nft-save": rules}, FlavorNFT},
		{"more nft rules", map[string]string{"iptables-nft-save": rules, "ip6tables-legacy-save": "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n"}, FlavorNFT},
		{"dsproxy's own rules do not count", map[string]string{"iptables-legacy-save": ours, "iptables-nft-save": "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n"}, FlavorNFT},
		{"nothing anywhere", map[string]string{}, FlavorDefault},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			save := func(_ context.Context, cmd string, args ...string) (string, error) {
				out, ok := c.out[strings.Join(append([]string{cmd}, args...), " ")]
				if !ok {
					return "", errors.New("not found")
				}
				return out, nil
			}
			if got, why := Detect(context.Background(), save); got != c.want {
				t.Errorf("Detect = %q (%s), want %q", got, why, c.want)
			}
		})
	}
}
