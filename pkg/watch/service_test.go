package watch

import (
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
)

// compactCases are Services with every field the proxy reads set one way or
// another, with fields it does not read around them.
func compactCases() map[string]*v1.Service {
	created := metav1.NewTime(time.Date(2026, 11, 25, 1, 2, 3, 0, time.UTC))
	base := func(name string) *v1.Service {
		return &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: "7", UID: types.UID("u-" + name),
				Generation: 3, CreationTimestamp: created,
				Labels:      map[string]string{"app": name},
				Annotations: map[string]string{"note": "x"}, Finalizers: []string{"f"}},
			Spec: v1.ServiceSpec{
				Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10", "fd00:96::10"},
				IPFamilies: []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}, IPFamilyPolicy: ptr.To(v1.IPFamilyPolicyRequireDualStack),
				Selector:              map[string]string{"app": name},
				Ports:                 []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("web"), AppProtocol: ptr.To("http")}},
				SessionAffinity:       v1.ServiceAffinityNone,
				InternalTrafficPolicy: ptr.To(v1.ServiceInternalTrafficPolicyCluster),
			},
			Status: v1.ServiceStatus{Conditions: []metav1.Condition{{Type: "x", Status: "True"}}},
		}
	}
	cases := map[string]*v1.Service{"ClusterIP dual-stack": base("a")}

	s := base("np")
	s.Spec.Type, s.Spec.ExternalTrafficPolicy = v1.ServiceTypeNodePort, v1.ServiceExternalTrafficPolicyLocal
	s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, NodePort: 30053},
		v1.ServicePort{Name: "sctp", Protocol: v1.ProtocolSCTP, Port: 9, NodePort: 30009})
	s.Spec.Ports[0].NodePort = 30080
	s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	s.Spec.TrafficDistribution = ptr.To("PreferClose")
	s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To(int32(60))}}
	cases["NodePort, Local, affinity, three protocols"] = s

	s = base("lb")
	s.Spec.Type, s.Spec.ExternalTrafficPolicy = v1.ServiceTypeLoadBalancer, v1.ServiceExternalTrafficPolicyLocal
	s.Spec.HealthCheckNodePort = 32000
	s.Spec.Ports[0].NodePort = 30081
	s.Spec.AllocateLoadBalancerNodePorts = ptr.To(false)
	s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24", "2001:db8::/64", "bad"}
	s.Spec.ExternalIPs = []string{"198.51.100.1", "2001:db8::1", "nope"}
	s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
		{IP: "203.0.113.1", Hostname: "lb.example", Ports: []v1.PortStatus{{Port: 80, Protocol: v1.ProtocolTCP}}},
		{IP: "2001:db8::2", IPMode: ptr.To(v1.LoadBalancerIPModeProxy)},
		{IP: "203.0.113.2", IPMode: ptr.To(v1.LoadBalancerIPModeVIP)},
		{Hostname: "only.example"},
	}
	s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{}}
	cases["LoadBalancer with everything"] = s

	s = base("v6")
	s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Spec.IPFamilies = "fd00:96::11", []string{"fd00:96::11"}, []v1.IPFamily{v1.IPv6Protocol}
	cases["IPv6 single-stack"] = s

	s = base("old")
	s.Spec.ClusterIPs, s.Spec.IPFamilies, s.Spec.InternalTrafficPolicy = nil, nil, nil
	cases["clusterIP only, no families, no policy"] = s

	s = base("odd")
	s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.12", []string{"10.96.0.13", "not-an-ip"}
	s.Spec.IPFamilies = []v1.IPFamily{"IPv7"}
	s.Spec.Ports = []v1.ServicePort{{Port: 0}, {Name: "x", Protocol: "ICMP", Port: 1}, {Port: 70000, NodePort: -1}}
	s.Spec.Type = "Strange"
	cases["malformed fields kept as they are"] = s

	s = base("headless")
	s.Spec.ClusterIP, s.Spec.ClusterIPs = v1.ClusterIPNone, []string{v1.ClusterIPNone}
	s.Labels[model.LabelHeadless] = ""
	s.Labels[model.LabelServiceProxyName] = "other"
	cases["headless, labelled for another proxy"] = s

	s = base("ext")
	s.Spec = v1.ServiceSpec{Type: v1.ServiceTypeExternalName, ExternalName: "example.com"}
	cases["ExternalName"] = s

	cases["empty"] = &v1.Service{}
	return cases
}

