package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	ipt "github.com/dsproxy/dsproxy/pkg/iptables"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nfacct"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// Prefix starts the name of every chain the backend creates.
const Prefix = ipt.Prefix

// The dispatch chains: every service port has rules in some of them. A sync
// rewrites one whole or writes the rules that came and went (rules.emit).
const (
	chainServices         = Prefix + "SERVICES"  // nat and filter
	chainNodePorts        = Prefix + "NODEPORTS" // nat and filter
	chainPostrouting      = Prefix + "POSTROUTING"
	chainMarkMasq         = Prefix + "MARK-MASQ"
	chainMasqNonLocal     = Prefix + "MASQ-NONLOCAL"
	chainExternalServices = Prefix + "EXTERNAL-SERVICES"
	chainProxyFirewall    = Prefix + "PROXY-FIREWALL"
	chainForward          = Prefix + "FORWARD"
	chainFirewall         = Prefix + "FIREWALL"
	chainServiceCIDRs     = Prefix + "SERVICE-CIDRS"
	chainClusterIPs       = Prefix + "CLUSTER-IPS"
)

var (
	natGlobal    = []string{chainServices, chainNodePorts, chainPostrouting, chainMarkMasq, chainMasqNonLocal}
	filterGlobal = []string{chainServices, chainNodePorts, chainExternalServices, chainProxyFirewall, chainForward, chainFirewall, chainServiceCIDRs, chainClusterIPs}
)

// jump is a rule in a built-in chain that sends traffic to one of the backend's.
type jump struct {
	table, chain string
	rule         []string
}

// jumps lists the rules the backend keeps in the built-in chains, in the order they
// should end up at the head of each chain.
func jumps() []jump {
	ctNew := []string{"-m", "conntrack", "--ctstate", "NEW"}
	c := func(s string) []string { return []string{"-m", "comment", "--comment", s} }
	j := func(table, chain string, rule ...[]string) jump {
		return jump{table: table, chain: chain, rule: slices.Concat(rule...)}
	}
	to := func(chain string) []string { return []string{"-j", chain} }
	return []jump{
		j("nat", "PREROUTING", c("dsproxy service portals"), to(chainServices)),
		j("nat", "OUTPUT", c("dsproxy service portals"), to(chainServices)),
		j("nat", "POSTROUTING", c("dsproxy postrouting rules"), to(chainPostrouting)),
		j("filter", "INPUT", ctNew, c("dsproxy load balancer firewall"), to(chainProxyFirewall)),
		j("filter", "INPUT", ctNew, c("dsproxy externally-visible service portals"), to(chainExternalServices)),
		j("filter", "INPUT", c("dsproxy health check service ports"), to(chainNodePorts)),
		j("filter", "INPUT", to(chainFirewall)),
		j("filter", "FORWARD", ctNew, c("dsproxy load balancer firewall"), to(chainProxyFirewall)),
		j("filter", "FORWARD", c("dsproxy forwarding rules"), to(chainForward)),
		j("filter", "FORWARD", ctNew, c("dsproxy service portals"), to(chainServices)),
		j("filter", "FORWARD", ctNew, c("dsproxy externally-visible service portals"), to(chainExternalServices)),
		j("filter", "OUTPUT", ctNew, c("dsproxy load balancer firewall"), to(chainProxyFirewall)),
		j("filter", "OUTPUT", ctNew, c("dsproxy service portals"), to(chainServices)),
		j("filter", "OUTPUT", to(chainFirewall)),
	}
}

// hash names a chain after s: the first 16 base32 characters of its SHA-256, as
// kube-proxy names its chains (the names stay within iptables' 28 characters).
func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return base32.StdEncoding.EncodeToString(sum[:])[:16]
}

func svcChain(n model.ServicePortName) string { return Prefix + "SVC-" + hash(n.String()) }
func svlChain(n model.ServicePortName) string { return Prefix + "SVL-" + hash(n.String()) }
func extChain(n model.ServicePortName) string { return Prefix + "EXT-" + hash(n.String()) }
func fwChain(n model.ServicePortName) string  { return Prefix + "FW-" + hash(n.String()) }

// sepChain names the chain of one local endpoint of a port, which is also the
// name of the endpoint's xt_recent list for session affinity.
func sepChain(n model.ServicePortName, ep *model.Endpoint) string {
	return Prefix + "SEP-" + hash(n.String()+"|"+ep.String())
}

