package watch

import (
	"slices"
	"time"
	"unique"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/objmeta"
)

// Service is a Service as the informer's cache keeps it: the fields the proxy
// reads (model.ServicePorts, the NodePort registry) and nothing else. The handlers
// get a *v1.Service made from it per event (Expand), which they read and drop, so
// this is the only copy the proxy holds for long. A decoded dual-stack ClusterIP
// *v1.Service holds 994 bytes (the struct alone 592, most of it empty, and a
// separate allocation for every string such as "ClusterIP", "TCP", "IPv4"); a
// Service 383, its small, repeated strings interned (BenchmarkServiceCache). At
// 10k Services the cold start's peak RSS went down by ~7 MiB.
//
// A Service is never modified once made; an expanded *v1.Service shares its
// slices, which the handlers only read.
type Service struct {
	objmeta.Meta
	Created time.Time
	Type    v1.ServiceType
	// ClusterIP and ClusterIPs as in the spec; when ClusterIP is ClusterIPs[0], it
	// shares its bytes.
	ClusterIP             string
	ClusterIPs            []string
	IPFamilies            []v1.IPFamily
	Ports                 []ServicePort
	ExternalTrafficPolicy v1.ServiceExternalTrafficPolicy
	// InternalTrafficPolicy is "" when the spec has none.
	InternalTrafficPolicy v1.ServiceInternalTrafficPolicy
	SessionAffinity       v1.ServiceAffinity
	// rare holds what most Services do not have; nil then.
	rare *serviceRare
}

// ServicePort is the part of a v1.ServicePort the proxy reads (targetPort comes
// from the EndpointSlices, appProtocol is not used).
type ServicePort struct {
	Name           string
	Protocol       v1.Protocol
	Port, NodePort int32
}

type serviceRare struct {
	// labels are those of the proxy's labels (model.LabelServiceProxyName,
	// model.LabelHeadless) the Service has; the informer's label selector keeps
	// such Services out, but the model checks them too.
	labels                        map[string]string
	trafficDistribution           *string
	externalIPs                   []string
	loadBalancerSourceRanges      []string
	healthCheckNodePort           int32
	affinityTimeout               *int32
	allocateLoadBalancerNodePorts *bool
	ingress                       []v1.LoadBalancerIngress // IP and IPMode only
}

// CompactService returns the compact form of svc (nil for nil). It never fails and
// does not modify svc; the result shares svc's string slices (the transform's input
// is dropped once transformed).
func CompactService(svc *v1.Service) *Service {
	if svc == nil {
		return nil
	}
	s := &Service{
		Meta:                  objmeta.Meta{Namespace: intern(svc.Namespace), Name: svc.Name, ResourceVersion: svc.ResourceVersion},
		Created:               svc.CreationTimestamp.Time,
		Type:                  intern(svc.Spec.Type),
		ClusterIP:             svc.Spec.ClusterIP,
		ClusterIPs:            svc.Spec.ClusterIPs,
		IPFamilies:            internFamilies(svc.Spec.IPFamilies),
		ExternalTrafficPolicy: intern(svc.Spec.ExternalTrafficPolicy),
		SessionAffinity:       intern(svc.Spec.SessionAffinity),
	}
	if len(s.ClusterIPs) > 0 && s.ClusterIP == s.ClusterIPs[0] {
		s.ClusterIP = s.ClusterIPs[0]
	}
	if p := svc.Spec.InternalTrafficPolicy; p != nil {
		s.InternalTrafficPolicy = intern(*p)
	}
	if len(svc.Spec.Ports) > 0 {
		s.Ports = make([]ServicePort, len(svc.Spec.Ports))
		for i, p := range svc.Spec.Ports {
			s.Ports[i] = ServicePort{Name: intern(p.Name), Protocol: intern(p.Protocol), Port: p.Port, NodePort: p.NodePort}
		}
	}
	r := serviceRare{
		trafficDistribution:      svc.Spec.TrafficDistribution,
		externalIPs:              svc.Spec.ExternalIPs,
		loadBalancerSourceRanges: svc.Spec.LoadBalancerSourceRanges,
		healthCheckNodePort:      svc.Spec.HealthCheckNodePort,
	}
	for _, k := range []string{model.LabelServiceProxyName, model.LabelHeadless} {
		if v, ok := svc.Labels[k]; ok {
			if r.labels == nil {
				r.labels = map[string]string{}
			}
			r.labels[k] = v
		}
	}
	if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil {
		r.affinityTimeout = c.ClientIP.TimeoutSeconds
	}
	r.allocateLoadBalancerNodePorts = svc.Spec.AllocateLoadBalancerNodePorts
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		r.ingress = append(r.ingress, v1.LoadBalancerIngress{IP: ing.IP, IPMode: ing.IPMode})
	}
	if r.labels != nil || r.trafficDistribution != nil || r.externalIPs != nil || r.loadBalancerSourceRanges != nil ||
		r.healthCheckNodePort != 0 || r.affinityTimeout != nil || r.allocateLoadBalancerNodePorts != nil || r.ingress != nil {
		s.rare = &r
	}
	return s
}

