//go:build netns

package app

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/dsproxy/dsproxy/internal/netnstest"
	"github.com/dsproxy/dsproxy/pkg/config"
)

// readSysctl reads a sysctl of the calling thread's network namespace.
func readSysctl(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/" + name)
	if err != nil {
		t.Error(err)
	}
	return strings.TrimSpace(string(b))
}

// initOnlyIn runs --init-only with args on a thread in a new network namespace
// (lo up) and returns the listed sysctls there and its iptables rules.
func initOnlyIn(t *testing.T, args []string, sysctls ...string) (map[string]string, string) {
	t.Helper()
	cfg, err := config.Parse(args)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	var rules string
	inNewNetns(t, func(t *testing.T, _ vnetns.NsHandle) {
		if lo, err := netlink.LinkByName("lo"); err != nil || netlink.LinkSetUp(lo) != nil {
			t.Errorf("lo: %v", err)
			return
		}
		if err := InitOnly(cfg); err != nil {
			t.Errorf("InitOnly %v: %v", args, err)
			return
		}
		for _, s := range sysctls {
			got[s] = readSysctl(t, s)
		}
		out, err := exec.Command("iptables-save").CombinedOutput()
		if err != nil {
			t.Errorf("iptables-save: %v: %s", err, out)
		}
		rules = string(out)
	})
	return got, rules
}

// TestInitOnly: --init-only sets route_localnet in iptables mode exactly when
// IPv4 NodePorts answer on loopback, in its own namespace only, and programs
// nothing.
func TestInitOnly(t *testing.T) {
	const rl = "net/ipv4/conf/all/route_localnet"
	host := readSysctl(t, rl)
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"iptables", []string{"--proxy-mode=iptables"}, "1"},
		{"localhost NodePorts off", []string{"--proxy-mode=iptables", "--iptables-localhost-nodeports=false"}, "0"},
		{"primary NodePort addresses", []string{"--proxy-mode=iptables", "--nodeport-addresses=primary"}, "0"},
		{"loopback NodePort addresses", []string{"--proxy-mode=iptables", "--nodeport-addresses=127.0.0.0/8"}, "1"},
		{"other NodePort addresses", []string{"--proxy-mode=iptables", "--nodeport-addresses=192.0.2.0/24"}, "0"},
		{"nftables", []string{"--proxy-mode=nftables"}, "0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			netnstest.New(t) // skips when not root
			got, rules := initOnlyIn(t, c.args, rl)
			if got[rl] != c.want {
				t.Errorf("route_localnet %s, want %s", got[rl], c.want)
			}
			if strings.Contains(rules, "DSPROXY") {
				t.Errorf("--init-only programmed rules:\n%s", rules)
			}
		})
	}
	if now := readSysctl(t, rl); now != host {
		t.Errorf("the host's route_localnet changed from %s to %s", host, now)
	}
}

// TestInitOnlyIPVS: in IPVS mode --init-only loads IPVS and sets its sysctls,
// the ARP ones with --ipvs-strict-arp.
func TestInitOnlyIPVS(t *testing.T) {
	netnstest.New(t)
	netnstest.RequireIPVS(t)
	for _, strict := range []bool{false, true} {
		args := []string{"--proxy-mode=ipvs"}
		want := map[string]string{"net/ipv4/vs/conntrack": "1", "net/ipv4/vs/expire_nodest_conn": "1",
			"net/ipv4/vs/expire_quiescent_template": "1", "net/ipv4/conf/all/arp_ignore": "0"}
		if strict {
			args = append(args, "--ipvs-strict-arp")
			want["net/ipv4/conf/all/arp_ignore"] = "1"
		}
		var names []string
		for n := range want {
			names = append(names, n)
		}
		got, rules := initOnlyIn(t, args, names...)
		for n, v := range want {
			if got[n] != v {
				t.Errorf("%v: %s = %q, want %s", args, n, got[n], v)
			}
		}
		if strings.Contains(rules, "DSIPVS") {
			t.Errorf("--init-only programmed rules:\n%s", rules)
		}
	}
}