// proxyView is svc without what the proxy does not read: what a compact Service
// must give back, field for field. A field the model or the NodePort registry
// reads must not be cleared here.
func proxyView(svc *v1.Service) *v1.Service {
	c := svc.DeepCopy()
	c.ObjectMeta = metav1.ObjectMeta{Namespace: svc.Namespace, Name: svc.Name, ResourceVersion: svc.ResourceVersion,
		CreationTimestamp: svc.CreationTimestamp}
	for _, k := range []string{model.LabelServiceProxyName, model.LabelHeadless} {
		if v, ok := svc.Labels[k]; ok {
			if c.Labels == nil {
				c.Labels = map[string]string{}
			}
			c.Labels[k] = v
		}
	}
	c.Spec.Selector, c.Spec.IPFamilyPolicy, c.Spec.ExternalName = nil, nil, ""
	c.Spec.LoadBalancerIP, c.Spec.LoadBalancerClass, c.Spec.PublishNotReadyAddresses = "", nil, false
	for i := range c.Spec.Ports {
		c.Spec.Ports[i].TargetPort, c.Spec.Ports[i].AppProtocol = intstr.IntOrString{}, nil
	}
	// A config without a timeout reads as none (the default timeout).
	if a := c.Spec.SessionAffinityConfig; a != nil && (a.ClientIP == nil || a.ClientIP.TimeoutSeconds == nil) {
		c.Spec.SessionAffinityConfig = nil
	}
	for i := range c.Status.LoadBalancer.Ingress {
		c.Status.LoadBalancer.Ingress[i].Hostname, c.Status.LoadBalancer.Ingress[i].Ports = "", nil
	}
	c.Status.Conditions = nil
	return c
}

// A compact Service expands to every field the proxy reads, as it was: the
// expanded Service equals the original less the unread fields, and the model
// derives the same ports and skips from both, for both families.
func TestCompactService(t *testing.T) {
	for name, svc := range compactCases() {
		t.Run(name, func(t *testing.T) {
			orig := svc.DeepCopy()
			c := CompactService(svc)
			if !reflect.DeepEqual(svc, orig) {
				t.Errorf("CompactService modified its input:\n%s", cmp.Diff(orig, svc))
			}
			got := c.Expand()
			if d := cmp.Diff(proxyView(svc), got); d != "" {
				t.Errorf("expanded Service differs from the proxy's view (-want +got):\n%s", d)
			}
			for _, f := range family.All {
				wp, ws := model.ServicePorts(f, svc)
				gp, gs := model.ServicePorts(f, got)
				if !reflect.DeepEqual(wp, gp) || !reflect.DeepEqual(ws, gs) {
					t.Errorf("%s: ServicePorts of the expanded Service: %v %v, want %v %v", f.Name, gp, gs, wp, ws)
				}
			}
			// The informer's key function and meta.Accessor work on it.
			if key, err := cache.MetaNamespaceKeyFunc(c); err != nil || key != cacheKey(svc) {
				t.Errorf("key %q (%v), want %q", key, err, cacheKey(svc))
			}
			if m, err := meta.Accessor(c); err != nil || m.GetResourceVersion() != svc.ResourceVersion {
				t.Errorf("meta.Accessor: %v %v", m, err)
			}
			if d, ok := c.DeepCopyObject().(*Service); !ok || d == c || !reflect.DeepEqual(d, c) {
				t.Errorf("DeepCopyObject gave %#v", d)
			}
		})
	}
	if (*Service)(nil).Expand() != nil || CompactService(nil) != nil {
		t.Error("nil did not convert to nil")
	}
}

func cacheKey(svc *v1.Service) string {
	if svc.Namespace == "" {
		return svc.Name
	}
	return svc.Namespace + "/" + svc.Name
}

