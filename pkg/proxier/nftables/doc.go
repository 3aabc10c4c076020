package nftables

// The ruleset of one family (IPv4 shown; IPv6 is the same in table ip6 with
// 16-byte addresses). Rules are google/nftables expressions; this is their nft-like
// reading. A dispatch group is a kind of frontend (svc, ext, ext-local, ext-short,
// np, np-local, np-short), an endpoint count N and an affinity timeout T (-aT when
// set); each group has an id and, in each chain its kind dispatches in, a chain of
// its own holding its DNAT rule. A frontend's element in its kind's dispatch map
// names its group's id; the chain's verdict map sends the id to the group's chain.
// So a new connection costs two map lookups and one goto whatever the number of
// groups (a rule per group, walked in turn, cost ~0.15 µs per group a packet
// passed). Groups appear when first needed and go at a full sync once unused. A
// sync that creates the group of a count N also creates the (unused) spares N-1
// and N+1 when binding their rules is cheap (a rebuild, or endpoint maps under
// 20k elements), and a full sync keeps a spare while its neighbour is in use: a
// new rule that looks up @endpoints makes the kernel walk every element of it
// (~90 ms at 300k), so an endpoint count that changes by one is only element
// operations. A new group adds chains and verdict map elements; no chain is
// rewritten. Verdict maps hold only group ids (tens of elements): the kernel
// validates every jump/goto element of a table whenever a transaction adds one
// (~0.15 µs each, 4.6 ms for a 30k-element map), which a per-frontend verdict map
// would cost on every Service add.
//
//	table ip dsproxy {            # or dsproxy-b: a rebuild swaps names
//	  map endpoints          { type ipv4_addr . inet_proto . inet_service . mark : ipv4_addr . inet_service }  # frontend . index → ep
//	  map nodeport-endpoints { type inet_proto . inet_service . mark : ipv4_addr . inet_service }              # nodeport . index → ep
//	  map svc-groups, ext-groups, ext-local-groups, ext-short-groups { type ipv4_addr . inet_proto . inet_service : mark }  # frontend → group id
//	  map np-groups, np-local-groups, np-short-groups                { type inet_proto . inet_service : mark }
//	  map clusterip-lb-groups, external-lb-groups, nodeport-lb-groups,
//	      short-circuit-pod-groups, short-circuit-node-groups { type mark : verdict }  # group id → goto <chain>-<group>
//	  map affinity           { saddr . frontend : mark (index); flags dynamic,timeout; size 65535 }
//	  map nodeport-affinity  { saddr . nodeport : mark (index); flags dynamic,timeout; size 65535 }
//	  set cluster-ips, nodeport-ips { type ipv4_addr }
//	  set no-endpoint-services, no-local-endpoint-services, firewall-ips { addr . proto . port }
//	  set external-frontends { addr . proto . port }  # ExternalIPs and LB VIPs of ports with endpoints anywhere
//	  set no-endpoint-nodeports, no-local-endpoint-nodeports, reserved-nodeports { proto . port }
//	  set fw-allow-L     { addr . proto . port . ipv4_addr }  # VIP . (saddr & /L)
//	  set hairpin        { ipv4_addr . ipv4_addr }            # endpoint . itself: local ones, and remote ones short-circuits pick
//
//	  chain filter-prerouting-pre-dnat { type filter hook prerouting priority dstnat - 10; ct state new jump firewall-check }
//	  chain filter-output-pre-dnat     { type filter hook output priority dstnat - 10; ct state new jump firewall-check }
//	  chain filter-input   { type filter hook input priority filter;
//	    ct state new jump nodeport-endpoints-check; ct state new jump service-endpoints-check }
//	  chain filter-forward { type filter hook forward priority filter;
//	    ct state invalid drop;  # unless Options.TCPBeLiberal
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
//	  chain clusterip-lb {   # one dispatch rule per kind with groups:
//	    meta mark set ip daddr . meta l4proto . th dport map @svc-groups meta mark set meta mark meta mark vmap @clusterip-lb-groups
//	  }
//	  chain clusterip-lb-svc-N {
//	    dnat to ip daddr . meta l4proto . th dport . numgen random mod N map @endpoints
//	  }
//	  chain external-lb {
//	    <ext dispatch: @ext-groups, vmap @external-lb-groups>
//	    <ext-local dispatch: @ext-local-groups, vmap @external-lb-groups>
//	    <nodeport addr> ip daddr . meta l4proto . th dport != @external-frontends jump nodeport-lb
//	  }
//	  chain external-lb-ext-N       { meta mark set mark | 0x4000 dnat to ip daddr . meta l4proto . th dport . numgen random mod N map @endpoints }
//	  chain external-lb-ext-local-N { dnat to ... numgen random mod N map @endpoints }
//	  chain nodeport-lb {    # @np-groups and @np-local-groups, vmap @nodeport-lb-groups
//	    meta mark set meta l4proto . th dport map @np-groups meta mark set meta mark meta mark vmap @nodeport-lb-groups
//	    ...
//	  }
//	  chain nodeport-lb-np-N { meta mark set mark | 0x4000 dnat to meta l4proto . th dport . numgen random mod N map @nodeport-endpoints }
//	  chain short-circuit-pod  { ext-short and <nodeport addr> np-short dispatch, vmap @short-circuit-pod-groups }   # ETP Local → cluster endpoints
//	  chain short-circuit-node { the same with @short-circuit-node-groups, whose group chains mark for masquerade }
//	  # each kind picks from its own index range: svc "numgen random mod N", ext and np
//	  # "... offset 0x10000000", ext-local and np-local "offset 0x20000000", the
//	  # short-circuit kinds "offset 0x80000000", so frontends of different kinds
//	  # sharing an address, port and protocol never index each other's lists.
//	  # The dispatch rule passes the group id through the packet mark within the rule
//	  # (nft before 1.1 can't list a lookup keyed by another lookup's result): save the
//	  # mark, set it to the id, load it back as the verdict map key, restore the mark.
//	  # A frontend not in the map ends the rule before the mark is touched.
//	  # With affinity T, a group chain has three rules. Hit: the index of saddr . key
//	  # in @affinity (passed through the packet mark the same way) completes the
//	  # @endpoints key; update @affinity; dnat. Pick: numgen → index → ep via
//	  # @endpoints, delete and add @affinity { saddr . key timeout T : index }, dnat.
//	  # Full: when @affinity is full the add ends Pick, and this one picks as Pick
//	  # without the add. A rebuild carries the entries (with the time they have left)
//	  # into the new table and keeps each list's slots, so an index names the same
//	  # endpoint there. When an endpoint leaves a list and the last one moves into
//	  # its slot, the entries follow the moved endpoint (see affinity.go).
//	  # 0x4000 is the default Options.MasqueradeMark: 1 << the masquerade bit
//	  # (kube-proxy's nftables.masqueradeBit, or iptables.masqueradeBit when the
//	  # mode was left empty; 14 by default).
//	  # <nodeport addr> is "fib daddr type local ip daddr & 255.0.0.0 != 127.0.0.0", or
//	  # "ip daddr @nodeport-ips" when NodePort addresses are listed. The NodePort
//	  # dispatch (here and np-short's in the short-circuit chains) skips
//	  # @external-frontends: an ExternalIP or VIP that is a node address, at another
//	  # Service's NodePort, is its own Service's, as kube-proxy's @service-ips is
//	  # looked up before its NodePorts.
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
// elements in @endpoints (@nodeport-endpoints): key . index, index O+0..O+N-1 for
// the list the frontend uses (the ClusterIP's per internalTrafficPolicy, the
// others' per externalTrafficPolicy; O its kind's offset) and, for an ETP Local
// frontend, shortOffset+0..N-1 for the cluster list its short-circuit uses. No
// rule keys a lookup with another lookup's result: nft before 1.1 aborts listing
// such a rule (or dynset data), and that breaks every nft listing on the node,
// even "nft list tables"; the packet mark carries such values within a rule
// instead. The index and the group id are typed mark (4 bytes, host order, what
// numgen writes): nft aborts listing a concatenation with a sizeless integer
// field.
