package model

import (
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// ServiceMap holds the service ports of every Service one family serves, by Service.
// It is owned by one family proxier's sync goroutine.
type ServiceMap map[types.NamespacedName][]*ServicePort

// EndpointsMap holds the endpoints of every service port of one family, each list
// sorted by address and port. It is owned by one family proxier's sync goroutine.
type EndpointsMap map[ServicePortName][]Endpoint

// ServiceTracker records Service changes for one family. Update may be called from
// any goroutine; Checkout is called by the goroutine that owns the ServiceMap.
type ServiceTracker struct {
	family *family.Family
	// NoExternalIPs leaves every Service's spec.externalIPs out, as kube-proxy
	// does with --feature-gates=AllowServiceExternalIPs=false. Set it before
	// the first Update.
	NoExternalIPs bool

	mu      sync.Mutex
	applied map[types.NamespacedName][]*ServicePort
	pending map[types.NamespacedName][]*ServicePort // nil value: the Service is gone
}

// NewServiceTracker returns a tracker for family f.
func NewServiceTracker(f *family.Family) *ServiceTracker {
	return &ServiceTracker{
		family:  f,
		applied: make(map[types.NamespacedName][]*ServicePort),
		pending: make(map[types.NamespacedName][]*ServicePort),
	}
}

// Update records a Service add (prev nil), update, or delete (cur nil). It returns
// true when the family's view of that Service differs from what was last checked
// out, so a sync is needed. Invalid parts of the Service are logged and left out.
func (t *ServiceTracker) Update(prev, cur *v1.Service) bool {
	svc := cur
	if svc == nil {
		svc = prev
	}
	if svc == nil {
		return false
	}
	nn := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	ports, skips := ServicePorts(t.family, cur)
	if t.NoExternalIPs {
		for _, p := range ports {
			p.ExternalIPs = nil
		}
	}
	for _, sk := range skips {
		klog.V(2).InfoS("Ignoring part of Service", "ipFamily", t.family.Name, "reason", sk.Error())
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if slices.EqualFunc(ports, t.applied[nn], (*ServicePort).Equal) {
		delete(t.pending, nn)
		return false
	}
	t.pending[nn] = ports
	return true
}

// Pending returns how many Services have changes not yet checked out.
func (t *ServiceTracker) Pending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending)
}

// Checkout applies the pending changes to m and returns the Services that changed.
// With full set, it rewrites m from scratch and returns every Service it holds or
// held.
func (t *ServiceTracker) Checkout(m ServiceMap, full bool) map[types.NamespacedName]bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	changed := make(map[types.NamespacedName]bool, len(t.pending))
	if len(t.applied) == 0 {
		t.applied = make(map[types.NamespacedName][]*ServicePort, len(t.pending))
	}
	for nn, ports := range t.pending {
		changed[nn] = true
		if len(ports) == 0 {
			delete(t.applied, nn)
		} else {
			t.applied[nn] = ports
		}
	}
	// A new map, not clear: a map keeps the capacity of its largest size, and
	// clearing or ranging over one that once held every Service (the cold start)
	// costs that capacity on every later sync.
	t.pending = make(map[types.NamespacedName][]*ServicePort)
	if full {
		for nn := range m {
			changed[nn] = true
		}
		clear(m)
		for nn, ports := range t.applied {
			m[nn] = ports
			changed[nn] = true
		}
		return changed
	}
	for nn := range changed {
		if ports, ok := t.applied[nn]; ok {
			m[nn] = ports
		} else {
			delete(m, nn)
		}
	}
	return changed
}
