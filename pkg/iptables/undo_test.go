package iptables

import (
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
)

// kubeProxySave is iptables-save output with kube-proxy's chains, the kubelet's,
// kube-router's and an operator's (also loaded into a real kernel by pkg/app's
// TestCleanupKubeProxyIPTablesRealKernel).
var kubeProxySave = func() string {
	b, err := os.ReadFile("testdata/kube-proxy-save.txt")
	if err != nil {
		panic(err)
	}
	return string(b)
}()

func TestUndo(t *testing.T) {
	save := `*filter
:INPUT ACCEPT [0:0]
:DSPROXY-A - [0:0]
:DSPROXY-B - [0:0]
:MY-CHAIN - [0:0]
-A INPUT -m comment --comment "dsproxy" -j DSPROXY-A
-A INPUT -j MY-CHAIN
-A DSPROXY-A -j DSPROXY-B
-A MY-CHAIN -g DSPROXY-B
-A MY-CHAIN -p tcp --dport 22 -j ACCEPT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
-A PREROUTING -j MASQUERADE
COMMIT
`
	// Undo owns its prefix outright: even another chain's jump goes.
	want := `*filter
-D INPUT -m comment --comment "dsproxy" -j DSPROXY-A
-D MY-CHAIN -g DSPROXY-B
-F DSPROXY-A
-F DSPROXY-B
-X DSPROXY-A
-X DSPROXY-B
COMMIT
`
	if got := Undo(save, "DSPROXY-"); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if got := Undo(save, "KUBE-"); got != "" {
		t.Fatalf("touched rules that are not the prefix's:\n%s", got)
	}
}

// TestUndoOwned: only owned chains go, with the built-in chains' jumps to them;
// an owned chain another program's chain jumps to stays, with what it reaches.
func TestUndoOwned(t *testing.T) {
	kubeProxy := map[string]bool{
		"mangle/KUBE-PROXY-CANARY": true, "filter/KUBE-FORWARD": true, "filter/KUBE-NODEPORTS": true,
		"filter/KUBE-PROXY-CANARY": true, "filter/KUBE-PROXY-FIREWALL": true, "nat/KUBE-MARK-MASQ": true,
		"nat/KUBE-POSTROUTING": true, "nat/KUBE-SEP-ABC": true, "nat/KUBE-SERVICES": true, "nat/KUBE-SVC-ABC": true,
		"nat/PREROUTING": true, // built-in: never removed
	}
	want := `*mangle
-F KUBE-PROXY-CANARY
-X KUBE-PROXY-CANARY
COMMIT
*filter
-D INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-D INPUT -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-D FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-F KUBE-FORWARD
-F KUBE-NODEPORTS
-F KUBE-PROXY-CANARY
-F KUBE-PROXY-FIREWALL
-X KUBE-FORWARD
-X KUBE-NODEPORTS
-X KUBE-PROXY-CANARY
-X KUBE-PROXY-FIREWALL
COMMIT
*nat
-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-D OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-D POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-F KUBE-POSTROUTING
-F KUBE-SEP-ABC
-F KUBE-SERVICES
-F KUBE-SVC-ABC
-X KUBE-POSTROUTING
-X KUBE-SEP-ABC
-X KUBE-SERVICES
-X KUBE-SVC-ABC
COMMIT
`
	got, kept := UndoOwned(kubeProxySave, func(table, chain string) bool { return kubeProxy[table+"/"+chain] })
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if want := []string{"nat/KUBE-MARK-MASQ"}; !slices.Equal(kept, want) {
		t.Errorf("kept %v, want %v (OLD-HOSTPORT jumps to it)", kept, want)
	}

	// What a kept chain reaches stays too: here OLD-HOSTPORT jumps to
	// KUBE-SERVICES, so it, the Service's chains and KUBE-MARK-MASQ, which they
	// reach, stay; of nat only KUBE-POSTROUTING goes.
	save := strings.Replace(kubeProxySave, "-A OLD-HOSTPORT -s 10.0.0.0/8 -j KUBE-MARK-MASQ", "-A OLD-HOSTPORT -j KUBE-SERVICES", 1)
	got, kept = UndoOwned(save, func(table, chain string) bool { return kubeProxy[table+"/"+chain] })
	if want := []string{"nat/KUBE-MARK-MASQ", "nat/KUBE-SEP-ABC", "nat/KUBE-SERVICES", "nat/KUBE-SVC-ABC"}; !slices.Equal(kept, want) {
		t.Errorf("kept %v, want %v", kept, want)
	}
	nat := got[strings.Index(got, "*nat"):]
	if want := `*nat
-D POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-F KUBE-POSTROUTING
-X KUBE-POSTROUTING
COMMIT
`; nat != want {
		t.Errorf("nat: got\n%s\nwant\n%s", nat, want)
	}

	if got, kept := UndoOwned(kubeProxySave, func(string, string) bool { return false }); got != "" || kept != nil {
		t.Errorf("nothing owned: got %q, kept %v", got, kept)
	}
}

func TestChains(t *testing.T) {
	got := Chains(kubeProxySave, "KUBE-PROXY-")
	if want := []string{"KUBE-PROXY-CANARY", "KUBE-PROXY-FIREWALL"}; !slices.Equal(got["filter"], want) {
		t.Errorf("filter: got %v, want %v", got["filter"], want)
	}
	if want := []string{"KUBE-PROXY-CANARY"}; !slices.Equal(got["mangle"], want) {
		t.Errorf("mangle: got %v, want %v", got["mangle"], want)
	}
	if len(got["nat"]) != 0 {
		t.Errorf("nat: got %v, want none", got["nat"])
	}
}

// CountRules counts a chain's rules in the named table only, a declared empty
// chain as 0, and leaves out chains the table does not declare.
func TestCountRules(t *testing.T) {
	chains := []string{"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-MARK-MASQ", "KUBE-PROXY-CANARY", "PREROUTING"}
	for _, tc := range []struct {
		table string
		want  map[string]int
	}{
		{"nat", map[string]int{"KUBE-SERVICES": 1, "KUBE-MARK-MASQ": 1, "PREROUTING": 1}},
		{"filter", map[string]int{"KUBE-NODEPORTS": 0, "KUBE-PROXY-CANARY": 0}},
		{"raw", map[string]int{}},
	} {
		if got := CountRules(kubeProxySave, tc.table, chains); !maps.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.table, got, tc.want)
		}
	}
}

// A declaration after a chain's rules (which iptables-save never writes) does
// not reset its count, and a line longer than bufio's default buffer is read.
func TestCountRulesOrderAndLongLines(t *testing.T) {
	long := "-A DSPROXY-A -m comment --comment \"" + strings.Repeat("x", 100<<10) + "\" -j ACCEPT"
	save := "*nat\n-A DSPROXY-A -j ACCEPT\n:DSPROXY-A - [0:0]\n" + long + "\nCOMMIT\n"
	if got := CountRules(save, "nat", []string{"DSPROXY-A"}); got["DSPROXY-A"] != 2 {
		t.Errorf("got %v, want DSPROXY-A: 2", got)
	}
}