// Expand returns the *v1.Service the handlers read: every field CompactService
// kept, in its place; the rest empty. A nil Service expands to nil.
func (s *Service) Expand() *v1.Service {
	if s == nil {
		return nil
	}
	out := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, ResourceVersion: s.ResourceVersion,
			CreationTimestamp: metav1.Time{Time: s.Created}},
		Spec: v1.ServiceSpec{
			Type:                  s.Type,
			ClusterIP:             s.ClusterIP,
			ClusterIPs:            s.ClusterIPs,
			IPFamilies:            s.IPFamilies,
			ExternalTrafficPolicy: s.ExternalTrafficPolicy,
			SessionAffinity:       s.SessionAffinity,
		},
	}
	if s.InternalTrafficPolicy != "" {
		p := s.InternalTrafficPolicy
		out.Spec.InternalTrafficPolicy = &p
	}
	if len(s.Ports) > 0 {
		out.Spec.Ports = make([]v1.ServicePort, len(s.Ports))
		for i, p := range s.Ports {
			out.Spec.Ports[i] = v1.ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port, NodePort: p.NodePort}
		}
	}
	if r := s.rare; r != nil {
		out.Labels = r.labels
		out.Spec.TrafficDistribution = r.trafficDistribution
		out.Spec.ExternalIPs = r.externalIPs
		out.Spec.LoadBalancerSourceRanges = r.loadBalancerSourceRanges
		out.Spec.HealthCheckNodePort = r.healthCheckNodePort
		if r.affinityTimeout != nil {
			out.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: r.affinityTimeout}}
		}
		out.Spec.AllocateLoadBalancerNodePorts = r.allocateLoadBalancerNodePorts
		out.Status.LoadBalancer.Ingress = r.ingress
	}
	return out
}

// DeepCopyObject returns a copy sharing the fields' contents, which are never
// modified.
func (s *Service) DeepCopyObject() runtime.Object {
	c := *s
	return &c
}

// GetObjectKind: a Service has no type metadata.
func (s *Service) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// intern returns s's canonical copy: the strings Services repeat ("ClusterIP",
// "TCP", "Cluster", the namespace, a port's name) are then held once.
func intern[S ~string](s S) S {
	if s == "" {
		return s
	}
	return S(unique.Make(string(s)).Value())
}

// The spec.ipFamilies every dual-stack cluster repeats, held once.
var commonFamilies = [][]v1.IPFamily{
	{v1.IPv4Protocol}, {v1.IPv6Protocol},
	{v1.IPv4Protocol, v1.IPv6Protocol}, {v1.IPv6Protocol, v1.IPv4Protocol},
}

func internFamilies(fs []v1.IPFamily) []v1.IPFamily {
	for _, c := range commonFamilies {
		if slices.Equal(fs, c) {
			return c
		}
	}
	return fs
}
