// Package ipvs is dsproxy's IPVS backend: one family's Services as IPVS virtual
// servers, in the shape of kube-proxy's IPVS mode, programmed through pkg/ipvs
// (netlink) and a fixed iptables ruleset.
//
// Per service port and family:
//
//	IPVS virtual server (masquerading real servers, weight 1, --ipvs-scheduler;
//	ClientIP affinity as persistence with the affinity timeout):
//	  <clusterIP>:<port>                     real servers: the internal endpoints
//	  <externalIP or VIP>:<port>             real servers: the external endpoints
//	  <each NodePort address>:<nodePort>     real servers: the external endpoints
//	  (no endpoints: no virtual server; the filter rules refuse or drop new
//	  connections instead of IPVS, whose own ICMP error a local TCP client takes
//	  as soft; a TCP port that loses its last endpoint keeps its virtual server
//	  while the connections it carries drain, as kube-proxy keeps it; an external
//	  address with traffic policy Local and endpoints on other nodes only keeps
//	  one with the cluster endpoints, for the node's and its pods' connections, as
//	  kube-proxy's IPVS mode: others are dropped, where kube-proxy's IPVS mode
//	  forwards them with their source, and the reply is usually lost)
//	dsproxy-ipvs0 (dummy link, up):          the ClusterIP, ExternalIPs and VIPs (not an
//	                                         address the node has on another link, as kube-proxy)
//	ipsets (DSIPVS-<name>, IPv6 DSIPVS6-<name>):
//	  CLUSTER-IP          clusterIP,proto:port
//	  EXTERNAL            external address,proto:port, traffic policy Cluster
//	  EXTERNAL-LOCAL      the same, traffic policy Local
//	  FIREWALL            VIP,proto:port with loadBalancerSourceRanges
//	  SOURCE-RANGES       VIP,proto:port,allowed range (and VIP,proto:port,VIP when a
//	                      range holds the node's IP: the node's own connections)
//	  LOOP-BACK           local endpoint,proto:port,endpoint (hairpin)
//	  NO-ENDPOINTS        address,proto:port of ports without endpoints anywhere
//	  NO-LOCAL-ENDPOINTS  ... with endpoints on other nodes only (traffic policy Local)
//	  NO-LOCAL-EXTERNAL   the same for an external address of a port whose cluster
//	                      endpoints then serve local sources (virtual server with them)
//	  IPS                 every address on dsproxy-ipvs0 (so not the node's own)
//	  HEALTH-CHECK        NodePort address (and the Service's ExternalIPs, VIPs),tcp:health check node port
//	  RESERVED            NodePort address,proto:port the other family holds
//
// The iptables rules (chains DSIPVS-*) depend on node settings only:
//
//	nat:
//	  PREROUTING, OUTPUT: -j DSIPVS-SERVICES
//	  POSTROUTING:        -j DSIPVS-POSTROUTING
//	  DSIPVS-SERVICES:    CLUSTER-IP dst,dst -j DSIPVS-MASQ-NONLOCAL (masqueradeAll: -j DSIPVS-MARK-MASQ;
//	                      no local-traffic detector: CLUSTER-IP src,dst -j DSIPVS-MARK-MASQ, the
//	                      node's connections, sourced from a Service address on the dummy link)
//	                      EXTERNAL dst,dst -j DSIPVS-MARK-MASQ
//	  DSIPVS-MASQ-NONLOCAL: <from local pods> -j RETURN; -j DSIPVS-MARK-MASQ
//	  DSIPVS-MARK-MASQ:   -j MARK --or-mark <masquerade bit>
//	  DSIPVS-POSTROUTING: LOOP-BACK dst,dst,src MASQUERADE; unmarked RETURN; clear the bit; MASQUERADE
//	mangle (the node's own connections: IPVS takes them at LOCAL_OUT, before filter):
//	  OUTPUT: -j DSIPVS-FIREWALL-OUTPUT: new, FIREWALL dst,dst and not SOURCE-RANGES dst,dst,src DROP
//	filter (INPUT runs before IPVS takes a packet, so it sees the Service address):
//	  INPUT:   -j DSIPVS-INPUT
//	  DSIPVS-INPUT:   FIREWALL dst,dst and not SOURCE-RANGES dst,dst,src DROP
//	                  NO-ENDPOINTS REJECT (TCP reset); NO-LOCAL-ENDPOINTS DROP
//	                  NO-LOCAL-EXTERNAL -j DSIPVS-NO-LOCAL-EXTERNAL: <from local pods> RETURN; DROP
//	                  CLUSTER-IP, EXTERNAL, EXTERNAL-LOCAL RETURN; HEALTH-CHECK ACCEPT
//	                  new connections to IPS (any other port) REJECT
//	                  new connections to RESERVED REJECT
//	  FORWARD: -j DSIPVS-FORWARD: ct INVALID DROP (not with TCPBeLiberal); -d <service CIDR> not in IPS DROP;
//	           marked ACCEPT; ESTABLISHED,RELATED ACCEPT
//	  OUTPUT:  -j DSIPVS-OUTPUT: -d <service CIDR> not in IPS DROP; NO-ENDPOINTS REJECT
//
// Each sync changes only what its changed ports changed: the backend keeps, per
// port, the virtual servers, members and addresses it rendered, with a count per
// member and address (ports of one Service share addresses), and makes the
// netlink requests for virtual servers whose wanted state changed and for members
// and addresses whose count crossed zero. A full sync (the first, one after a
// failure, a node change) lists the kernel's virtual servers, real servers,
// members and addresses, counts what differs from what the backend believed as
// repairs, and writes the iptables ruleset. As in kube-proxy, every virtual
// server of the family outside --ipvs-exclude-cidrs is the backend's.
//
// The order of the requests keeps serving what is served: an address is bound,
// then its ports join their sets, then it joins IPS (the INPUT rules refuse a
// new connection to a member of IPS at a port no set lets through), then the
// virtual servers change; removals go the other way. So a first sync adopts
// the virtual servers of kube-proxy's IPVS mode (their addresses on its own
// link) without refusing a connection (TestAdoptKeepsServing, and
// TestIPVSAdopt on a real kernel).
//
// A TCP real server whose endpoint went is drained, as kube-proxy drains one
// with connections: weight 0, so it gets no new connection, and deleted once
// IPVS counts no connection on it, by the same sync (its counts are read after
// the weight change), a later one or a periodic check. Unlike kube-proxy it is
// drained even when the counts show none: a connection scheduled between
// reading them and deleting it would be lost. The virtual server of a TCP port
// that lost its last endpoint is kept the same way while its real servers count
// connections, at weight 0, and goes with the last of them; without
// connections it goes at once (one operation, not two per real server), as does
// one no port renders any more (a Service, address or port gone: as in
// kube-proxy). Meanwhile the filter rules refuse new connections from outside,
// and the node's own get IPVS's ICMP error (IPVS takes them at LOCAL_OUT,
// before filter OUTPUT). UDP and SCTP real servers are
// deleted at once, as in kube-proxy, and as the other modes delete their
// conntrack flows: expire_nodest_conn ends a flow on its next packet, and the
// client's next datagram or new association goes to another endpoint.
package ipvs