// config is what rendering needs beyond the state: the node settings of the sync
// and the backend's options.
type config struct {
	node        *proxier.NodeConfig
	masqMark    string // "0x4000/0x4000"
	masqBit     string // "0x4000"
	random      bool   // MASQUERADE --random-fully
	localhostNP bool   // IPv4 NodePorts on 127.0.0.0/8 (kube-proxy's localhostNodePorts)
	keepInvalid bool   // no ct INVALID DROP (Options.TCPBeLiberal)
	acctInvalid bool   // the INVALID DROP counts into nfacct.CTStateInvalidDropped
	acctLocalNP bool   // localhost NodePort connections count into nfacct.LocalhostNodePortsAccepted
}

// shape is which chains one service port has.
type shape struct {
	ps                 *model.PortState
	proto, port        string
	svc, svl, ext, fw  bool
	internal, external int // endpoint counts
	// short: the external chain sends local pods' traffic to the cluster
	// endpoints unmasqueraded (ETP Local); see hairpinned.
	short bool
}

func shapeOf(ps *model.PortState) shape {
	s := shape{ps: ps, proto: strings.ToLower(string(ps.Protocol)), port: strconv.Itoa(int(ps.Port))}
	s.svc = len(ps.Cluster) > 0
	s.svl = len(ps.Local) > 0
	s.internal = len(ps.InternalEndpoints())
	if ps.ExternallyAccessible() {
		s.external = len(ps.ExternalEndpoints())
		s.ext = s.external > 0 || (ps.ExternalPolicyLocal && s.svc)
		s.fw = s.ext && len(ps.LoadBalancerVIPs) > 0 && restricted(ps.SourceRanges)
		s.short = s.ext && s.svc && ps.ExternalPolicyLocal
	}
	return s
}

// hairpinned reports whether ep has a chain of its own, which masquerades it
// reaching itself: a local endpoint (or one whose slice names no node, which
// may be local), and with short every cluster endpoint. A
// pod on another node is inside the cluster CIDR, so its connection to this
// node's ETP Local NodePort (or an external address routed here) goes to the
// cluster endpoints unmasqueraded; sent to itself it would answer itself
// directly and never see the reply it waits for. kube-proxy gives every
// endpoint a chain; here ClusterIP traffic of remote pods, which only comes
// here when routed without their own node's proxy, is left out: that would
// triple the rules of every Service.
func (s *shape) hairpinned(ep *model.Endpoint) bool { return ep.Local || ep.NoNodeName || s.short }

// restricted reports whether source ranges limit anything (none, or one of length
// 0, allow every source).
func restricted(r []netip.Prefix) bool {
	return len(r) > 0 && !slices.ContainsFunc(r, func(p netip.Prefix) bool { return p.Bits() == 0 })
}

// chains lists the per-port chains of a port.
func (s *shape) chains() []string {
	n := s.ps.Name
	var out []string
	if s.svc {
		out = append(out, svcChain(n))
	}
	if s.svl {
		out = append(out, svlChain(n))
	}
	if s.ext {
		out = append(out, extChain(n))
	}
	if s.fw {
		out = append(out, fwChain(n))
	}
	for _, ep := range s.sepEndpoints() {
		out = append(out, sepChain(n, ep))
	}
	return out
}

// sepEndpoints are the port's endpoints with a chain (hairpinned), each once.
func (s *shape) sepEndpoints() []*model.Endpoint {
	var out []*model.Endpoint
	seen := map[netip.AddrPort]bool{}
	for _, list := range [][]model.Endpoint{s.ps.Cluster, s.ps.Local} {
		for i := range list {
			if ap := list[i].AddrPort(); s.hairpinned(&list[i]) && !seen[ap] {
				seen[ap] = true
				out = append(out, &list[i])
			}
		}
	}
	return out
}

// rules is one table's part of an iptables-restore input. Rules of per-port
// chains go straight to body (their chain declared, so flushed, first). The
// dispatch chains are collected as content: a head of per-port rules in no
// particular order and a tail that must stay last; emit then writes each one
// whole, or only the difference from what the kernel holds.
type rules struct {
	decl, body, del strings.Builder
	n               int // rules written
	content         map[string]*chainContent
}

