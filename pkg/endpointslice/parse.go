// Package endpointslice turns EndpointSlices into the endpoints of each service port,
// one family at a time, merging every slice of a Service the way kube-proxy does, and
// tracks which Services' endpoints changed since the last sync.
package endpointslice

import (
	"net/netip"
	"slices"
	"strconv"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
)

// Limits the API server enforces on an EndpointSlice (v1.36's discovery
// validation: 1000 endpoints, 20000 ports; the API type's comment saying 100
// ports is out of date, and the controller writes one slice port per Service
// port, so a Service of more than 100 ports has slices of that many). A slice
// beyond them cannot have come from a healthy API server, so it is rejected whole
// rather than trusted.
const (
	MaxEndpointsPerSlice = 1000
	MaxPortsPerSlice     = 20000
)

// Slice is the part of an EndpointSlice a proxy uses, validated for one family.
type Slice struct {
	Service types.NamespacedName
	Name    string
	Ports   []Port
	// Endpoints have Port 0, which comes from Ports when merged; except in a slice
	// with exactly one port (nearly all of them), whose endpoints carry that port
	// and are sorted as a merged list is, so that a Service with one such slice
	// can use the list as its merged one without a copy.
	Endpoints []model.Endpoint
}

// Port is one named port of a slice.
type Port struct {
	Name     string
	Protocol v1.Protocol
	Port     uint16
}

// equal reports whether two parsed slices would produce the same endpoints.
func (s *Slice) equal(o *Slice) bool {
	return s.Service == o.Service && s.Name == o.Name && slices.Equal(s.Ports, o.Ports) &&
		model.EndpointsEqual(s.Endpoints, o.Endpoints)
}

// Parse validates an EndpointSlice for family f on node nodeName. It returns an error
// (a *model.SkipError) when the slice cannot be used at all: wrong or FQDN address
// type, no service-name label, a label that hands it to another proxy, or sizes the
// API server would have refused. Bad endpoints and ports inside an otherwise usable
// slice are left out and reported in skips.
func Parse(f *family.Family, es *discovery.EndpointSlice, nodeName string) (*Slice, []*model.SkipError, error) {
	if es == nil {
		return nil, nil, &model.SkipError{Object: "EndpointSlice <nil>", Reason: "nil object"}
	}
	obj := "EndpointSlice " + es.Namespace + "/" + es.Name
	if err := checkSlice(f, es, obj); err != nil {
		return nil, nil, err
	}
	s := &Slice{
		Service: types.NamespacedName{Namespace: es.Namespace, Name: es.Labels[discovery.LabelServiceName]},
		Name:    es.Name,
	}
	var skips []*model.SkipError
	s.Ports, skips = parsePorts(es, obj, skips)
	s.Endpoints, skips = parseEndpoints(f, es, nodeName, obj, skips)
	if len(s.Ports) == 1 {
		for i := range s.Endpoints {
			s.Endpoints[i].Port = s.Ports[0].Port
		}
		slices.SortStableFunc(s.Endpoints, model.CompareEndpoints)
	}
	return s, skips, nil
}

func checkSlice(f *family.Family, es *discovery.EndpointSlice, obj string) *model.SkipError {
	switch {
	case es.AddressType != f.AddressType:
		return &model.SkipError{Object: obj, Field: "addressType", Reason: "is " + string(es.AddressType) + ", not " + string(f.AddressType)}
	case es.Name == "" || es.Namespace == "":
		return &model.SkipError{Object: obj, Field: "metadata", Reason: "name and namespace must be set"}
	case es.Labels[discovery.LabelServiceName] == "":
		return &model.SkipError{Object: obj, Field: "metadata.labels", Reason: "no " + discovery.LabelServiceName + " label"}
	case len(es.Endpoints) > MaxEndpointsPerSlice:
		return &model.SkipError{Object: obj, Field: "endpoints", Reason: "more than 1000 endpoints"}
	case len(es.Ports) > MaxPortsPerSlice:
		return &model.SkipError{Object: obj, Field: "ports", Reason: "more than 20000 ports"}
	}
	if _, ok := es.Labels[model.LabelServiceProxyName]; ok {
		return &model.SkipError{Object: obj, Field: "metadata.labels", Reason: "belongs to proxy " + es.Labels[model.LabelServiceProxyName]}
	}
	if _, ok := es.Labels[model.LabelHeadless]; ok {
		return &model.SkipError{Object: obj, Field: "metadata.labels", Reason: "headless service"}
	}
	return nil
}