// Two Services' repeated strings are held once.
func TestCompactServiceInterns(t *testing.T) {
	cs := compactCases()
	// As decoded: the clusterIP is not the same string as clusterIPs[0].
	cs["ClusterIP dual-stack"].Spec.ClusterIP = strings.Clone(cs["ClusterIP dual-stack"].Spec.ClusterIPs[0])
	a, b := CompactService(cs["ClusterIP dual-stack"]), CompactService(cs["IPv6 single-stack"])
	same := func(what string, x, y string) {
		t.Helper()
		if unsafe.StringData(x) != unsafe.StringData(y) {
			t.Errorf("%s: %q held twice", what, x)
		}
	}
	same("namespace", a.Namespace, b.Namespace)
	same("type", string(a.Type), string(b.Type))
	same("protocol", string(a.Ports[0].Protocol), string(b.Ports[0].Protocol))
	same("port name", a.Ports[0].Name, b.Ports[0].Name)
	same("internalTrafficPolicy", string(a.InternalTrafficPolicy), string(b.InternalTrafficPolicy))
	same("clusterIP", a.ClusterIP, a.ClusterIPs[0])
	if &a.IPFamilies[0] != &CompactService(cs["NodePort, Local, affinity, three protocols"]).IPFamilies[0] {
		t.Error("ipFamilies held twice")
	}
	if a.rare != nil {
		t.Errorf("a plain ClusterIP Service has rare fields: %+v", a.rare)
	}
}

// The handlers get expanded Services from the informer's compact ones.
func TestServiceHandlers(t *testing.T) {
	rec := &recorder{}
	hs := serviceHandlers(rec)
	svc := compactCases()["NodePort, Local, affinity, three protocols"]
	c := CompactService(svc)
	hs.OnAdd(c, false)
	hs.OnUpdate(c, c)
	hs.OnDelete(cache.DeletedFinalStateUnknown{Key: "ns/np", Obj: c})
	hs.OnAdd(svc, false) // not the cache's type: dropped
	if len(rec.got) != 4 {
		t.Fatalf("handlers got %d Services, want 4 (add, update old and new, delete)", len(rec.got))
	}
	for i, g := range rec.got {
		if d := cmp.Diff(proxyView(svc), g); d != "" {
			t.Errorf("call %d (-want +got):\n%s", i, d)
		}
	}
	if rec.got[1] == rec.got[2] {
		t.Error("update's old and new are the same *v1.Service")
	}
}

type recorder struct {
	Handler
	got []*v1.Service
}

func (r *recorder) OnServiceAdd(s *v1.Service)           { r.got = append(r.got, s) }
func (r *recorder) OnServiceUpdate(old, cur *v1.Service) { r.got = append(r.got, old, cur) }
func (r *recorder) OnServiceDelete(s *v1.Service)        { r.got = append(r.got, s) }

// BenchmarkServiceCache prints what the Service informer's cache holds per
// Service: decoded API objects (as before) or compact Services. The Services are
// shaped as the end-to-end benchmark's (dual-stack ClusterIP, one TCP port, API
// defaults) and decoded from protobuf, so every string is its own allocation as
// in a real informer.
func BenchmarkServiceCache(b *testing.B) {
	const n = 10000
	wire := make([][]byte, n)
	for i := range wire {
		svc := &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i), ResourceVersion: fmt.Sprint(1000 + i),
				UID: "0b0e7a52-4c4e-4a8e-9d3e-5f7a1c2b3d4e", CreationTimestamp: metav1.Now()},
			Spec: v1.ServiceSpec{
				Type: v1.ServiceTypeClusterIP, ClusterIP: fmt.Sprintf("10.96.%d.%d", i/256, i%256),
				ClusterIPs: []string{fmt.Sprintf("10.96.%d.%d", i/256, i%256), fmt.Sprintf("fd00:96::%x", i)},
				IPFamilies: []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}, IPFamilyPolicy: ptr.To(v1.IPFamilyPolicyRequireDualStack),
				Ports:           []v1.ServicePort{{Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
				SessionAffinity: v1.ServiceAffinityNone, InternalTrafficPolicy: ptr.To(v1.ServiceInternalTrafficPolicyCluster),
			},
		}
		var err error
		if wire[i], err = svc.Marshal(); err != nil {
			b.Fatal(err)
		}
	}
	for _, form := range []string{"decoded", "compact"} {
		b.Run(form, func(b *testing.B) {
			var perService float64
			for b.Loop() {
				held := make([]any, n)
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				for i, w := range wire {
					svc := &v1.Service{}
					if err := svc.Unmarshal(w); err != nil {
						b.Fatal(err)
					}
					held[i] = svc
					if form == "compact" {
						held[i] = CompactService(svc)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perService = float64(after.HeapAlloc-before.HeapAlloc) / n
				runtime.KeepAlive(held)
			}
			b.ReportMetric(perService, "B/service")
			b.ReportMetric(perService*n/1e6, "MB/10k")
		})
	}
}
