// Package nodeport holds what the two family proxiers share about NodePorts.
//
// KEP-563: "a reservation of NodePort 12345 will happen on both families,
// irrespective of the IP family of the service". A Registry records every NodePort
// claim once, for both families; each family proxier asks it which ports are claimed
// by Services it does not serve, and programs those as reserved (rejected) so that no
// host process can take them on that family.
//
// The package also parses and resolves --nodeport-addresses per family (addresses.go).
package nodeport

import (
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// Key is one NodePort: a protocol and a port number in 1-65535.
type Key struct {
	Protocol v1.Protocol
	Port     uint16
}

// String prints "TCP/30000".
func (k Key) String() string { return string(k.Protocol) + "/" + strconv.Itoa(int(k.Port)) }

// Compare orders keys by protocol, then port.
func (k Key) Compare(o Key) int {
	if c := strings.Compare(string(k.Protocol), string(o.Protocol)); c != 0 {
		return c
	}
	return int(k.Port) - int(o.Port)
}

// Reserved is a consistent snapshot of the NodePorts one family must reject: those
// owned by Services that do not serve the family.
type Reserved struct {
	Family *family.Family
	// Generation increases by one each time Keys changes, and only then.
	Generation uint64
	// Keys is sorted by Key.Compare. The caller owns it.
	Keys []Key
}

// Has reports whether k is reserved.
func (r Reserved) Has(k Key) bool {
	_, ok := slices.BinarySearchFunc(r.Keys, k, Key.Compare)
	return ok
}

// Claim is one row of Registry.Snapshot.
type Claim struct {
	Key   Key
	Owner types.NamespacedName
	// Families are those the owner serves, in family.All order; empty when they could
	// not be determined, in which case the port is reserved on every family.
	Families []*family.Family
	// Losers are the other Services claiming Key, best first. Normally empty: the
	// apiserver allocates NodePorts uniquely, so a loser means a stale or bad object.
	Losers []types.NamespacedName
}

// Registry is the table of NodePort claims shared by both family proxiers. All
// methods are safe for concurrent use. Update and Delete are meant for informer
// goroutines; the readers for the family proxiers' syncs.
//
// Each Key has at most one owner. When Services conflict, the one with the oldest
// creationTimestamp wins (a Service without one loses to any Service with one), ties
// broken by namespace, then name; when the owner releases the Key the next claimant
// takes over.
type Registry struct {
	logger klog.Logger

	mu       sync.RWMutex
	services map[types.NamespacedName]*claim
	keys     map[Key][]*claim // claimants, best first; never empty
	reserved map[*family.Family]map[Key]struct{}
	gen      map[*family.Family]uint64
	onChange []func(*family.Family)
}

// claim is what one Service claims.
type claim struct {
	name     types.NamespacedName
	created  time.Time        // zero when unknown
	families []*family.Family // in family.All order; empty when unknown
	keys     []Key            // sorted, unique, non-empty
}

// New returns an empty Registry that logs to logger.
func New(logger klog.Logger) *Registry {
	r := &Registry{
		logger:   logger,
		services: map[types.NamespacedName]*claim{},
		keys:     map[Key][]*claim{},
		reserved: map[*family.Family]map[Key]struct{}{},
		gen:      map[*family.Family]uint64{},
	}
	for _, f := range family.All {
		r.reserved[f] = map[Key]struct{}{}
	}
	return r
}

// OnChange registers fn to be called, after the change is visible to readers, each
// time the reserved set of a family changes. fn runs on the goroutine that called
// Update or Delete and must not block; it may call the Registry.
//
// That is enough for a family proxier that also receives its own Service events: the
// owner of a Key only changes through an Update or Delete of a Service S that owned
// it before or owns it after, so either S served the family (the proxier saw S's
// event) or the Key's reservation on the family changed (fn is called). Owner
// changes between two Services that both do not serve a family are not reported to
// it: the Key stays reserved there.
func (r *Registry) OnChange(fn func(f *family.Family)) {
	if fn == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onChange = append(r.onChange, fn)
}

// Update records svc's NodePort claims, replacing those of its previous version. A
// Service without NodePorts releases its claims. nil and unnamed Services are ignored;
// unusable ports are ignored and logged at V(2). Update never panics on bad input.
func (r *Registry) Update(svc *v1.Service) {
	if svc == nil {
		return
	}
	if svc.Name == "" {
		r.logger.V(2).Info("Ignoring Service without a name", "namespace", svc.Namespace)
		return
	}
	c, skips := claimOf(svc)
	for _, s := range skips {
		r.logger.V(2).Info("Ignoring NodePort", "service", klog.KObj(svc), "field", s.field, "reason", s.reason)
	}
	r.apply(types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}, c)
}

// Delete releases the claims of the Service named by svc's namespace and name; the
// rest of svc is ignored. Deleting an unknown or nil Service is a no-op.
func (r *Registry) Delete(svc *v1.Service) {
	if svc == nil {
		return
	}
	r.apply(types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}, nil)
}

// Owner returns the Service that owns k.
func (r *Registry) Owner(k Key) (types.NamespacedName, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if cs := r.keys[k]; len(cs) > 0 {
		return cs[0].name, true
	}
	return types.NamespacedName{}, false
}

// ReservedFor returns the NodePorts that family f must reject because their owners do
// not serve f. f must be family.IPv4 or family.IPv6; any other value gets an empty
// snapshot.
func (r *Registry) ReservedFor(f *family.Family) Reserved {
	r.mu.RLock()
	defer r.mu.RUnlock()
	set := r.reserved[f]
	keys := make([]Key, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, Key.Compare)
	return Reserved{Family: f, Generation: r.gen[f], Keys: keys}
}

