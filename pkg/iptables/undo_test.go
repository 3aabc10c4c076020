package iptables

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// kubeProxySave is iptables-save output with kube-proxy's chains and others'
// (also loaded into a real kernel by pkg/app's TestCleanupKubeProxyIPTablesRealKernel).
var kubeProxySave = func() string {
	b, err := os.ReadFile("testdata/kube-proxy-save.txt")
	if err != nil {
		panic(err)
	}
	return string(b)
}()

func TestUndo(t *testing.T) {
	want := `*filter
-D INPUT -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-FIREWALL
-D FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-F KUBE-FIREWALL
-F KUBE-FORWARD
-X KUBE-FIREWALL
-X KUBE-FORWARD
COMMIT
*nat
-D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-F KUBE-SERVICES
-F KUBE-SVC-ABC
-X KUBE-SERVICES
-X KUBE-SVC-ABC
COMMIT
`
	if got := Undo(kubeProxySave, "KUBE-"); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	if got := Undo(strings.ReplaceAll(kubeProxySave, "KUBE-", "OTHER-"), "KUBE-"); got != "" {
		t.Fatalf("touched rules that are not kube-proxy's:\n%s", got)
	}
}

func TestChains(t *testing.T) {
	got := Chains(kubeProxySave, "KUBE-")
	if want := []string{"KUBE-FIREWALL", "KUBE-FORWARD"}; !slices.Equal(got["filter"], want) {
		t.Errorf("filter: got %v, want %v", got["filter"], want)
	}
	if want := []string{"KUBE-SERVICES", "KUBE-SVC-ABC"}; !slices.Equal(got["nat"], want) {
		t.Errorf("nat: got %v, want %v", got["nat"], want)
	}
	if len(got["mangle"]) != 0 {
		t.Errorf("mangle: got %v, want none", got["mangle"])
	}
}
