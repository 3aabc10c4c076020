package app

import "testing"

// TestKubeProxyNames: what --cleanup-kube-proxy counts as kube-proxy's, by
// kube-proxy v1.36's own lists, and what it must leave to the kubelet and to
// other programs that name their chains and ipsets KUBE-.
func TestKubeProxyNames(t *testing.T) {
	for _, c := range []struct {
		table, chain string
		want         bool
	}{
		{"nat", "KUBE-SERVICES", true},
		{"filter", "KUBE-SERVICES", true},
		{"nat", "KUBE-SVC-ABCDEF0123456789", true},
		{"nat", "KUBE-SEP-ABCDEF0123456789", true},
		{"nat", "KUBE-XLB-ABCDEF0123456789", true}, // kube-proxy before v1.25
		{"filter", "KUBE-SVC-ABCDEF0123456789", false},
		{"nat", "KUBE-MARK-MASQ", true},
		{"nat", "KUBE-NODE-PORT", true},          // IPVS mode
		{"filter", "KUBE-IPVS-OUT-FILTER", true}, // IPVS mode
		{"mangle", "KUBE-PROXY-CANARY", true},
		{"filter", "KUBE-FIREWALL", false}, // the kubelet's
		{"filter", "KUBE-KUBELET-CANARY", false},
		{"mangle", "KUBE-IPTABLES-HINT", false},
		{"nat", "KUBE-MARK-DROP", false},
		{"filter", "KUBE-ROUTER-INPUT", false}, // kube-router's
		{"filter", "KUBE-NWPLCY-ABCDEF", false},
		{"filter", "INPUT", false},
	} {
		if got := kubeProxyChain(c.table, c.chain); got != c.want {
			t.Errorf("kubeProxyChain(%s, %s) = %v, want %v", c.table, c.chain, got, c.want)
		}
	}
	for _, c := range []struct {
		set  string
		want bool
	}{
		{"KUBE-CLUSTER-IP", true},
		{"KUBE-6-CLUSTER-IP", true},
		{"KUBE-NODE-PORT-LOCAL-SCTP-HASH", true},
		{"KUBE-6-NODE-PORT-LOCAL-SCTP-HAS", true}, // cut to 31 characters, as kube-proxy cuts it
		{"KUBE-6-NODE-PORT-LOCAL-SCTP-HASH", false},
		{"KUBE-6-LOAD-BALANCER-SOURCE-CID", true},
		{"KUBE-SRC-ABCDEF", false}, // kube-router's
		{"KUBE-DST-ABCDEF", false},
		{"KUBE-CLUSTER", false},
		{"DSIPVS-CLUSTER-IP", false},
	} {
		if got := kubeProxyIPSet(c.set); got != c.want {
			t.Errorf("kubeProxyIPSet(%s) = %v, want %v", c.set, got, c.want)
		}
	}
}