func parsePorts(es *discovery.EndpointSlice, obj string, skips []*model.SkipError) ([]Port, []*model.SkipError) {
	ports := make([]Port, 0, len(es.Ports))
	for i, p := range es.Ports {
		field := "ports[" + strconv.Itoa(i) + "]"
		switch {
		case p.Name == nil:
			skips = append(skips, &model.SkipError{Object: obj, Field: field + ".name", Reason: "nil"})
			continue
		case p.Port == nil || *p.Port <= 0 || *p.Port > 65535:
			skips = append(skips, &model.SkipError{Object: obj, Field: field + ".port", Reason: "missing or out of range 1-65535"})
			continue
		}
		proto := v1.ProtocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		if proto != v1.ProtocolTCP && proto != v1.ProtocolUDP && proto != v1.ProtocolSCTP {
			skips = append(skips, &model.SkipError{Object: obj, Field: field + ".protocol", Reason: "unsupported protocol " + string(proto)})
			continue
		}
		ports = append(ports, Port{Name: *p.Name, Protocol: proto, Port: uint16(*p.Port)})
	}
	return ports, skips
}

func parseEndpoints(f *family.Family, es *discovery.EndpointSlice, nodeName, obj string, skips []*model.SkipError) ([]model.Endpoint, []*model.SkipError) {
	eps := make([]model.Endpoint, 0, len(es.Endpoints))
	for i := range es.Endpoints {
		ep := &es.Endpoints[i]
		if len(ep.Addresses) == 0 {
			skips = append(skips, &model.SkipError{Object: obj, Field: "endpoints[" + strconv.Itoa(i) + "].addresses", Reason: "empty"})
			continue
		}
		// Only the first address is used, as in kube-proxy: the API defines the
		// others as interchangeable and the endpoint controller never sets them.
		addr, ok := f.ParseAddr(ep.Addresses[0])
		if !ok {
			skips = append(skips, &model.SkipError{Object: obj, Field: "endpoints[" + strconv.Itoa(i) + "].addresses[0]",
				Reason: strconv.Quote(ep.Addresses[0]) + " is not a valid " + f.Name + " address"})
			continue
		}
		eps = append(eps, endpointFrom(ep, addr, nodeName))
	}
	return eps, skips
}

func endpointFrom(ep *discovery.Endpoint, addr netip.Addr, nodeName string) model.Endpoint {
	e := model.Endpoint{
		Addr:        addr,
		Ready:       ep.Conditions.Ready == nil || *ep.Conditions.Ready,
		Serving:     ep.Conditions.Serving == nil || *ep.Conditions.Serving,
		Terminating: ep.Conditions.Terminating != nil && *ep.Conditions.Terminating,
	}
	e.Local = ep.NodeName != nil && nodeName != "" && *ep.NodeName == nodeName
	e.NoNodeName = ep.NodeName == nil || *ep.NodeName == ""
	if ep.Hints != nil && len(ep.Hints.ForZones)+len(ep.Hints.ForNodes) > 0 {
		h := &model.Hints{}
		for _, z := range ep.Hints.ForZones {
			h.Zones = append(h.Zones, z.Name)
		}
		for _, n := range ep.Hints.ForNodes {
			h.Nodes = append(h.Nodes, n.Name)
		}
		slices.Sort(h.Zones)
		h.Zones = slices.Compact(h.Zones)
		slices.Sort(h.Nodes)
		h.Nodes = slices.Compact(h.Nodes)
		e.Hints = h
	}
	return e
}
