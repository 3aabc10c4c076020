package endpointslice

import (
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
)

// Cache tracks the EndpointSlices of one family. Update and Delete may be called from
// any goroutine; Checkout, which applies what changed to an EndpointsMap, is called
// by the one goroutine that owns that map.
type Cache struct {
	family *family.Family

	mu        sync.Mutex
	byService map[types.NamespacedName]*serviceSlices
	// owner maps a slice's namespace/name to the Service it was last filed under.
	owner map[types.NamespacedName]types.NamespacedName
	dirty map[types.NamespacedName]bool
}

type serviceSlices struct {
	// slices are the latest version seen of each slice, sorted by name: nearly
	// always one, so a slice rather than a map (a map per Service was 5 MB at 10k).
	slices []*Slice
	// ports are the service port names this Service had in the EndpointsMap after the
	// last Checkout, so a checkout can remove the ones that disappeared.
	ports []model.ServicePortName
}

// NewCache returns an empty cache for family f. Which endpoints are local was
// decided by Ingest.
func NewCache(f *family.Family) *Cache {
	return &Cache{
		family:    f,
		byService: make(map[types.NamespacedName]*serviceSlices),
		owner:     make(map[types.NamespacedName]types.NamespacedName),
		dirty:     make(map[types.NamespacedName]bool),
	}
}

// Update records a new or changed slice, as Ingest made it. It returns true when
// the slice changes what the proxy would program, false for no-op updates and for
// slices that are skipped. Skipped slices and skipped parts are logged with the
// reason; a slice that was usable and becomes unusable is treated as deleted.
func (c *Cache) Update(o *Object) bool {
	if o == nil {
		return false
	}
	for _, sk := range o.Skips {
		klog.V(2).InfoS("Ignoring part of EndpointSlice", "ipFamily", c.family.Name, "reason", sk.Error())
	}
	err := o.Err
	if err == nil && (o.Family != c.family || o.Slice == nil) {
		err = &model.SkipError{Object: "EndpointSlice " + o.Namespace + "/" + o.Name, Field: "addressType",
			Reason: "not parsed as " + c.family.Name}
	}
	if err != nil {
		klog.V(2).InfoS("Ignoring EndpointSlice", "ipFamily", c.family.Name, "reason", err.Error())
		if o.Namespace != "" && o.Name != "" {
			return c.remove(o.Namespace, o.Name)
		}
		return false
	}
	s := o.Slice
	c.mu.Lock()
	defer c.mu.Unlock()
	// A slice's service-name label can change; drop it from the old Service first.
	changed := c.removeLocked(s.Service.Namespace, s.Name, s.Service)
	ss := c.byService[s.Service]
	if ss == nil {
		ss = &serviceSlices{}
		c.byService[s.Service] = ss
	}
	i, found := ss.find(s.Name)
	if found && ss.slices[i].equal(s) {
		return changed
	}
	if found {
		ss.slices[i] = s
	} else {
		ss.slices = slices.Insert(ss.slices, i, s)
	}
	c.owner[types.NamespacedName{Namespace: s.Service.Namespace, Name: s.Name}] = s.Service
	c.dirty[s.Service] = true
	return true
}

// Delete records that a slice is gone. It returns true when that changes anything.
func (c *Cache) Delete(o *Object) bool {
	if o == nil {
		return false
	}
	return c.remove(o.Namespace, o.Name)
}

func (c *Cache) remove(namespace, name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.removeLocked(namespace, name, types.NamespacedName{})
}

// removeLocked removes slice namespace/name from the Service it was filed under,
// unless that Service is keep.
func (c *Cache) removeLocked(namespace, name string, keep types.NamespacedName) bool {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	svc, ok := c.owner[key]
	if !ok || svc == keep {
		return false
	}
	delete(c.owner, key)
	if ss := c.byService[svc]; ss != nil {
		if i, found := ss.find(name); found {
			ss.slices = slices.Delete(ss.slices, i, i+1)
		}
	}
	c.dirty[svc] = true
	return true
}

// Pending returns how many Services have changes not yet checked out.
func (c *Cache) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.dirty)
}

