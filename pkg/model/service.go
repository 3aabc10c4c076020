package model

import (
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// Labels that exclude an object from a default proxy, as kube-proxy's informers do.
const (
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	LabelHeadless         = "service.kubernetes.io/headless"
)

// DefaultAffinitySeconds is the API default for sessionAffinityConfig.clientIP.timeoutSeconds.
const DefaultAffinitySeconds = 10800

// maxAffinitySeconds is the API's upper bound for the affinity timeout.
const maxAffinitySeconds = 86400

// ServicePorts converts a Service into the ports family f serves. It returns nil when
// the family does not serve the Service at all: ExternalName and headless Services,
// Services labelled for another proxy, and Services without a ClusterIP of family f.
// Bad fields are skipped and reported in skips; a bad port skips only that port.
func ServicePorts(f *family.Family, svc *v1.Service) (ports []*ServicePort, skips []*SkipError) {
	if svc == nil || skipService(svc) {
		return nil, nil
	}
	obj := "Service " + svc.Namespace + "/" + svc.Name
	if svc.Name == "" {
		return nil, []*SkipError{skipf(obj, "metadata.name", "empty")}
	}
	clusterIP, skip := clusterIPOf(f, svc, obj)
	if skip != nil {
		return nil, []*SkipError{skip}
	}
	if !clusterIP.IsValid() {
		return nil, nil
	}
	base := ServicePort{
		ClusterIP:           clusterIP,
		ExternalPolicyLocal: externalPolicyLocal(svc),
		InternalPolicyLocal: svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal,
		TrafficDistribution: derefString(svc.Spec.TrafficDistribution),
	}
	base.ExternalIPs, skips = familyAddrs(f, svc.Spec.ExternalIPs, obj, "spec.externalIPs", skips)
	base.LoadBalancerVIPs, skips = loadBalancerVIPs(f, svc, obj, skips)
	base.SourceRanges, skips = sourceRanges(f, svc, obj, skips)
	base.AffinitySeconds = affinitySeconds(svc)
	if svc.Spec.Type == v1.ServiceTypeLoadBalancer && base.ExternalPolicyLocal {
		if p := svc.Spec.HealthCheckNodePort; p > 0 && p <= 65535 {
			base.HealthCheckNodePort = uint16(p)
		} else {
			skips = append(skips, skipf(obj, "spec.healthCheckNodePort", "%d is not a valid port", p))
		}
	}
	hasNodePorts := svc.Spec.Type == v1.ServiceTypeNodePort || svc.Spec.Type == v1.ServiceTypeLoadBalancer
	nn := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	// Of ports sharing a name and protocol (the API server refuses them) the last
	// valid one is served, as kube-proxy's map of service ports keeps the last.
	seen := make(map[ServicePortName]int, len(svc.Spec.Ports)) // name → index in ports and in spec.ports
	at := make([]int, 0, len(svc.Spec.Ports))
	for i := range svc.Spec.Ports {
		sp, skip := servicePort(&base, nn, &svc.Spec.Ports[i], hasNodePorts, obj, i)
		if skip != nil {
			skips = append(skips, skip)
			continue
		}
		if j, dup := seen[sp.Name]; dup {
			skips = append(skips, skipf(obj, indexField("spec.ports", at[j], ""),
				"duplicate port name %q for %s: spec.ports[%d] is served", sp.Name.Port, sp.Protocol, i))
			ports[j], at[j] = sp, i
			continue
		}
		seen[sp.Name] = len(ports)
		ports = append(ports, sp)
		at = append(at, i)
	}
	return ports, skips
}

func skipService(svc *v1.Service) bool {
	if svc.Spec.Type == v1.ServiceTypeExternalName {
		return true
	}
	if _, ok := svc.Labels[LabelServiceProxyName]; ok {
		return true
	}
	// The headless label is the EndpointSlice controller's, on slices; a Service
	// carrying it is proxied, as by kube-proxy.
	return svc.Spec.ClusterIP == v1.ClusterIPNone || svc.Spec.ClusterIP == ""
}

// clusterIPOf returns the Service's ClusterIP of family f, or the zero Addr when it has
// none. spec.clusterIPs is authoritative; spec.clusterIP is used when it is empty.
// An entry that does not parse is reported only to a family that finds no address of
// its own: as in kube-proxy, a bad entry of one family leaves the other served.
func clusterIPOf(f *family.Family, svc *v1.Service, obj string) (netip.Addr, *SkipError) {
	ips := svc.Spec.ClusterIPs
	field := "spec.clusterIPs"
	if len(ips) == 0 {
		ips, field = []string{svc.Spec.ClusterIP}, "spec.clusterIP"
	}
	var bad *SkipError
	for i, s := range ips {
		a, ok := family.ParseIP(s)
		if !ok {
			if bad == nil {
				bad = skipf(obj, indexField(field, i, ""), "%q is not a valid IP address", s)
			}
			continue
		}
		if f.Contains(a) {
			return a, nil
		}
	}
	return netip.Addr{}, bad
}

func servicePort(base *ServicePort, nn types.NamespacedName, p *v1.ServicePort, hasNodePorts bool, obj string, i int) (*ServicePort, *SkipError) {
	proto := p.Protocol
	if proto == "" {
		proto = v1.ProtocolTCP
	}
	switch {
	case proto != v1.ProtocolTCP && proto != v1.ProtocolUDP && proto != v1.ProtocolSCTP:
		return nil, skipf(obj, indexField("spec.ports", i, ".protocol"), "unsupported protocol %q", p.Protocol)
	case p.Port <= 0 || p.Port > 65535:
		return nil, skipf(obj, indexField("spec.ports", i, ".port"), "%d is out of range 1-65535", p.Port)
	case p.NodePort < 0 || p.NodePort > 65535:
		return nil, skipf(obj, indexField("spec.ports", i, ".nodePort"), "%d is out of range 0-65535", p.NodePort)
	}
	sp := *base
	sp.Name = ServicePortName{NamespacedName: nn, Port: p.Name, Protocol: proto}
	sp.Port = uint16(p.Port)
	sp.Protocol = proto
	if hasNodePorts {
		sp.NodePort = uint16(p.NodePort)
	}
	return &sp, nil
}

// familyAddrs parses the addresses of family f among strs, sorted and deduplicated.
// Addresses of the other family are silently left to it, and so are blank strings;
// other invalid strings, whitespace-padded addresses among them, are reported and
// skipped, as kube-proxy skips them.
func familyAddrs(f *family.Family, strs []string, obj, field string, skips []*SkipError) ([]netip.Addr, []*SkipError) {
	var out []netip.Addr
	for i, s := range strs {
		if strings.TrimSpace(s) == "" {
			continue
		}
		a, ok := family.ParseIP(s)
		if !ok {
			skips = append(skips, skipf(obj, indexField(field, i, ""), "%q is not a valid IP address", s))
			continue
		}
		if f.Contains(a) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), skips
}

func loadBalancerVIPs(f *family.Family, svc *v1.Service, obj string, skips []*SkipError) ([]netip.Addr, []*SkipError) {
	if svc.Spec.Type != v1.ServiceTypeLoadBalancer {
		return nil, skips
	}
	// strs keeps the ingress indexes, for the skips: an entry not programmed
	// is blank, which familyAddrs passes over.
	strs := make([]string, len(svc.Status.LoadBalancer.Ingress))
	for i, ing := range svc.Status.LoadBalancer.Ingress {
		// ipMode Proxy means the load balancer delivers traffic to the node with the
		// node's address as destination; programming the VIP would short-circuit it.
		if ing.IPMode == nil || *ing.IPMode == v1.LoadBalancerIPModeVIP {
			strs[i] = ing.IP
		}
	}
	return familyAddrs(f, strs, obj, "status.loadBalancer.ingress", skips)
}

// sourceRanges returns the family's loadBalancerSourceRanges, masked. As in
// kube-proxy, a zero-length prefix of the family means "any source" and empties the
// list, and ranges of the other family do not restrict this family.
func sourceRanges(f *family.Family, svc *v1.Service, obj string, skips []*SkipError) ([]netip.Prefix, []*SkipError) {
	var out []netip.Prefix
	for i, s := range svc.Spec.LoadBalancerSourceRanges {
		p, ok := family.ParseCIDR(strings.TrimSpace(s))
		if !ok {
			skips = append(skips, skipf(obj, indexField("spec.loadBalancerSourceRanges", i, ""), "%q is not a valid CIDR", s))
			continue
		}
		if !f.ContainsPrefix(p) {
			continue
		}
		if p.Bits() == 0 {
			return nil, skips
		}
		out = append(out, p)
	}
	slices.SortFunc(out, comparePrefix)
	return slices.Compact(out), skips
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

func affinitySeconds(svc *v1.Service) uint32 {
	if svc.Spec.SessionAffinity != v1.ServiceAffinityClientIP {
		return 0
	}
	cfg := svc.Spec.SessionAffinityConfig
	if cfg == nil || cfg.ClientIP == nil || cfg.ClientIP.TimeoutSeconds == nil {
		return DefaultAffinitySeconds
	}
	t := *cfg.ClientIP.TimeoutSeconds
	switch {
	case t <= 0:
		return DefaultAffinitySeconds
	case t > maxAffinitySeconds:
		return maxAffinitySeconds
	}
	return uint32(t)
}

func externalPolicyLocal(svc *v1.Service) bool {
	accessible := svc.Spec.Type == v1.ServiceTypeLoadBalancer || svc.Spec.Type == v1.ServiceTypeNodePort ||
		(svc.Spec.Type == v1.ServiceTypeClusterIP && len(svc.Spec.ExternalIPs) > 0)
	return accessible && svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
}

func derefString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
