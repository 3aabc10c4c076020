//go:build netns

package app

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/dsproxy/dsproxy/internal/netnstest"
	"github.com/dsproxy/dsproxy/pkg/config"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/ipvs"
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

// TestIPVSTimeouts: --ipvs-*-timeout are set by --init-only and by the IPVS
// backend's start. A timeout the kernel refuses (over INT_MAX jiffies) is logged
// and changes nothing, as in kube-proxy: neither --init-only nor the start fails.
func TestIPVSTimeouts(t *testing.T) {
	netnstest.New(t)
	netnstest.RequireIPVS(t)
	type timeouts struct{ tcp, fin, udp time.Duration }
	read := func(t *testing.T) timeouts {
		k, err := ipvs.Open(family.IPv4, "", true)
		if err != nil {
			t.Fatal(err)
		}
		defer k.Close()
		var got timeouts
		if got.tcp, got.fin, got.udp, err = k.Timeouts(); err != nil {
			t.Fatal(err)
		}
		return got
	}
	set := []string{"--ipvs-tcp-timeout=123s", "--ipvs-tcpfin-timeout=45s", "--ipvs-udp-timeout=67s"}
	// 7000h is over INT_MAX jiffies at every HZ from 100 up.
	refused := []string{"--ipvs-tcp-timeout=7000h", "--ipvs-udp-timeout=67s"}
	for _, c := range []struct {
		name string
		run  func(t *testing.T, cfg *config.Config) error
	}{
		{"init-only", func(t *testing.T, cfg *config.Config) error { return InitOnly(cfg) }},
		{"start", func(t *testing.T, cfg *config.Config) error {
			d := &Daemon{cfg: cfg}
			defer func() {
				for _, c := range d.closers {
					c()
				}
			}()
			_, err := d.newIPVSBackend(family.IPv4)
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			inNewNetns(t, func(t *testing.T, _ vnetns.NsHandle) {
				before := read(t)
				for _, args := range [][]string{refused, set} {
					cfg, err := config.Parse(append([]string{"--proxy-mode=ipvs"}, args...))
					if err != nil {
						t.Fatal(err)
					}
					if err := c.run(t, cfg); err != nil {
						t.Errorf("%v: %v", args, err)
					}
					got, want := read(t), timeouts{123 * time.Second, 45 * time.Second, 67 * time.Second}
					if args[0] == refused[0] {
						// The kernel takes all three or none.
						want = before
					}
					if got != want {
						t.Errorf("after %v: timeouts %+v, want %+v", args, got, want)
					}
				}
			})
		})
	}
}