// chainContent is a dispatch chain's rules, each the words after "-A chain".
type chainContent struct {
	head, tail []string
}

func newRules(chains []string) *rules {
	r := &rules{content: map[string]*chainContent{}}
	for _, ch := range chains {
		r.content[ch] = &chainContent{}
	}
	return r
}

func (r *rules) declare(chain string) { fmt.Fprintf(&r.decl, ":%s - [0:0]\n", chain) }

// delete flushes and removes a chain (its declaration flushes it).
func (r *rules) delete(chain string) {
	r.declare(chain)
	fmt.Fprintf(&r.del, "-X %s\n", chain)
}

// line writes one rule command (-A, -I or -D) to body.
func (r *rules) line(cmd, chain, rule string) {
	r.n++
	r.body.WriteString(cmd)
	r.body.WriteByte(' ')
	r.body.WriteString(chain)
	r.body.WriteByte(' ')
	r.body.WriteString(rule)
	r.body.WriteByte('\n')
}

// add appends one rule to a per-port chain; args are words, already quoted where
// needed.
func (r *rules) add(chain string, args ...string) { r.line("-A", chain, strings.Join(args, " ")) }

// head and tail add a rule to a dispatch chain's head or tail.
func (r *rules) head(chain string, args ...string) {
	c := r.content[chain]
	c.head = append(c.head, strings.Join(args, " "))
}

func (r *rules) tail(chain string, args ...string) {
	c := r.content[chain]
	c.tail = append(c.tail, strings.Join(args, " "))
}

// writeWhole writes a dispatch chain whole: declared (so flushed), then every
// rule of head (each once) and tail appended.
func (r *rules) writeWhole(chain string, head, tail []string) {
	r.declare(chain)
	seen := make(map[string]bool, len(head))
	for _, l := range head {
		if !seen[l] {
			seen[l] = true
			r.line("-A", chain, l)
		}
	}
	for _, l := range tail {
		r.line("-A", chain, l)
	}
}

// writeTo writes the table's section, if it has anything to write.
func (r *rules) writeTo(out *strings.Builder, table string) {
	if r.decl.Len()+r.body.Len()+r.del.Len() == 0 {
		return
	}
	fmt.Fprintf(out, "*%s\n", table)
	out.WriteString(r.decl.String())
	out.WriteString(r.body.String())
	out.WriteString(r.del.String())
	out.WriteString("COMMIT\n")
}

// reject is the target that refuses a new connection of proto at once: a TCP reset
// for TCP (as the nftables backend does), ICMP port unreachable otherwise.
func reject(proto string) string {
	if proto == "tcp" {
		return "REJECT --reject-with tcp-reset"
	}
	return "REJECT"
}

func comment(s string) string { return `-m comment --comment "` + s + `"` }

func hostPrefix(a netip.Addr) string { return netip.PrefixFrom(a, a.BitLen()).String() }

// portMatch matches the port's protocol and destination port p.
func (s *shape) portMatch(p string) string {
	return "-p " + s.proto + " -m " + s.proto + " --dport " + p
}

// nodePortDests are the destination matches of NodePort traffic, one rule each.
func (c *config) nodePortDests() []string {
	f, np := c.node.Family, c.node.NodePortAddresses
	if np.MatchAll {
		if c.localhostNP {
			return []string{"-m addrtype --dst-type LOCAL"}
		}
		return []string{"! -d " + f.Loopback.String() + " -m addrtype --dst-type LOCAL"}
	}
	var out []string
	for _, a := range np.Addrs {
		out = append(out, "-d "+hostPrefix(a))
	}
	if c.localhostNP {
		for _, a := range np.Loopback {
			out = append(out, "-d "+hostPrefix(a))
		}
	}
	return out
}

// localPodMatches match traffic from local pods, one rule each (none without a
// local-traffic detector).
func (c *config) localPodMatches() []string {
	l := c.node.Local
	switch l.Mode {
	case proxier.LocalModeClusterCIDR, proxier.LocalModeNodeCIDR:
		var out []string
		for _, p := range l.CIDRs {
			if c.node.Family.Contains(p.Addr()) {
				out = append(out, "-s "+p.String())
			}
		}
		return out
	case proxier.LocalModeBridgeInterface:
		return []string{"-i " + l.Interface}
	case proxier.LocalModeInterfaceNamePrefix:
		return []string{"-i " + l.Interface + "+"}
	}
	return nil
}

