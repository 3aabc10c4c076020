package model

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/family"
)

// svcFor builds a single-port ClusterIP Service whose only ClusterIP is in family f,
// then lets mutate change it.
func svcFor(f *family.Family, mutate func(*v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  testaddr.Svc(f, 10).String(),
			ClusterIPs: []string{testaddr.Svc(f, 10).String()},
			Ports:      []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	if mutate != nil {
		mutate(s)
	}
	return s
}

func dualStack(s *v1.Service) {
	s.Spec.ClusterIPs = []string{testaddr.Svc(family.IPv4, 10).String(), testaddr.Svc(family.IPv6, 10).String()}
	s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
}

func TestServicePorts(t *testing.T) {
	type want struct {
		ports int // number of ports this family serves
		check func(f *family.Family, sp *ServicePort) string
		skips []string // substrings expected among skip reasons
	}
	cases := []struct {
		name   string
		svc    func(f *family.Family) *v1.Service
		want   want
		forOwn bool // the case's Service is single-stack in the family under test
	}{
		{name: "single-stack ClusterIP", svc: func(f *family.Family) *v1.Service { return svcFor(f, nil) },
			want: want{ports: 1, check: func(f *family.Family, sp *ServicePort) string {
				if sp.ClusterIP != testaddr.Svc(f, 10) || sp.Port != 80 || sp.Protocol != v1.ProtocolTCP || sp.Name.Port != "http" {
					return "wrong basics: " + sp.String()
				}
				if sp.NodePort != 0 || sp.AffinitySeconds != 0 || sp.ExternallyAccessible() {
					return "unexpected extras"
				}
				return ""
			}}},
		{name: "other family's single-stack Service is ignored",
			svc:  func(f *family.Family) *v1.Service { return svcFor(f.Other(), nil) },
			want: want{ports: 0}},
		{name: "dual-stack Service served by both with own ClusterIP",
			svc: func(f *family.Family) *v1.Service { return svcFor(f, dualStack) },
			want: want{ports: 1, check: func(f *family.Family, sp *ServicePort) string {
				if sp.ClusterIP != testaddr.Svc(f, 10) {
					return "ClusterIP " + sp.ClusterIP.String()
				}
				return ""
			}}},
		{name: "clusterIPs empty falls back to clusterIP",
			svc: func(f *family.Family) *v1.Service {
				return svcFor(f, func(s *v1.Service) { s.Spec.ClusterIPs = nil })
			}, want: want{ports: 1}},
		{name: "headless, ExternalName and other proxies' Services ignored",
			svc: func(f *family.Family) *v1.Service {
				return svcFor(f, func(s *v1.Service) {
					s.Spec.ClusterIP, s.Spec.ClusterIPs = v1.ClusterIPNone, []string{v1.ClusterIPNone}
				})
			}, want: want{ports: 0}},
		{name: "ExternalName ignored", svc: func(f *family.Family) *v1.Service {
			return svcFor(f, func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName })
		}, want: want{ports: 0}},
		{name: "service-proxy-name label", svc: func(f *family.Family) *v1.Service {
			return svcFor(f, func(s *v1.Service) { s.Labels = map[string]string{LabelServiceProxyName: "other"} })
		}, want: want{ports: 0}},
		{name: "a Service with the slices' headless label is proxied, as by kube-proxy", svc: func(f *family.Family) *v1.Service {
			return svcFor(f, func(s *v1.Service) { s.Labels = map[string]string{LabelHeadless: ""} })
		}, want: want{ports: 1}},
		{name: "externalIPs and LB ingress split by family, Proxy ipMode dropped",
			svc: func(f *family.Family) *v1.Service {
				return svcFor(f, func(s *v1.Service) {
					dualStack(s)
					s.Spec.Type = v1.ServiceTypeLoadBalancer
					s.Spec.Ports[0].NodePort = 30080
					s.Spec.ExternalIPs = []string{testaddr.Ext(family.IPv6, 2).String(), testaddr.Ext(family.IPv4, 2).String(), testaddr.Ext(f, 2).String()}
					s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
						{IP: testaddr.Ext(family.IPv4, 3).String()},
						{IP: testaddr.Ext(family.IPv6, 3).String(), IPMode: ptr.To(v1.LoadBalancerIPModeVIP)},
						{IP: testaddr.Ext(f, 4).String(), IPMode: ptr.To(v1.LoadBalancerIPModeProxy)},
						{Hostname: "lb.example"},
					}
				})
			},
			want: want{ports: 1, check: func(f *family.Family, sp *ServicePort) string {
				if len(sp.ExternalIPs) != 1 || sp.ExternalIPs[0] != testaddr.Ext(f, 2) {
					return "externalIPs " + addrsString(sp.ExternalIPs)
				}
				if len(sp.LoadBalancerVIPs) != 1 || sp.LoadBalancerVIPs[0] != testaddr.Ext(f, 3) {
					return "VIPs " + addrsString(sp.LoadBalancerVIPs)
				}
				if sp.NodePort != 30080 {
					return "nodePort"
				}
				return ""
			}}},
		{name: "source ranges of the family, masked; other family's do not restrict",
			svc: func(f *family.Family) *v1.Service {
				return svcFor(f, func(s *v1.Service) {
					s.Spec.Type = v1.ServiceTypeLoadBalancer
					s.Spec.LoadBalancerSourceRanges = []string{" " + testaddr.Prefix(testaddr.Client(f, 1), 24).String(),
						testaddr.Client(f.Other(), 1).String() + "/8", "not-a-cidr"}
				})
			},
			want: want{ports: 1, skips: []string{`"not-a-cidr" is not a valid CIDR`}, check: func(f *family.Family, sp *ServicePort) string {
				if len(sp.SourceRanges) != 1 || sp.SourceRanges[0] != testaddr.Prefix(testaddr.Client(f, 1), 24) {
					return "ranges wrong"
				}
				return ""
			}}},
		{name: "a zero-length source range allows everything",
			svc: func(f *family.Family) *v1.Service {
				return svcFor(f, func(s *v1.Service) {
					s.Spec.Type = v1.ServiceTypeLoadBalancer
					s.Spec.LoadBalancerSourceRanges = []string{testaddr.Prefix(testaddr.Client(f, 1), 24).String(), f.AnyPrefix.String()}
				})
			},
			want: want{ports: 1, check: func(f *family.Family, sp *ServicePort) string {
				if len(sp.SourceRanges) != 0 {
					return "ranges not empty"
				}
				return ""
			}}},
		{name: "ClientIP affinity defaults, and clamps",
			svc: func(f *family.Family) *v1.Service {
				return svcFor(f, func(s *v1.Service) {
					s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
					s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "b", Port: 81})
				})
			},
			want: want{ports: 2, check: func(f *family.Family, sp *ServicePort) string {
				if sp.AffinitySeconds != DefaultAffinitySeconds {
					return "affinity"
				}
				if sp.Name.Port == "b" && sp.Protocol != v1.ProtocolTCP {
					return "empty protocol not defaulted to TCP"
				}
				return ""
			}}},
		{name: "externalTrafficPolicy Local with health check node port",
			svc: func(f *family.Family) *v1.Service {
				return svcFor(f, func(s *v1.Service) {
					s.Spec.Type = v1.ServiceTypeLoadBalancer
					s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
					s.Spec.HealthCheckNodePort = 32000
					s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
					s.Spec.TrafficDistribution = ptr.To(v1.ServiceTrafficDistributionPreferClose)
				})
			},
			want: want{ports: 1, check: func(f *family.Family, sp *ServicePort) string {
				if !sp.ExternalPolicyLocal || !sp.InternalPolicyLocal || sp.HealthCheckNodePort != 32000 || sp.TrafficDistribution != "PreferClose" {
					return "policy fields"
				}
				return ""
			}}},
		{name: "externalTrafficPolicy Local on a plain ClusterIP Service means nothing",
			svc: func(f *family.Family) *v1.Service {
				return svcFor(f, func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal })
			},
			want: want{ports: 1, check: func(f *family.Family, sp *ServicePort) string {
				if sp.ExternalPolicyLocal {
					return "ExternalPolicyLocal set"
				}
				return ""
			}}},
		{name: "bad ports skipped one by one",
			svc: func(f *family.Family) *v1.Service {
				return svcFor(f, func(s *v1.Service) {
					s.Spec.Ports = append(s.Spec.Ports,
						v1.ServicePort{Name: "zero", Port: 0},
						v1.ServicePort{Name: "big", Port: 70000},
						v1.ServicePort{Name: "icmp", Port: 1, Protocol: "ICMP"},
						v1.ServicePort{Name: "np", Port: 2, NodePort: -1},
						v1.ServicePort{Name: "http", Port: 8080, Protocol: v1.ProtocolTCP})
				})
			},
			want: want{ports: 1, skips: []string{"spec.ports[1].port", "spec.ports[2].port", `unsupported protocol "ICMP"`, "spec.ports[4].nodePort",
				`spec.ports[0] skipped: duplicate port name "http" for TCP: spec.ports[5] is served`},
				check: func(f *family.Family, sp *ServicePort) string {
					if sp.Port != 8080 {
						return "of two ports named http, the first is served (kube-proxy serves the last)"
					}
					return ""
				}}},
		{name: "a bad clusterIPs entry of the other family leaves this one served",
			svc: func(f *family.Family) *v1.Service {
				return svcFor(f, func(s *v1.Service) {
					dualStack(s)
					s.Spec.ClusterIPs[slices.Index(family.All, f.Other())] = "bogus"
				})
			},
			want: want{ports: 1, check: func(f *family.Family, sp *ServicePort) string {
				if sp.ClusterIP != testaddr.Svc(f, 10) {
					return "ClusterIP " + sp.ClusterIP.String()
				}
				return ""
			}}},
		{name: "a bad clusterIPs entry of this family skips the Service in it",
			svc: func(f *family.Family) *v1.Service {
				return svcFor(f, func(s *v1.Service) {
					dualStack(s)
					s.Spec.ClusterIPs[slices.Index(family.All, f)] = "bogus"
				})
			},
			want: want{ports: 0, skips: []string{`"bogus" is not a valid IP address`}}},
		{name: "a bad ingress IP is reported at its index",
			svc: func(f *family.Family) *v1.Service {
				return svcFor(f, func(s *v1.Service) {
					s.Spec.Type = v1.ServiceTypeLoadBalancer
					s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
						{Hostname: "lb.example"},
						{IP: testaddr.Ext(f, 7).String(), IPMode: ptr.To(v1.LoadBalancerIPModeProxy)},
						{IP: "bogus"},
						{IP: testaddr.Ext(f, 8).String()},
					}
				})
			},
			want: want{ports: 1, skips: []string{`status.loadBalancer.ingress[2] skipped: "bogus"`}, check: func(f *family.Family, sp *ServicePort) string {
				if len(sp.LoadBalancerVIPs) != 1 || sp.LoadBalancerVIPs[0] != testaddr.Ext(f, 8) {
					return "VIPs " + addrsString(sp.LoadBalancerVIPs)
				}
				return ""
			}}},
		{name: "padded externalIPs skipped and reported, blank ones ignored",
			svc: func(f *family.Family) *v1.Service {
				return svcFor(f, func(s *v1.Service) {
					s.Spec.ExternalIPs = []string{" " + testaddr.Ext(f, 9).String(), "", " ", testaddr.Ext(f, 8).String() + "\n"}
				})
			},
			want: want{ports: 1, skips: []string{`spec.externalIPs[0] skipped: " `, `spec.externalIPs[3] skipped: "`}, check: func(f *family.Family, sp *ServicePort) string {
				if len(sp.ExternalIPs) != 0 {
					return "padded externalIPs served: " + addrsString(sp.ExternalIPs)
				}
				return ""
			}}},
		{name: "invalid ClusterIP skips the Service",
			svc: func(f *family.Family) *v1.Service {
				return svcFor(f, func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.0.0.300"} })
			}, want: want{ports: 0, skips: []string{`"10.0.0.300" is not a valid IP address`}}},
		{name: "invalid externalIP skipped, rest kept",
			svc: func(f *family.Family) *v1.Service {
				return svcFor(f, func(s *v1.Service) { s.Spec.ExternalIPs = []string{"bogus", testaddr.Ext(f, 9).String()} })
			},
			want: want{ports: 1, skips: []string{`"bogus"`}, check: func(f *family.Family, sp *ServicePort) string {
				if len(sp.ExternalIPs) != 1 {
					return "externalIPs"
				}
				return ""
			}}},
	}
	for _, f := range family.All {
		for _, tc := range cases {
			t.Run(f.Name+"/"+tc.name, func(t *testing.T) {
				ports, skips := ServicePorts(f, tc.svc(f))
				if len(ports) != tc.want.ports {
					t.Fatalf("got %d ports, want %d (skips %v)", len(ports), tc.want.ports, skips)
				}
				for _, sp := range ports {
					if !f.Contains(sp.ClusterIP) {
						t.Errorf("ClusterIP %s not of family %s", sp.ClusterIP, f)
					}
					if tc.want.check != nil {
						if msg := tc.want.check(f, sp); msg != "" {
							t.Errorf("%s: %s", sp, msg)
						}
					}
				}
				all := ""
				for _, s := range skips {
					all += s.Error() + "\n"
				}
				for _, w := range tc.want.skips {
					if !strings.Contains(all, w) {
						t.Errorf("skips %q do not mention %q", all, w)
					}
				}
				if len(tc.want.skips) == 0 && len(skips) != 0 {
					t.Errorf("unexpected skips: %s", all)
				}
			})
		}
	}
}

