package metaproxier

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/endpointslice"
)

// The Service and Node handlers deliver every event to every family, each call
// isolated from the other family's panics. Every call is logged at V(4), as
// kube-proxy's event handlers log theirs ("Calling handler.OnServiceDelete"):
// with -v=4 the log shows when each event reached the proxy, next to the "Sync
// done" of the sync that followed.

// OnServiceAdd delivers a Service add to every family.
func (m *MetaProxier) OnServiceAdd(svc *v1.Service) {
	klog.V(4).InfoS("Calling handler.OnServiceAdd", "service", klog.KObj(svc))
	m.each("OnServiceAdd", func(fp FamilyProxier) { fp.OnServiceAdd(svc) })
}

// OnServiceUpdate delivers a Service update to every family.
func (m *MetaProxier) OnServiceUpdate(old, cur *v1.Service) {
	klog.V(4).InfoS("Calling handler.OnServiceUpdate", "service", klog.KObj(cur))
	m.each("OnServiceUpdate", func(fp FamilyProxier) { fp.OnServiceUpdate(old, cur) })
}

// OnServiceDelete delivers a Service delete to every family.
func (m *MetaProxier) OnServiceDelete(svc *v1.Service) {
	klog.V(4).InfoS("Calling handler.OnServiceDelete", "service", klog.KObj(svc))
	m.each("OnServiceDelete", func(fp FamilyProxier) { fp.OnServiceDelete(svc) })
}

// OnNodeAdd delivers a Node add to every family.
func (m *MetaProxier) OnNodeAdd(node *v1.Node) {
	klog.V(4).InfoS("Calling handler.OnNodeAdd", "node", klog.KObj(node))
	m.each("OnNodeAdd", func(fp FamilyProxier) { fp.OnNodeAdd(node) })
}

// OnNodeUpdate delivers a Node update to every family.
func (m *MetaProxier) OnNodeUpdate(old, cur *v1.Node) {
	klog.V(4).InfoS("Calling handler.OnNodeUpdate", "node", klog.KObj(cur))
	m.each("OnNodeUpdate", func(fp FamilyProxier) { fp.OnNodeUpdate(old, cur) })
}

// OnNodeDelete delivers a Node delete to every family.
func (m *MetaProxier) OnNodeDelete(node *v1.Node) {
	klog.V(4).InfoS("Calling handler.OnNodeDelete", "node", klog.KObj(node))
	m.each("OnNodeDelete", func(fp FamilyProxier) { fp.OnNodeDelete(node) })
}

// OnEndpointSliceAdd delivers the slice to the family of its addressType; FQDN and
// unknown types, and families this node does not proxy, are dropped.
func (m *MetaProxier) OnEndpointSliceAdd(slice *endpointslice.Object) {
	klog.V(4).InfoS("Calling handler.OnEndpointSliceAdd", "endpointSlice", klog.KObj(slice))
	if mb := m.sliceMember(slice); mb != nil {
		mb.call("OnEndpointSliceAdd", func(fp FamilyProxier) { fp.OnEndpointSliceAdd(slice) })
	}
}

// OnEndpointSliceUpdate routes like OnEndpointSliceAdd, by cur (addressType is
// immutable, so old has the same one).
func (m *MetaProxier) OnEndpointSliceUpdate(old, cur *endpointslice.Object) {
	klog.V(4).InfoS("Calling handler.OnEndpointSliceUpdate", "endpointSlice", klog.KObj(cur))
	if mb := m.sliceMember(cur); mb != nil {
		mb.call("OnEndpointSliceUpdate", func(fp FamilyProxier) { fp.OnEndpointSliceUpdate(old, cur) })
	}
}

// OnEndpointSliceDelete routes like OnEndpointSliceAdd.
func (m *MetaProxier) OnEndpointSliceDelete(slice *endpointslice.Object) {
	klog.V(4).InfoS("Calling handler.OnEndpointSliceDelete", "endpointSlice", klog.KObj(slice))
	if mb := m.sliceMember(slice); mb != nil {
		mb.call("OnEndpointSliceDelete", func(fp FamilyProxier) { fp.OnEndpointSliceDelete(slice) })
	}
}

// sliceMember returns the member that consumes slice, or nil (logged at V(4)).
func (m *MetaProxier) sliceMember(slice *endpointslice.Object) *member {
	if slice == nil {
		return nil
	}
	f := slice.Family
	if f == nil {
		klog.V(4).InfoS("Ignoring EndpointSlice with unsupported addressType",
			"endpointSlice", klog.KObj(slice), "reason", slice.Err)
		return nil
	}
	mb := m.member(f)
	if mb == nil {
		klog.V(4).InfoS("Ignoring EndpointSlice of a family this node does not proxy",
			"endpointSlice", klog.KObj(slice), "ipFamily", f.Name)
	}
	return mb
}
