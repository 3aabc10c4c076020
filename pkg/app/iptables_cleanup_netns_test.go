//go:build netns

package app

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestCleanupKubeProxyIPTablesRealKernel loads kube-proxy-shaped iptables rules in a
// fresh network namespace beside the kubelet's, kube-router's and an operator's,
// and checks that only kube-proxy's are removed; KUBE-MARK-MASQ, which another
// program's chain uses, stays.
func TestCleanupKubeProxyIPTablesRealKernel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := exec.LookPath("iptables-nft-restore"); err != nil {
		t.Skip("iptables-nft not installed")
	}
	ns := fmt.Sprintf("dsp-ipt-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	inNS := func(ctx context.Context, name string, args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
	}
	for _, bin := range []string{"iptables-nft-restore", "ip6tables-nft-restore"} {
		load := inNS(context.Background(), bin)
		save, err := os.ReadFile("../iptables/testdata/kube-proxy-save.txt")
		if err != nil {
			t.Fatal(err)
		}
		rules := string(save)
		if strings.HasPrefix(bin, "ip6") {
			rules = strings.NewReplacer("10.96.0.1/32", "fd00:96::1/128", "127.0.0.0/8", "::1/128",
				"10.0.0.5/32", "fd00::5/128", "10.0.0.5:6443", "[fd00::5]:6443", "10.0.0.0/8", "fd00::/8").Replace(rules)
		}
		load.Stdin = strings.NewReader(rules)
		if out, err := load.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", bin, err, out)
		}
	}
	old := command
	command = inNS
	t.Cleanup(func() { command = old })
	if err := cleanupKubeProxyIPTables(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, bin := range []string{"iptables-nft-save", "ip6tables-nft-save"} {
		out, err := inNS(context.Background(), bin).Output()
		if err != nil {
			t.Fatal(err)
		}
		s := string(out)
		for _, gone := range []string{"KUBE-SERVICES", "KUBE-SVC-", "KUBE-SEP-", "KUBE-POSTROUTING", "KUBE-FORWARD",
			"KUBE-NODEPORTS", "KUBE-PROXY-"} {
			if strings.Contains(s, gone) {
				t.Errorf("%s still has kube-proxy's %s:\n%s", bin, gone, s)
			}
		}
		for _, keep := range []string{":MY-CHAIN", "-A INPUT -j MY-CHAIN", "--dport 22 -j ACCEPT", "-j MARK --set-xmark 0x1/",
			"-A INPUT -j KUBE-FIREWALL", "-A OUTPUT -j KUBE-FIREWALL", "-A KUBE-FIREWALL ", "-j KUBE-ROUTER-INPUT",
			"-A KUBE-ROUTER-INPUT -j KUBE-NWPLCY-ABC", ":KUBE-IPTABLES-HINT", ":KUBE-KUBELET-CANARY",
			"-A KUBE-MARK-MASQ -j MARK", "-j KUBE-MARK-MASQ"} {
			if !strings.Contains(s, keep) {
				t.Errorf("%s lost %q:\n%s", bin, keep, s)
			}
		}
	}
}