// globalRules collects the port's rules in the dispatch chains: nat
// DSPROXY-SERVICES and DSPROXY-NODEPORTS, and the filter chains.
func (c *config) globalRules(s *shape, nat, filter *rules) {
	ps := s.ps
	name := ps.Name.String()
	cip := "-d " + hostPrefix(ps.ClusterIP)
	svcPort := s.portMatch(s.port)
	// Without endpoints: reject, or drop when only other nodes have some.
	target, none := reject(s.proto), " has no endpoints"
	if ps.HasAny {
		target, none = "DROP", " has no local endpoints"
	}
	// Any other port of the ClusterIP is refused (the Service's ports write the
	// same two rules; a chain holds them once).
	svcName := comment(ps.Name.Namespace + "/" + ps.Name.Name + " port not served")
	catchAll := chainClusterIPs
	if slices.ContainsFunc(c.node.ServiceCIDRs, func(p netip.Prefix) bool { return p.Contains(ps.ClusterIP) }) {
		catchAll = chainServiceCIDRs
	}
	// The two are disjoint: the rules of a dispatch chain's head may be in any
	// order.
	filter.head(catchAll, svcName, cip, "-p tcp", "-j", reject("tcp"))
	filter.head(catchAll, svcName, cip, "! -p tcp", "-j", reject(""))
	if p := ps.HealthCheckNodePort; p != 0 {
		filter.head(chainNodePorts, comment(ps.Name.Namespace+"/"+ps.Name.Name+" health check node port"), "-p tcp -m tcp --dport "+strconv.Itoa(int(p)), "-j ACCEPT")
	}
	if s.internal > 0 {
		to := svcChain(ps.Name)
		if ps.InternalPolicyLocal {
			to = svlChain(ps.Name)
		}
		nat.head(chainServices, comment(name+" cluster IP"), cip, svcPort, "-j", to)
	} else {
		filter.head(chainServices, comment(name+none), cip, svcPort, "-j", target)
	}
	if !ps.ExternallyAccessible() {
		return
	}
	ext := slices.Concat(ps.ExternalIPs, ps.LoadBalancerVIPs)
	slices.SortFunc(ext, netip.Addr.Compare)
	ext = slices.Compact(ext)
	if s.ext {
		for _, a := range ext {
			to := extChain(ps.Name)
			if s.fw && slices.Contains(ps.LoadBalancerVIPs, a) {
				to = fwChain(ps.Name)
			}
			nat.head(chainServices, comment(name+" external IP"), "-d "+hostPrefix(a), svcPort, "-j", to)
		}
		if ps.NodePort != 0 {
			nat.head(chainNodePorts, comment(name), s.portMatch(strconv.Itoa(int(ps.NodePort))), "-j", extChain(ps.Name))
		}
	}
	if s.fw {
		for _, vip := range ps.LoadBalancerVIPs {
			filter.head(chainProxyFirewall, comment(name+" traffic not accepted by "+fwChain(ps.Name)), "-d "+hostPrefix(vip), svcPort, "-j DROP")
		}
	}
	if s.external == 0 {
		for _, a := range ext {
			filter.head(chainExternalServices, comment(name+none), "-d "+hostPrefix(a), svcPort, "-j", target)
		}
		if ps.NodePort != 0 {
			// As kube-proxy's iptables mode: on every local address, whatever
			// nodePortAddresses and localhost NodePorts say, so a NodePort without
			// (local) endpoints is refused or dropped wherever it is dialled,
			// never handed to a process of the host.
			filter.head(chainExternalServices, comment(name+none), "-m addrtype --dst-type LOCAL", s.portMatch(strconv.Itoa(int(ps.NodePort))), "-j", target)
		}
	}
}

