// Package iptables is dsproxy's iptables backend: one family's Services programmed
// as iptables (or ip6tables) rules in the nat and filter tables, in the shape of
// kube-proxy's iptables mode, with dsproxy's chain prefix so that it never touches,
// or is touched by, kube-proxy's KUBE- chains.
//
// Every sync is one iptables-restore --noflush transaction, and writes only what
// changed: the chains of the service ports in req.Changed, and in the dispatch
// chains (DSPROXY-SERVICES, DSPROXY-NODEPORTS, the filter chains, ...) only the
// rules that came or went, deleted by their spec and inserted at the top ("-D",
// "-I ... 1"), so a one-endpoint change rewrites one chain and a Service add or
// delete a few rules, whatever the number of Services. A full sync (so the first,
// and one after a failure) rewrites every chain, deletes DSPROXY- chains nothing
// wants and re-inserts any missing jump from a built-in chain; a node change
// rewrites every chain. Only
// endpoints on this node have a chain (to masquerade one reaching itself through
// its Service, hairpin), and the remote cluster endpoints of an ETP Local port
// with external destinations (a pod of another node short-circuited to itself
// through this node's NodePort); a port's chain DNATs to the others itself, with an
// xt_recent list per endpoint for session affinity. That keeps the rule and chain
// counts, which iptables-nft's restore time grows with, at about a third of
// kube-proxy's. Per service port and family (the hash is the first 16 base32
// characters of the SHA-256 of the port's name, and of the name and endpoint):
//
//	nat:
//	  PREROUTING, OUTPUT:  -j DSPROXY-SERVICES
//	  POSTROUTING:         -j DSPROXY-POSTROUTING
//	  DSPROXY-SERVICES:    -d <clusterIP> -p <proto> --dport <port> -j <SVC or SVL>
//	                       -d <externalIP or VIP> ... -j DSPROXY-EXT-<h>   (VIP with source ranges: DSPROXY-FW-<h>)
//	                       <nodeport addresses> -j DSPROXY-NODEPORTS       (last)
//	  DSPROXY-NODEPORTS:   -p <proto> --dport <nodePort> -j DSPROXY-EXT-<h>
//	  DSPROXY-SVC-<h>:     (clusterIP traffic) -j DSPROXY-MASQ-NONLOCAL, or -j DSPROXY-MARK-MASQ with masqueradeAll
//	                       affinity: -m recent --name <endpoint list> --update ... -j DNAT per endpoint
//	                       -m statistic --mode random --probability 1/(n-i) [-m recent --set] -j DNAT
//	                       (a local endpoint, or any of ETP Local's: -j DSPROXY-SEP-<e> instead, and --rcheck)
//	  DSPROXY-SVL-<h>:     the same over the local endpoints (traffic policy Local)
//	  DSPROXY-EXT-<h>:     ETP Cluster: -j DSPROXY-MARK-MASQ; -j DSPROXY-SVC-<h>
//	                       ETP Local: <from local pods> -j SVC; <from the node> mark, -j SVC; -j SVL
//	  DSPROXY-FW-<h>:      -s <source range> -j DSPROXY-EXT-<h>   (the rest falls through; filter drops it)
//	  DSPROXY-MASQ-NONLOCAL: <from local pods> -j RETURN; -j DSPROXY-MARK-MASQ
//	  DSPROXY-MARK-MASQ:   -j MARK --or-mark <masquerade bit>
//	  DSPROXY-SEP-<e>:     -s <endpoint> -j DSPROXY-MARK-MASQ (hairpin); [-m recent --set] -j DNAT
//	  DSPROXY-POSTROUTING: unmarked RETURN; [IPv4 localhost NodePorts: count DNATed
//	                       from 127/8 into nfacct localhost_nps_accepted_pkts];
//	                       clear the bit; MASQUERADE [--random-fully]
//	filter (new connections):
//	  INPUT:   DSPROXY-PROXY-FIREWALL, DSPROXY-EXTERNAL-SERVICES, DSPROXY-NODEPORTS, DSPROXY-FIREWALL
//	  FORWARD: DSPROXY-PROXY-FIREWALL, DSPROXY-FORWARD, DSPROXY-SERVICES, DSPROXY-EXTERNAL-SERVICES
//	  OUTPUT:  DSPROXY-PROXY-FIREWALL, DSPROXY-SERVICES, DSPROXY-FIREWALL
//	  DSPROXY-SERVICES:          ClusterIP ports without endpoints REJECT (DROP when only other
//	                             nodes have some); -d <service CIDR> -j DSPROXY-SERVICE-CIDRS;
//	                             -j DSPROXY-CLUSTER-IPS
//	  DSPROXY-SERVICE-CIDRS:     any other port of a ClusterIP REJECT (TCP reset, ! -p tcp
//	                             ICMP); then the unallocated addresses DROP
//	  DSPROXY-CLUSTER-IPS:       the same REJECTs for ClusterIPs outside every known CIDR
//	  DSPROXY-EXTERNAL-SERVICES: external destinations without endpoints REJECT or DROP;
//	                             NodePorts the other family reserves REJECT
//	  DSPROXY-PROXY-FIREWALL:    VIPs with source ranges DROP (allowed sources were DNATed)
//	  DSPROXY-NODEPORTS:         health check node ports ACCEPT
//	  DSPROXY-FORWARD:           ct INVALID DROP, counted into nfacct ct_state_invalid_dropped_pkts
//	                             (not with nf_conntrack_tcp_be_liberal);
//	                             marked ACCEPT; ESTABLISHED,RELATED ACCEPT
//	  DSPROXY-FIREWALL:          IPv4 with localhost NodePorts: 127/8 from outside DROP
//
// Filter rules see packets after DNAT, so a destination still equal to a Service
// address there was not load-balanced: that is how "no endpoints", "port not
// served" and "source not allowed" are told apart without tracking state.
//
// The rules a dispatch chain holds for service ports (its head) are disjoint, so
// their order never matters and a sync may insert new ones at the top. (Not
// when two Services claim one address and port, e.g. an ExternalIP that is
// another Service's ClusterIP: the rule inserted last wins until a full
// rewrite, which writes them in port-name order; kube-proxy writes them in
// map order, so there too which one wins is not defined.) Rules
// that must come last (the tail: the NodePort jump, the CIDR jumps, the DROP of
// unallocated addresses) depend only on node settings, and a change of those
// rewrites everything. The backend keeps every port's head rules with a count per
// rule, so a partial sync costs what its changed ports cost, whatever the number
// of Services. Because partial syncs rewrite a dispatch chain whole only when
// its tail changes, the periodic check (Flushed) counts each one's rules in the
// kernel against those counts and the tails: one flushed or edited by hand,
// like a table flushed (the canary chains gone), brings a full sync.
package iptables
