// Package bench generates the cluster workloads dsproxy is measured on and holds its
// benchmarks. The same generator feeds the micro-benchmarks and the end-to-end runs,
// so the figures describe one workload.
package bench

import (
	"fmt"
	"net/netip"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dsproxy/dsproxy/pkg/endpointslice"
	"github.com/dsproxy/dsproxy/pkg/family"
)

// Workload describes a synthetic cluster: Services dual-stack Services, each with one
// TCP port and one EndpointSlice per family holding EndpointsPerFamily endpoints (or,
// with CountSpread > 0, Service i holds 1 + i%CountSpread: that many distinct
// endpoint counts). Every NodePortEvery-th Service is of type NodePort (0: none).
type Workload struct {
	Services           int
	EndpointsPerFamily int
	CountSpread        int
	NodePortEvery      int
	NodeName           string
}

// EndpointCount is the number of endpoints per family of Service i.
func (w Workload) EndpointCount(i int) int {
	if w.CountSpread > 0 {
		return 1 + i%w.CountSpread
	}
	return w.EndpointsPerFamily
}

// ServiceIP returns Service i's ClusterIP in family f: 10.96.0.0/12 and fd00:96::/108
// hold a million Services.
func ServiceIP(f *family.Family, i int) netip.Addr {
	if f == family.IPv4 {
		return netip.AddrFrom4([4]byte{10, 96 + byte(i>>16), byte(i >> 8), byte(i)})
	}
	return netip.AddrFrom16([16]byte{0: 0xfd, 1: 0x00, 2: 0x00, 3: 0x96, 13: byte(i >> 16), 14: byte(i >> 8), 15: byte(i)})
}

// EndpointIP returns endpoint j of Service i in family f, in 10.64.0.0/10 and
// fd00:64::/64; distinct for every i below 65536 and j below 64.
func EndpointIP(f *family.Family, i, j int) netip.Addr {
	n := i*64 + j
	if f == family.IPv4 {
		return netip.AddrFrom4([4]byte{10, 64 + byte(n>>16&0x3f), byte(n >> 8), byte(n)})
	}
	return netip.AddrFrom16([16]byte{0: 0xfd, 1: 0x00, 2: 0x00, 3: 0x64, 12: byte(n >> 24), 13: byte(n >> 16), 14: byte(n >> 8), 15: byte(n)})
}

// Service returns Service i.
func (w Workload) Service(i int) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i), UID: "uid", CreationTimestamp: metav1.Unix(int64(i), 0)},
		Spec: v1.ServiceSpec{
			Type:           v1.ServiceTypeClusterIP,
			IPFamilyPolicy: ptr.To(v1.IPFamilyPolicyRequireDualStack),
			IPFamilies:     []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol},
			ClusterIPs:     []string{ServiceIP(family.IPv4, i).String(), ServiceIP(family.IPv6, i).String()},
			Ports:          []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
	if w.NodePortEvery > 0 && i%w.NodePortEvery == 0 {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = int32(30000 + i/w.NodePortEvery%2700)
	}
	return s
}

// Slice returns the EndpointSlice of Service i in family f with n endpoints.
func (w Workload) Slice(f *family.Family, i, n int) *discovery.EndpointSlice {
	es := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: fmt.Sprintf("svc-%d-%s", i, f.Name),
			Labels: map[string]string{discovery.LabelServiceName: fmt.Sprintf("svc-%d", i)}},
		AddressType: f.AddressType,
		Ports:       []discovery.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(v1.ProtocolTCP)}},
		Endpoints:   make([]discovery.Endpoint, n),
	}
	for j := range n {
		node := fmt.Sprintf("node-%d", j%10)
		es.Endpoints[j] = discovery.Endpoint{
			Addresses:  []string{EndpointIP(f, i, j).String()},
			Conditions: discovery.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   &node,
		}
	}
	return es
}

// CountingHandler is a watch.Handler that counts the Services, EndpointSlices and
// endpoints the informers deliver and drops them: it measures the API client and
// the informers without the proxiers' trackers (the "feed" of TestKernelFigures).
type CountingHandler struct{ Services, Slices, Endpoints atomic.Int64 }

func (h *CountingHandler) OnServiceAdd(*v1.Service)         { h.Services.Add(1) }
func (h *CountingHandler) OnServiceUpdate(_, _ *v1.Service) {}
func (h *CountingHandler) OnServiceDelete(*v1.Service)      {}
func (h *CountingHandler) OnEndpointSliceAdd(o *endpointslice.Object) {
	h.Slices.Add(1)
	if o.Slice != nil {
		h.Endpoints.Add(int64(len(o.Slice.Endpoints)))
	}
}
func (h *CountingHandler) OnEndpointSliceUpdate(_, _ *endpointslice.Object)   {}
func (h *CountingHandler) OnEndpointSliceDelete(*endpointslice.Object)        {}
func (h *CountingHandler) OnNodeAdd(*v1.Node)                                 {}
func (h *CountingHandler) OnNodeUpdate(_, _ *v1.Node)                         {}
func (h *CountingHandler) OnNodeDelete(*v1.Node)                              {}
func (h *CountingHandler) OnServiceCIDRAdd(*networkingv1.ServiceCIDR)         {}
func (h *CountingHandler) OnServiceCIDRUpdate(_, _ *networkingv1.ServiceCIDR) {}
func (h *CountingHandler) OnServiceCIDRDelete(*networkingv1.ServiceCIDR)      {}
