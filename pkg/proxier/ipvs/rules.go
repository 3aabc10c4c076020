package ipvs

import (
	"fmt"
	"strings"

	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// The IPVS mode's iptables chains. Their rules depend only on node settings and
// match the ipsets, so no sync but a node change rewrites them.
const (
	chainServices    = Prefix + "SERVICES" // nat PREROUTING, OUTPUT
	chainMasqNonLoc  = Prefix + "MASQ-NONLOCAL"
	chainMarkMasq    = Prefix + "MARK-MASQ"
	chainPostrouting = Prefix + "POSTROUTING" // nat POSTROUTING
	chainInput       = Prefix + "INPUT"       // filter INPUT
	chainForward     = Prefix + "FORWARD"     // filter FORWARD
	chainOutput      = Prefix + "OUTPUT"      // filter OUTPUT
	chainNoLocalExt  = Prefix + "NO-LOCAL-EXTERNAL"
	chainFirewallOut = Prefix + "FIREWALL-OUTPUT" // mangle OUTPUT
)

// jumps are the rules in built-in chains that enter dsproxy's: table, chain, rule.
var jumps = [][3]string{
	{"nat", "PREROUTING", chainServices},
	{"nat", "OUTPUT", chainServices},
	{"nat", "POSTROUTING", chainPostrouting},
	{"filter", "INPUT", chainInput},
	{"filter", "FORWARD", chainForward},
	{"filter", "OUTPUT", chainOutput},
	{"mangle", "OUTPUT", chainFirewallOut},
}

// ruleset renders the whole iptables-restore input for the node settings. Filter
// INPUT runs before IPVS takes a packet (IPVS hooks LOCAL_IN after filtering),
// so it sees the Service address and port still.
func ruleset(node *proxier.NodeConfig, masqBit int, randomFully, keepInvalid bool) string {
	f := node.Family
	set := func(s setID, dirs string) string { return "-m set --match-set " + setName(f, s) + " " + dirs }
	mark := fmt.Sprintf("%#x", uint32(1)<<masqBit)
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("*nat")
	for _, c := range []string{chainServices, chainMasqNonLoc, chainMarkMasq, chainPostrouting} {
		w(":%s - [0:0]", c)
	}
	switch {
	case node.MasqueradeAll:
		w("-A %s %s -j %s", chainServices, set(setClusterIP, "dst,dst"), chainMarkMasq)
	case node.Local.Mode != proxier.LocalModeNone:
		w("-A %s %s -j %s", chainServices, set(setClusterIP, "dst,dst"), chainMasqNonLoc)
	default:
		// Without a local-traffic detector, as kube-proxy: the node's own
		// connections to a ClusterIP take a Service address on the dummy link
		// as their source, which only this node holds, so they are
		// masqueraded (source a ClusterIP, destination a Service port).
		w("-A %s %s -j %s", chainServices, set(setClusterIP, "src,dst"), chainMarkMasq)
	}
	w("-A %s %s -j %s", chainServices, set(setExternal, "dst,dst"), chainMarkMasq)
	for _, m := range localMatches(node.Local, f.BitLen) {
		w("-A %s %s -j RETURN", chainMasqNonLoc, m)
	}
	w("-A %s -j %s", chainMasqNonLoc, chainMarkMasq)
	w("-A %s -j MARK --or-mark %s", chainMarkMasq, mark)
	masq := "-j MASQUERADE"
	if randomFully {
		masq += " --random-fully"
	}
	w("-A %s %s %s", chainPostrouting, set(setLoopBack, "dst,dst,src"), masq)
	w("-A %s -m mark ! --mark %s/%s -j RETURN", chainPostrouting, mark, mark)
	w("-A %s -j MARK --xor-mark %s", chainPostrouting, mark)
	w("-A %s %s", chainPostrouting, masq)
	w("COMMIT")

	// The node's own connections are scheduled by IPVS at LOCAL_OUT, before
	// filter OUTPUT, and never pass INPUT: mangle OUTPUT still sees the VIP.
	w("*mangle")
	w(":%s - [0:0]", chainFirewallOut)
	w("-A %s -m conntrack --ctstate NEW %s -m set ! --match-set %s dst,dst,src -j DROP", chainFirewallOut, set(setFirewall, "dst,dst"), setName(f, setSourceRanges))
	w("COMMIT")

	w("*filter")
	for _, c := range []string{chainInput, chainForward, chainOutput, chainNoLocalExt} {
		w(":%s - [0:0]", c)
	}
	w("-A %s %s -m set ! --match-set %s dst,dst,src -j DROP", chainInput, set(setFirewall, "dst,dst"), setName(f, setSourceRanges))
	// New connections only: a port that lost its last endpoint keeps its
	// virtual server while the TCP connections it carries drain.
	w("-A %s -m conntrack --ctstate NEW %s -p tcp -j REJECT --reject-with tcp-reset", chainInput, set(setNoEndpoints, "dst,dst"))
	w("-A %s -m conntrack --ctstate NEW %s -j REJECT", chainInput, set(setNoEndpoints, "dst,dst"))
	w("-A %s -m conntrack --ctstate NEW %s -j DROP", chainInput, set(setNoLocal, "dst,dst"))
	w("-A %s -m conntrack --ctstate NEW %s -j %s", chainInput, set(setNoLocalExt, "dst,dst"), chainNoLocalExt)
	for _, m := range localMatches(node.Local, f.BitLen) {
		w("-A %s %s -j RETURN", chainNoLocalExt, m)
	}
	w("-A %s -j DROP", chainNoLocalExt)
	for _, s := range []setID{setClusterIP, setExternal, setExternalLocal} {
		w("-A %s %s -j RETURN", chainInput, set(s, "dst,dst"))
	}
	w("-A %s %s -j ACCEPT", chainInput, set(setHealthCheck, "dst,dst"))
	w("-A %s -m conntrack --ctstate NEW %s -p tcp -j REJECT --reject-with tcp-reset", chainInput, set(setIPs, "dst"))
	w("-A %s -m conntrack --ctstate NEW %s -j REJECT", chainInput, set(setIPs, "dst"))
	w("-A %s -m conntrack --ctstate NEW %s -p tcp -j REJECT --reject-with tcp-reset", chainInput, set(setReserved, "dst,dst"))
	w("-A %s -m conntrack --ctstate NEW %s -j REJECT", chainInput, set(setReserved, "dst,dst"))
	if !keepInvalid {
		w("-A %s -m conntrack --ctstate INVALID -j DROP", chainForward)
	}
	for _, c := range node.ServiceCIDRs {
		if c.Addr().BitLen() != f.BitLen {
			continue
		}
		// Unallocated addresses in the Service ranges: nothing answers them.
		w("-A %s -d %s -m set ! --match-set %s dst -j DROP", chainForward, c, setName(f, setIPs))
		w("-A %s -d %s -m set ! --match-set %s dst -j DROP", chainOutput, c, setName(f, setIPs))
	}
	// The node's own connections to a port without endpoints fail at once, as
	// in kube-proxy's other modes (a UDP sender sees EPERM), not after INPUT.
	w("-A %s -m conntrack --ctstate NEW %s -p tcp -j REJECT --reject-with tcp-reset", chainOutput, set(setNoEndpoints, "dst,dst"))
	w("-A %s -m conntrack --ctstate NEW %s -j REJECT", chainOutput, set(setNoEndpoints, "dst,dst"))
	w("-A %s -m mark --mark %s/%s -j ACCEPT", chainForward, mark, mark)
	w("-A %s -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT", chainForward)
	w("COMMIT")
	return b.String()
}

// localMatches are the iptables matches for traffic from local pods.
func localMatches(l proxier.LocalDetector, bits int) []string {
	var out []string
	switch l.Mode {
	case proxier.LocalModeClusterCIDR, proxier.LocalModeNodeCIDR:
		for _, c := range l.CIDRs {
			if c.Addr().BitLen() == bits {
				out = append(out, "-s "+c.String())
			}
		}
	case proxier.LocalModeBridgeInterface:
		out = append(out, "-i "+l.Interface)
	case proxier.LocalModeInterfaceNamePrefix:
		out = append(out, "-i "+l.Interface+"+")
	}
	return out
}
