// Package porttest builds the service ports, states and node settings that the
// backends' unit tests sync, the same for every backend.
package porttest

import (
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nodeport"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// Name is the TCP port "p" of Service ns/svc.
func Name(svc string) model.ServicePortName {
	return model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: svc}, Port: "p", Protocol: v1.ProtocolTCP}
}

// Addr parses the family's one of two addresses.
func Addr(f *family.Family, v4, v6 string) netip.Addr {
	if f == family.IPv6 {
		return netip.MustParseAddr(v6)
	}
	return netip.MustParseAddr(v4)
}

// Port is a ClusterIP port of Service svc (10.96.0.n / fd00:96::n, port 80) with
// endpoints 10.64.0.e:8080 (fd00:64::e) for each e.
func Port(f *family.Family, svc string, n int, eps ...int) *model.PortState {
	ps := &model.PortState{ServicePort: &model.ServicePort{
		Name: Name(svc), ClusterIP: Addr(f, fmt.Sprintf("10.96.0.%d", n), fmt.Sprintf("fd00:96::%d", n)),
		Port: 80, Protocol: v1.ProtocolTCP,
	}}
	for _, e := range eps {
		ps.Cluster = append(ps.Cluster, model.Endpoint{
			Addr: Addr(f, fmt.Sprintf("10.64.0.%d", e), fmt.Sprintf("fd00:64::%d", e)), Port: 8080, Ready: true, Serving: true,
		})
	}
	ps.HasAny = len(eps) > 0
	return ps
}

// Node is a node at 192.0.2.1 / 2001:db8::1 serving NodePorts on every local
// address (addrs, when given, are what is local now), with the Service range
// 10.96.0.0/16 / fd00:96::/112 and pods in 10.64.0.0/16 and fd00:64::/48.
func Node(f *family.Family, addrs ...netip.Addr) *proxier.NodeConfig {
	return &proxier.NodeConfig{
		Family: f, NodeIP: Addr(f, "192.0.2.1", "2001:db8::1"),
		LocalAddrs:        slices.SortedFunc(slices.Values(addrs), netip.Addr.Compare),
		NodePortAddresses: nodeport.Addresses{Family: f, MatchAll: true, Addrs: addrs},
		ServiceCIDRs:      []netip.Prefix{netip.PrefixFrom(Addr(f, "10.96.0.0", "fd00:96::"), map[int]int{32: 16, 128: 112}[f.BitLen])},
		Local:             proxier.LocalDetector{Mode: proxier.LocalModeClusterCIDR, CIDRs: []netip.Prefix{netip.MustParsePrefix("10.64.0.0/16"), netip.MustParsePrefix("fd00:64::/48")}},
	}
}

// State is the state of the given ports.
func State(ports ...*model.PortState) *model.State {
	st := model.NewState()
	for _, p := range ports {
		st.Ports[p.Name] = p
	}
	return st
}