// portChains writes the port's own chains, declared (so flushed) first.
func (c *config) portChains(s *shape, nat *rules) {
	ps := s.ps
	n := ps.Name
	for _, ch := range s.chains() {
		nat.declare(ch)
	}
	cipMatch := "-d " + hostPrefix(ps.ClusterIP) + " " + s.portMatch(s.port)
	masq := ""
	switch {
	case c.node.MasqueradeAll:
		masq = chainMarkMasq
	case len(c.localPodMatches()) > 0:
		masq = chainMasqNonLocal
	}
	if s.svc {
		if !ps.InternalPolicyLocal && masq != "" {
			nat.add(svcChain(n), comment(n.String()+" cluster IP"), cipMatch, "-j", masq)
		}
		c.balance(s, svcChain(n), ps.Cluster, nat)
	}
	if s.svl {
		if ps.InternalPolicyLocal && masq != "" {
			nat.add(svlChain(n), comment(n.String()+" cluster IP"), cipMatch, "-j", masq)
		}
		c.balance(s, svlChain(n), ps.Local, nat)
	}
	if s.ext {
		ch := extChain(n)
		if !ps.ExternalPolicyLocal {
			nat.add(ch, comment("masquerade traffic for "+n.String()+" external destinations"), "-j", chainMarkMasq)
			nat.add(ch, "-j", svcChain(n))
		} else {
			if s.svc {
				for _, m := range c.localPodMatches() {
					nat.add(ch, comment("pod traffic for "+n.String()+" external destinations"), m, "-j", svcChain(n))
				}
				nat.add(ch, comment("masquerade LOCAL traffic for "+n.String()+" external destinations"), "-m addrtype --src-type LOCAL", "-j", chainMarkMasq)
				nat.add(ch, comment("route LOCAL traffic for "+n.String()+" external destinations"), "-m addrtype --src-type LOCAL", "-j", svcChain(n))
			}
			if s.svl {
				nat.add(ch, "-j", svlChain(n))
			}
		}
	}
	if s.fw {
		ch := fwChain(n)
		for _, r := range ps.SourceRanges {
			nat.add(ch, comment(n.String()+" loadbalancer IP"), "-s "+r.Masked().String(), "-j", extChain(n))
		}
		// A VIP bound on the node loops back with itself as source (kube-proxy).
		if c.node.NodeIP.IsValid() && slices.ContainsFunc(ps.SourceRanges, func(p netip.Prefix) bool { return p.Contains(c.node.NodeIP) }) {
			for _, vip := range ps.LoadBalancerVIPs {
				nat.add(ch, comment(n.String()+" loadbalancer IP"), "-s "+hostPrefix(vip), "-j", extChain(n))
			}
		}
	}
	for _, ep := range s.sepEndpoints() {
		c.sep(s, ep, nat)
	}
}

// balance writes the rules that pick one of eps: with session affinity first one
// rule per endpoint for clients it served recently (an xt_recent list per
// endpoint), then each endpoint with the probability that makes the choice
// uniform. A remote endpoint is DNATed there; a hairpinned one (local) goes to
// its chain, which also masquerades it reaching itself.
func (c *config) balance(s *shape, chain string, eps []model.Endpoint, nat *rules) {
	n := s.ps.Name
	proto := "-p " + s.proto + " -m " + s.proto
	aff := s.ps.AffinitySeconds
	to := func(ep *model.Endpoint) string {
		if s.hairpinned(ep) {
			return "-j " + sepChain(n, ep)
		}
		return "-j DNAT --to-destination " + ep.AddrPort().String()
	}
	if aff > 0 {
		for i := range eps {
			// --update refreshes the client's entry as the local endpoint's
			// chain does with --set.
			check := " --update"
			if s.hairpinned(&eps[i]) {
				check = " --rcheck"
			}
			nat.add(chain, comment(n.String()+" -> "+eps[i].String()), proto,
				"-m recent --name "+sepChain(n, &eps[i])+check+" --seconds "+strconv.Itoa(int(aff))+" --reap", to(&eps[i]))
		}
	}
	for i := range eps {
		m := proto
		if left := len(eps) - i; left > 1 {
			m += " -m statistic --mode random --probability " + strconv.FormatFloat(1/float64(left), 'f', 10, 64)
		}
		if aff > 0 && !s.hairpinned(&eps[i]) {
			m += " -m recent --name " + sepChain(n, &eps[i]) + " --set"
		}
		nat.add(chain, comment(n.String()+" -> "+eps[i].String()), m, to(&eps[i]))
	}
}

