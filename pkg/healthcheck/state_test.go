package healthcheck

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dsproxy/dsproxy/pkg/model"
)

func ep(addr string, port uint16, ready bool) model.Endpoint {
	return model.Endpoint{Addr: netip.MustParseAddr(addr), Port: port, Ready: ready, Serving: true, Terminating: !ready, Local: true}
}

func addPort(st *model.State, name, portName string, hc uint16, local ...model.Endpoint) {
	sp := &model.ServicePort{
		Name: model.ServicePortName{
			NamespacedName: types.NamespacedName{Namespace: "ns", Name: name},
			Port:           portName,
			Protocol:       v1.ProtocolTCP,
		},
		Protocol:            v1.ProtocolTCP,
		ExternalPolicyLocal: hc != 0,
		HealthCheckNodePort: hc,
		NodePort:            30000,
	}
	st.Ports[sp.Name] = &model.PortState{ServicePort: sp, Selection: model.Selection{Local: local, HasAny: true}}
}

func TestFromState(t *testing.T) {
	v4, v6 := model.NewState(), model.NewState()

	// Two ports on the same pods: each pod counts once.
	addPort(v4, "web", "http", 31000, ep("10.1.0.1", 80, true), ep("10.1.0.2", 80, true))
	addPort(v4, "web", "https", 31000, ep("10.1.0.1", 443, true), ep("10.1.0.2", 443, true))
	// Dual-stack: the IPv6 addresses of the same pods count too.
	addPort(v6, "web", "http", 31000, ep("fd00::1", 80, true), ep("fd00::2", 80, true))
	// Only terminating local endpoints (the serving-terminating fallback): 0.
	addPort(v4, "draining", "", 31001, ep("10.1.0.3", 80, false))
	// No local endpoints at all.
	addPort(v6, "remote", "", 31002)
	// No healthCheckNodePort: not served.
	addPort(v4, "nodeport", "", 0, ep("10.1.0.4", 80, true))

	services, endpoints := FromState(v4, nil, v6)
	wantServices := map[types.NamespacedName]uint16{nn("web"): 31000, nn("draining"): 31001, nn("remote"): 31002}
	wantEndpoints := map[types.NamespacedName]int{nn("web"): 4, nn("draining"): 0, nn("remote"): 0}
	if d := cmp.Diff(wantServices, services); d != "" {
		t.Errorf("services (-want +got):\n%s", d)
	}
	if d := cmp.Diff(wantEndpoints, endpoints); d != "" {
		t.Errorf("endpoints (-want +got):\n%s", d)
	}

	services, endpoints = FromState()
	if len(services) != 0 || len(endpoints) != 0 {
		t.Errorf("FromState() = %v, %v", services, endpoints)
	}
}

// A load balancer with externalTrafficPolicy Local and no NodePorts
// (allocateLoadBalancerNodePorts false) whose status names no VIP of the family
// yet: its port uses no local endpoints, but the health check counts the ready
// local ones all the same, as kube-proxy does.
func TestFromStateNoExternalAddress(t *testing.T) {
	sp := &model.ServicePort{
		Name:                model.ServicePortName{NamespacedName: nn("lb"), Protocol: v1.ProtocolTCP},
		Protocol:            v1.ProtocolTCP,
		ClusterIP:           netip.MustParseAddr("10.96.0.9"),
		Port:                80,
		ExternalPolicyLocal: true,
		HealthCheckNodePort: 31003,
	}
	remote := ep("10.1.0.9", 80, true)
	remote.Local = false
	eps := []model.Endpoint{ep("10.1.0.5", 80, true), ep("10.1.0.6", 80, false), remote}
	for _, vip := range []bool{false, true} {
		if vip {
			sp.LoadBalancerVIPs = []netip.Addr{netip.MustParseAddr("203.0.113.9")}
		}
		st := model.NewState()
		st.Ports[sp.Name] = &model.PortState{ServicePort: sp, Selection: model.Categorize(sp, eps, model.NodeInfo{})}
		_, endpoints := FromState(st)
		if endpoints[nn("lb")] != 1 {
			t.Errorf("VIP %v: %d local endpoints counted, want 1 (the ready local one)", vip, endpoints[nn("lb")])
		}
	}
}