// Snapshot returns every claimed Key with its owner, sorted by Key, for debugging.
func (r *Registry) Snapshot() []Claim {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]Claim, 0, len(r.keys))
	for k, cs := range r.keys {
		c := Claim{Key: k, Owner: cs[0].name, Families: slices.Clone(cs[0].families)}
		for _, l := range cs[1:] {
			c.Losers = append(c.Losers, l.name)
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Claim) int { return a.Key.Compare(b.Key) })
	return out
}

// apply replaces the claim of Service nn by c (nil: none) and notifies the families
// whose reserved set changed.
func (r *Registry) apply(nn types.NamespacedName, c *claim) {
	r.mu.Lock()
	old := r.services[nn]
	if old.equal(c) {
		r.mu.Unlock()
		return
	}
	touched := unionKeys(old, c)
	before := r.owners(touched)
	r.replace(nn, old, c)
	after := r.owners(touched)
	for i, k := range touched {
		if before[i] == old && old != nil && after[i] != nil && after[i] != c {
			r.logger.Info("NodePort taken over after its owner released it", "nodePort", k, "owner", after[i].name, "previousOwner", nn)
		}
	}
	changed := r.updateReserved(touched, before, after)
	fns := slices.Clone(r.onChange)
	r.mu.Unlock()

	for _, f := range changed {
		for _, fn := range fns {
			fn(f)
		}
	}
}

// replace swaps old, the current claim of nn, for c in the claimant lists.
func (r *Registry) replace(nn types.NamespacedName, old, c *claim) {
	if old != nil {
		delete(r.services, nn)
		for _, k := range old.keys {
			r.remove(k, old)
		}
	}
	if c != nil {
		r.services[nn] = c
		for _, k := range c.keys {
			r.insert(k, c, old)
		}
	}
}

// updateReserved applies the owner changes of touched (before[i] → after[i]) to the
// reserved sets and returns the families whose set changed, in family.All order.
func (r *Registry) updateReserved(touched []Key, before, after []*claim) []*family.Family {
	var changed []*family.Family
	for _, f := range family.All {
		set, diff := r.reserved[f], false
		for i, k := range touched {
			was, is := reservedOn(before[i], f), reservedOn(after[i], f)
			switch {
			case was == is:
				continue
			case is:
				set[k] = struct{}{}
			default:
				delete(set, k)
			}
			diff = true
		}
		if diff {
			r.gen[f]++
			changed = append(changed, f)
		}
	}
	if len(changed) > 0 {
		for _, f := range family.All {
			reservationsGauge.WithLabelValues(f.Name).Set(float64(len(r.reserved[f])))
		}
	}
	return changed
}

func unionKeys(a, b *claim) []Key {
	var keys []Key
	for _, c := range []*claim{a, b} {
		if c != nil {
			keys = append(keys, c.keys...)
		}
	}
	slices.SortFunc(keys, Key.Compare)
	return slices.Compact(keys)
}

func (r *Registry) owners(keys []Key) []*claim {
	out := make([]*claim, len(keys))
	for i, k := range keys {
		out[i] = r.owner(k)
	}
	return out
}

func (r *Registry) owner(k Key) *claim {
	if cs := r.keys[k]; len(cs) > 0 {
		return cs[0]
	}
	return nil
}

func (r *Registry) remove(k Key, c *claim) {
	cs := slices.DeleteFunc(r.keys[k], func(x *claim) bool { return x == c })
	if len(cs) == 0 {
		delete(r.keys, k)
		return
	}
	r.keys[k] = cs
}

// insert adds c to k's claimants in order. A claimant that old (c's previous version)
// did not already have is a new conflict: it is logged and counted.
func (r *Registry) insert(k Key, c, old *claim) {
	cs := r.keys[k]
	i, _ := slices.BinarySearchFunc(cs, c, compareClaims)
	cs = slices.Insert(cs, i, c)
	r.keys[k] = cs
	if len(cs) > 1 && !old.has(k) {
		conflictsTotal.Inc()
		losers := make([]string, 0, len(cs)-1)
		for _, l := range cs[1:] {
			losers = append(losers, l.name.String())
		}
		r.logger.Info("NodePort claimed by more than one Service; the oldest wins", "nodePort", k, "owner", cs[0].name, "losers", losers)
	}
}

// reservedOn reports whether a Key owned by c must be rejected on f.
func reservedOn(c *claim, f *family.Family) bool {
	return c != nil && !slices.Contains(c.families, f)
}

// compareClaims orders claimants best first: oldest creationTimestamp (unknown last),
// then namespace, then name.
func compareClaims(a, b *claim) int {
	switch az, bz := a.created.IsZero(), b.created.IsZero(); {
	case az && !bz:
		return 1
	case bz && !az:
		return -1
	}
	if c := a.created.Compare(b.created); c != 0 {
		return c
	}
	if c := strings.Compare(a.name.Namespace, b.name.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.name.Name, b.name.Name)
}

func (c *claim) has(k Key) bool {
	if c == nil {
		return false
	}
	_, ok := slices.BinarySearchFunc(c.keys, k, Key.Compare)
	return ok
}

func (c *claim) equal(o *claim) bool {
	if c == nil || o == nil {
		return c == o
	}
	return c.name == o.name && c.created.Equal(o.created) &&
		slices.Equal(c.families, o.families) && slices.Equal(c.keys, o.keys)
}
