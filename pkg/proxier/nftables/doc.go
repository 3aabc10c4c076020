package nftables

// The ruleset of one family (IPv4 shown; IPv6 is the same in table ip6 with
// 16-byte addresses). Rules are google/nftables expressions; this is their nft-like
// reading. N is an endpoint count in use, T an affinity timeout in use, L a
// loadBalancerSourceRanges prefix length in use: their sets and rules appear when
// first needed and go at a full sync once unused. A sync that creates the set of
// a count N also creates the (empty) spares N-1 and N+1 when binding their rules
// is cheap (a rebuild, or endpoint maps under 20k elements), and a full sync
// keeps a spare while its neighbour is in use: a new rule that looks up
// @endpoints makes the kernel walk every element of it (~90 ms at 300k), so an
// endpoint count that changes by one is only element operations. The rules of a
// new count are appended to their chain (nft.OpAppendRules), not the chain
// rewritten; a rebuild orders each kind's used counts first, spares last.
//
//	table ip dsproxy {            # or dsproxy-b: a rebuild swaps names
//	  map endpoints          { type ipv4_addr . inet_proto . inet_service . mark : ipv4_addr . inet_service }  # frontend . index → ep
//	  map nodeport-endpoints { type inet_proto . inet_service . mark : ipv4_addr . inet_service }              # nodeport . index → ep
//	  set svc-N, ext-N, ext-local-N, ext-short-N  { type ipv4_addr . inet_proto . inet_service }  # frontends with N endpoints
//	  set np-N, np-local-N, np-short-N            { type inet_proto . inet_service }
//	  (each also as <name>-aT with ClientIP affinity)
//	  map affinity           { saddr . frontend : mark (index); flags dynamic,timeout; size 65535 }
//	  map nodeport-affinity  { saddr . nodeport : mark (index); flags dynamic,timeout; size 65535 }
//	  set cluster-ips, nodeport-ips { type ipv4_addr }
//	  set no-endpoint-services, no-local-endpoint-services, firewall-ips { addr . proto . port }
//	  set no-endpoint-nodeports, no-local-endpoint-nodeports, reserved-nodeports { proto . port }
//	  set fw-allow-L     { addr . proto . port . ipv4_addr }  # VIP . (saddr & /L)
//	  set hairpin        { ipv4_addr . ipv4_addr }            # local endpoint . itself
//
//	  chain filter-prerouting-pre-dnat { type filter hook prerouting priority dstnat - 10; ct state new jump firewall-check }
//	  chain filter-output-pre-dnat     { type filter hook output priority dstnat - 10; ct state new jump firewall-check }
//	  chain filter-input   { type filter hook input priority filter;
//	    ct state new jump nodeport-endpoints-check; ct state new jump service-endpoints-check }
//	  chain filter-forward { type filter hook forward priority filter; ct state invalid drop;
//	    ct state new jump service-endpoints-check; ct state new jump cluster-ips-check }
//	  chain filter-output  { type filter hook output priority filter;
//	    ct state new jump service-endpoints-check; ct state new jump cluster-ips-check }
//	  chain nat-prerouting  { type nat hook prerouting priority dstnat; jump services }
//	  chain nat-output      { type nat hook output priority dstnat; jump services }
//	  chain nat-postrouting { type nat hook postrouting priority srcnat; jump masquerading }
//
//	  chain services {      # jumps only to chains that have rules
//	    ip daddr @cluster-ips jump clusterip
//	    <from local pods> jump short-circuit-pod          # one rule per local CIDR / the interface
//	    fib saddr type local jump short-circuit-node
//	    jump external-lb
//	  }
//	  chain clusterip {
//	    <not from local pods> meta mark set mark | 0x4000   # MasqueradeAll: unconditional
//	    jump clusterip-lb
//	  }
//	  chain clusterip-lb {   # per N:
//	    ip daddr . meta l4proto . th dport @svc-N dnat to ip daddr . meta l4proto . th dport . numgen random mod N map @endpoints
//	  }
//	  chain external-lb {    # per N:
//	    ip daddr . meta l4proto . th dport @ext-N meta mark set mark | 0x4000 dnat to ip daddr . meta l4proto . th dport . numgen random mod N map @endpoints
//	    ip daddr . meta l4proto . th dport @ext-local-N dnat to ... numgen random mod N map @endpoints
//	    <nodeport addr> jump nodeport-lb
//	  }
//	  chain nodeport-lb {    # per N:
//	    meta l4proto . th dport @np-N meta mark set mark | 0x4000 dnat to meta l4proto . th dport . numgen random mod N map @nodeport-endpoints
//	    meta l4proto . th dport @np-local-N dnat ...
//	  }
//	  chain short-circuit-pod  { @ext-short-N and <nodeport addr> @np-short-N rules, no mark, "numgen random mod N offset 0x80000000" }   # ETP Local → cluster endpoints
//	  chain short-circuit-node { the same rules, marking for masquerade }
//	  # with affinity T, each rule is two. Hit: the index of saddr . key in @affinity
//	  # (passed through the packet mark, which is restored in the same rule) completes
//	  # the @endpoints key; update @affinity; dnat. Pick: numgen → index → ep via
//	  # @endpoints, delete and add @affinity { saddr . key timeout T : index }, dnat.
//	  # <nodeport addr> is "fib daddr type local ip daddr & 255.0.0.0 != 127.0.0.0", or
//	  # "ip daddr @nodeport-ips" when NodePort addresses are listed.
//
//	  chain masquerading {
//	    meta mark & 0x4000 != 0 meta mark set mark & ~0x4000 masquerade fully-random
//	    ct status dnat ip saddr . ip daddr @hairpin masquerade fully-random
//	  }
//	  chain service-endpoints-check {
//	    ip daddr . meta l4proto . th dport @no-endpoint-services meta l4proto tcp reject with tcp reset
//	    ip daddr . meta l4proto . th dport @no-endpoint-services reject with icmp port-unreachable
//	    ip daddr . meta l4proto . th dport @no-local-endpoint-services drop
//	  }
//	  chain nodeport-endpoints-check {   # all rules start with <nodeport addr>
//	    meta l4proto . th dport @no-endpoint-nodeports reject (tcp reset / icmp)
//	    meta l4proto . th dport @reserved-nodeports reject (tcp reset / icmp)
//	    meta l4proto . th dport @no-local-endpoint-nodeports drop
//	  }
//	  chain cluster-ips-check {
//	    ip daddr @cluster-ips reject (tcp reset / icmp)
//	    ip daddr & <service CIDR mask> == <service CIDR> drop     # per ServiceCIDR
//	  }
//	  chain firewall-check {
//	    ip daddr . meta l4proto . th dport . (ip saddr & /L) @fw-allow-L return   # per L
//	    ip daddr . meta l4proto . th dport @firewall-ips drop
//	  }
//	}
//
// Every frontend (ClusterIP, ExternalIP, LoadBalancer VIP, NodePort) has its own
// elements in @endpoints (@nodeport-endpoints): key . index, index 0..N-1 for the
// list the frontend uses (the ClusterIP's per internalTrafficPolicy, the others' per
// externalTrafficPolicy) and, for an ETP Local frontend, shortOffset+0..N-1 for the
// cluster list its short-circuit uses. No rule maps one key to another: nft before
// 1.1 aborts listing a rule whose lookup key (or dynset data) holds another
// lookup's result, and that breaks every nft listing on the node, even "nft list
// tables". The index is typed mark (4 bytes, host order, what numgen writes): nft
// aborts listing a concatenation with a sizeless integer field.