// sep writes the chain of a hairpinned endpoint: hairpin masquerade, DNAT.
func (c *config) sep(s *shape, ep *model.Endpoint, nat *rules) {
	n := s.ps.Name
	ch := sepChain(n, ep)
	nat.add(ch, comment(n.String()), "-s "+hostPrefix(ep.Addr), "-j", chainMarkMasq)
	aff := ""
	if s.ps.AffinitySeconds > 0 {
		aff = " -m recent --name " + ch + " --set"
	}
	nat.add(ch, comment(n.String()), "-p "+s.proto+" -m "+s.proto+aff, "-j DNAT --to-destination", ep.AddrPort().String())
}

// nodeTails writes the node-wide rules of the dispatch chains, in their tails:
// the NodePort jump, masquerading, forwarding, the service CIDRs and the NodePorts
// the other family reserves. None depends on a service port.
func (c *config) nodeTails(nat, filter *rules) {
	f := c.node.Family
	for _, d := range c.nodePortDests() {
		nat.tail(chainServices, comment("dsproxy service nodeports; NOTE: this must be the last rule in this chain"), d, "-j", chainNodePorts)
	}
	nat.tail(chainMarkMasq, "-j MARK --or-mark", c.masqBit)
	for _, m := range c.localPodMatches() {
		nat.tail(chainMasqNonLocal, m, "-j RETURN")
	}
	nat.tail(chainMasqNonLocal, "-j", chainMarkMasq)
	nat.tail(chainPostrouting, "-m mark ! --mark", c.masqMark, "-j RETURN")
	if c.localhostNP && c.acctLocalNP {
		// Every localhost NodePort connection with endpoints is DNATed and marked
		// for masquerading; nothing else DNATs from 127.0.0.0/8. Its first packet
		// passes here once, as in kube-proxy's per-NodePort counting rule.
		nat.tail(chainPostrouting, comment("localhost NodePort connections"), "-m conntrack --ctstate DNAT --ctorigdst", f.Loopback.String(),
			"-m nfacct --nfacct-name", nfacct.LocalhostNodePortsAccepted)
	}
	nat.tail(chainPostrouting, "-j MARK --xor-mark", c.masqBit)
	masq := "-j MASQUERADE"
	if c.random {
		masq += " --random-fully"
	}
	nat.tail(chainPostrouting, comment("dsproxy service traffic requiring SNAT"), masq)

	switch {
	case c.keepInvalid:
	case c.acctInvalid:
		filter.tail(chainForward, "-m conntrack --ctstate INVALID -m nfacct --nfacct-name", nfacct.CTStateInvalidDropped, "-j DROP")
	default:
		filter.tail(chainForward, "-m conntrack --ctstate INVALID", "-j DROP")
	}
	filter.tail(chainForward, comment("dsproxy forwarding rules"), "-m mark --mark", c.masqMark, "-j ACCEPT")
	filter.tail(chainForward, comment("dsproxy forwarding conntrack rule"), "-m conntrack --ctstate RELATED,ESTABLISHED", "-j ACCEPT")
	if c.localhostNP {
		lo := f.Loopback.String()
		filter.tail(chainFirewall, comment("block incoming localnet connections"), "-d "+lo, "! -s "+lo, "-m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT", "-j DROP")
	}
	// Only traffic to a service CIDR walks DSPROXY-SERVICE-CIDRS: the
	// load-balanced kind was DNATed to its endpoint before the filter table, so
	// its new connections pass one rule per CIDR, not two per ClusterIP. Then
	// DSPROXY-CLUSTER-IPS, for ClusterIPs outside every known service CIDR
	// (after the per-port rules, which may drop rather than refuse).
	for _, p := range c.node.ServiceCIDRs {
		filter.tail(chainServices, comment("service CIDR"), "-d "+p.Masked().String(), "-j", chainServiceCIDRs)
	}
	filter.tail(chainServices, "-j", chainClusterIPs)
	filter.tail(chainServiceCIDRs, comment("unallocated service address"), "-j DROP")
	for _, k := range c.node.ReservedNodePorts {
		proto := strings.ToLower(string(k.Protocol))
		for _, d := range c.nodePortDests() {
			filter.tail(chainExternalServices, comment(k.String()+" is reserved by the other family"), d, "-p "+proto+" -m "+proto+" --dport "+strconv.Itoa(int(k.Port)), "-j", reject(proto))
		}
	}
}
