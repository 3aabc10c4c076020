package watch

import (
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"

	"github.com/dsproxy/dsproxy/pkg/endpointslice"
)

// ForProxy is the transform of the Service/EndpointSlice/ServiceCIDR informers on
// node nodeName: an EndpointSlice becomes an *endpointslice.Object, parsed once for
// its family (the informer's cache then holds the compact form, shared with the
// proxier's), a Service becomes a *Service (CompactService), and every other object
// goes through StripForProxy. It never fails.
func ForProxy(nodeName string) cache.TransformFunc {
	return func(obj any) (any, error) {
		switch o := obj.(type) {
		case *discovery.EndpointSlice:
			return endpointslice.Ingest(o, nodeName), nil
		case *endpointslice.Object:
			return o, nil
		case *v1.Service:
			return CompactService(o), nil
		case *Service:
			return o, nil
		}
		return StripForProxy(obj)
	}
}

// LastAppliedAnnotation is kubectl's copy of the last applied configuration: the whole
// object again as JSON, read by nothing in the proxy.
const LastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

// StripForProxy is the transform of the objects the informers keep as they are
// (Services, ServiceCIDRs, the Node): before one enters an informer's cache it drops
// what the proxy never reads and what, at 10k Services, is a large share of the
// caches: metadata.managedFields (one entry per field manager, each a JSON field set)
// and kubectl's last-applied annotation. Every other field is kept. Objects without
// metadata pass through unchanged. It never fails.
func StripForProxy(obj any) (any, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return obj, nil
	}
	m.SetManagedFields(nil)
	if a := m.GetAnnotations(); a != nil {
		if _, ok := a[LastAppliedAnnotation]; ok {
			delete(a, LastAppliedAnnotation)
			if len(a) == 0 {
				m.SetAnnotations(nil)
			}
		}
	}
	return obj, nil
}