func addrsString(as []netip.Addr) string {
	var b strings.Builder
	for _, a := range as {
		b.WriteString(a.String() + " ")
	}
	return b.String()
}

func TestServicePortsNilAndNameless(t *testing.T) {
	if p, s := ServicePorts(family.IPv4, nil); p != nil || s != nil {
		t.Fatal("nil Service produced output")
	}
	svc := svcFor(family.IPv4, func(s *v1.Service) { s.Name = "" })
	if p, s := ServicePorts(family.IPv4, svc); p != nil || len(s) != 1 {
		t.Fatalf("nameless Service: ports %v skips %v", p, s)
	}
}

// Objects stored before v1.36's StrictIPCIDRValidation may spell addresses and
// ranges with leading zeros or IPv4-mapped: they are read as kube-proxy reads
// them. A source range read as invalid would leave the VIP open to every source.
func TestServicePortsLegacyAddresses(t *testing.T) {
	f := family.IPv4
	svc := svcFor(f, func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.ExternalIPs = []string{"010.001.002.003", "::ffff:1.2.3.5"}
		s.Spec.LoadBalancerSourceRanges = []string{"010.0.0.0/8"}
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "010.001.002.004"}}
	})
	ports, skips := ServicePorts(f, svc)
	if len(ports) != 1 || len(skips) != 0 {
		t.Fatalf("%d ports, skips %v", len(ports), skips)
	}
	sp := ports[0]
	if want := []netip.Addr{netip.MustParseAddr("1.2.3.5"), netip.MustParseAddr("10.1.2.3")}; !slices.Equal(sp.ExternalIPs, want) {
		t.Errorf("ExternalIPs %v, want %v", sp.ExternalIPs, want)
	}
	if want := []netip.Addr{netip.MustParseAddr("10.1.2.4")}; !slices.Equal(sp.LoadBalancerVIPs, want) {
		t.Errorf("LoadBalancerVIPs %v, want %v", sp.LoadBalancerVIPs, want)
	}
	if want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}; !slices.Equal(sp.SourceRanges, want) {
		t.Errorf("SourceRanges %v, want %v (an empty list lets every source in)", sp.SourceRanges, want)
	}
	if ports6, _ := ServicePorts(family.IPv6, svcFor(family.IPv6, func(s *v1.Service) { s.Spec.ExternalIPs = []string{"::ffff:1.2.3.5"} })); len(ports6) != 1 || len(ports6[0].ExternalIPs) != 0 {
		t.Errorf("IPv6: an IPv4-mapped ExternalIP taken as IPv6: %v", ports6)
	}
}
