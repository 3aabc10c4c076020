package nftables

// The ruleset of one family (IPv4 shown; IPv6 is the same in table ip6 with
// 16-byte addresses). Rules are google/nftables expressions; this is their nft-like
// reading. N is an endpoint count in use, T an affinity timeout in use, L a
// loadBalancerSourceRanges prefix length in use: their sets and rules appear when
// first needed and go at a full sync once unused.
//
//	table ip dsproxy {            # or dsproxy-b: a rebuild swaps names
//	  map endpoints      { type ipv4_addr . inet_proto . inet_service . integer : ipv4_addr . inet_service }  # target . index → ep
//	  set svc-N          { type ipv4_addr . inet_proto . inet_service }          # ClusterIPs with N endpoints
//	  map ext-N, ext-local-N, ext-short-N  { type ipv4_addr . inet_proto . inet_service : <target key> }
//	  map np-N, np-local-N, np-short-N     { type inet_proto . inet_service : <target key> }
//	  (each also as <name>-aT with ClientIP affinity)
//	  map affinity       { saddr . target : ep; flags dynamic,timeout; size 65535 }
//	  set endpoint-valid { target . ep }                     # affinity services only
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
//	  chain services {
//	    <not from local pods> ip daddr @cluster-ips meta mark set mark | 0x4000   # MasqueradeAll: unconditional
//	    jump clusterip-lb
//	    <from local pods> jump short-circuit-pod          # one rule per local CIDR / the interface
//	    fib saddr type local jump short-circuit-node
//	    jump external-lb
//	  }
//	  chain clusterip-lb {   # per N:
//	    ip daddr . meta l4proto . th dport @svc-N dnat to ip daddr . meta l4proto . th dport . numgen random mod N map @endpoints
//	  }
//	  chain external-lb {    # per N; the map lookup rewrites the key registers to the target key
//	    ip daddr . meta l4proto . th dport map @ext-N → key; mark set mark | 0x4000; dnat to key . numgen random mod N map @endpoints
//	    ip daddr . meta l4proto . th dport map @ext-local-N → key; dnat to key . numgen random mod N map @endpoints
//	    <nodeport addr> meta l4proto . th dport map @np-N → key; mark set mark | 0x4000; dnat ...
//	    <nodeport addr> meta l4proto . th dport map @np-local-N → key; dnat ...
//	  }
//	  chain short-circuit-pod  { @ext-short-N and @np-short-N rules, no mark }   # ETP Local → cluster endpoints
//	  chain short-circuit-node { the same rules, marking for masquerade }
//	  # with affinity T, each rule is two: (1) saddr . key lookup @affinity → ep, ep valid in
//	  # @endpoint-valid, update @affinity, dnat ep; (2) numgen → ep via @endpoints, delete and
//	  # add @affinity { saddr . key timeout T : ep }, dnat ep.
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
// Target keys: addr . proto . port of the ClusterIP, with the proto field's first
// padding byte 0 for the ClusterIP's own endpoint list and 1 for the other list
// (Local vs Cluster) external traffic needs, so both coexist in @endpoints. Packets
// always load 0 there, so only a map lookup can produce a marker-1 key.