// Checkout applies every pending change to m and returns the Services whose
// endpoints changed. With full set, every Service is recomputed (m must then be the
// map every earlier Checkout wrote, or empty).
func (c *Cache) Checkout(m model.EndpointsMap, full bool) map[types.NamespacedName]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	changed := c.dirty
	if full {
		for svc := range c.byService {
			changed[svc] = true
		}
	}
	c.dirty = make(map[types.NamespacedName]bool)
	for svc := range changed {
		ss := c.byService[svc]
		if ss == nil {
			continue
		}
		for _, name := range ss.ports {
			delete(m, name)
		}
		ss.ports = ss.ports[:0]
		if name, eps, ok := single(svc, ss.slices); ok {
			if len(eps) > 0 {
				m[name] = eps
				ss.ports = append(ss.ports, name)
			}
		} else {
			for name, eps := range merge(svc, ss.slices) {
				m[name] = eps
				ss.ports = append(ss.ports, name)
			}
		}
		if len(ss.slices) == 0 {
			delete(c.byService, svc)
		}
	}
	return changed
}

// single handles the common case without building a map: a Service with one
// single-port slice and no duplicate endpoint, whose parsed list already is the
// merged one (see Slice.Endpoints). The list is shared, not copied: lists in an
// EndpointsMap are never modified.
func single(svc types.NamespacedName, bySlice []*Slice) (model.ServicePortName, []model.Endpoint, bool) {
	if len(bySlice) != 1 || len(bySlice[0].Ports) != 1 || hasDuplicates(bySlice[0].Endpoints) {
		return model.ServicePortName{}, nil, false
	}
	s := bySlice[0]
	p := s.Ports[0]
	return model.ServicePortName{NamespacedName: svc, Port: p.Name, Protocol: p.Protocol}, s.Endpoints, true
}

// find returns where the slice called name is, or would be inserted.
func (ss *serviceSlices) find(name string) (int, bool) {
	return slices.BinarySearchFunc(ss.slices, name, func(s *Slice, name string) int { return strings.Compare(s.Name, name) })
}

// merge combines a Service's slices into endpoints per service port. The slices
// come in name order, so the result never depends on the order they arrived in. An
// address and port listed twice keeps the non-terminating copy, as kube-proxy does.
func merge(svc types.NamespacedName, bySlice []*Slice) map[model.ServicePortName][]model.Endpoint {
	out := make(map[model.ServicePortName][]model.Endpoint, 1)
	for _, s := range bySlice {
		for _, p := range s.Ports {
			key := model.ServicePortName{NamespacedName: svc, Port: p.Name, Protocol: p.Protocol}
			out[key] = appendEndpoints(out[key], s.Endpoints, p.Port)
		}
	}
	for key, eps := range out {
		slices.SortStableFunc(eps, model.CompareEndpoints)
		eps = dedupe(eps)
		if len(eps) == 0 {
			delete(out, key)
			continue
		}
		out[key] = eps
	}
	return out
}

func appendEndpoints(dst, src []model.Endpoint, port uint16) []model.Endpoint {
	if dst == nil {
		dst = make([]model.Endpoint, 0, len(src))
	}
	for _, e := range src {
		e.Port = port
		dst = append(dst, e)
	}
	return dst
}

// hasDuplicates reports whether a sorted list has an address and port twice.
func hasDuplicates(eps []model.Endpoint) bool {
	for i := 1; i < len(eps); i++ {
		if eps[i].Addr == eps[i-1].Addr && eps[i].Port == eps[i-1].Port {
			return true
		}
	}
	return false
}

// dedupe keeps one endpoint per address and port in a sorted list: the last
// non-terminating copy if there is one, else the first.
func dedupe(eps []model.Endpoint) []model.Endpoint {
	out := eps[:0]
	for _, e := range eps {
		if n := len(out); n > 0 && out[n-1].Addr == e.Addr && out[n-1].Port == e.Port {
			if !e.Terminating {
				out[n-1] = e
			}
			continue
		}
		out = append(out, e)
	}
	return out
}
