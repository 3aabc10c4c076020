package nodeport

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	netutils "k8s.io/utils/net"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// bytes feeds the generator; it yields zeros once exhausted.
type bytes []byte

func (b *bytes) pick(n int) int {
	if len(*b) == 0 {
		return 0
	}
	c := (*b)[0]
	*b = (*b)[1:]
	return int(c) % n
}

func pickFrom[T any](b *bytes, vs ...T) T { return vs[b.pick(len(vs))] }

// fuzzService makes a Service from few names, ports and families, so that claims
// collide, with values the apiserver would reject mixed in.
func fuzzService(b *bytes) *v1.Service {
	nn := pickFrom(b, "a/x", "a/y", "b/x", "b/y", "/x", "a/")
	ns, name, _ := strings.Cut(nn, "/")
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if t := b.pick(4); t != 0 {
		svc.CreationTimestamp = metav1.NewTime(time.Unix(int64(t), 0))
	}
	svc.Spec.Type = pickFrom[v1.ServiceType](b, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer,
		v1.ServiceTypeClusterIP, v1.ServiceTypeExternalName, "", "Bogus")
	svc.Spec.AllocateLoadBalancerNodePorts = pickFrom(b, nil, ptr(true), ptr(false))
	for range b.pick(3) {
		svc.Spec.IPFamilies = append(svc.Spec.IPFamilies, pickFrom[v1.IPFamily](b, v1.IPv4Protocol, v1.IPv6Protocol, "IPv5", ""))
	}
	ips := []string{"10.0.0.1", "fd00::1", "None", "", "::ffff:10.0.0.1", "garbage", "fe80::1%eth0"}
	for range b.pick(3) {
		svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, pickFrom(b, ips...))
	}
	svc.Spec.ClusterIP = pickFrom(b, ips...)
	for range b.pick(4) {
		svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{
			Protocol: pickFrom[v1.Protocol](b, v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP, "", "ICMP"),
			NodePort: pickFrom[int32](b, 30000, 30001, 0, -1, 65536, 65535, math.MaxInt32, math.MinInt32),
		})
	}
	return svc
}

// The reference model below recomputes everything from the live Services, written
// without the Registry's code.

func refKeys(svc *v1.Service) []Key {
	if svc.Spec.Type != v1.ServiceTypeNodePort && svc.Spec.Type != v1.ServiceTypeLoadBalancer {
		return nil
	}
	var keys []Key
	for _, p := range svc.Spec.Ports {
		proto := cmp.Or(p.Protocol, v1.ProtocolTCP)
		if (proto == v1.ProtocolTCP || proto == v1.ProtocolUDP || proto == v1.ProtocolSCTP) && p.NodePort >= 1 && p.NodePort <= 65535 {
			keys = append(keys, Key{proto, uint16(p.NodePort)})
		}
	}
	return keys
}

func refServes(svc *v1.Service, f *family.Family) bool {
	known := false
	for _, s := range svc.Spec.IPFamilies {
		known = known || s == v1.IPv4Protocol || s == v1.IPv6Protocol
	}
	if known {
		return slices.Contains(svc.Spec.IPFamilies, f.IPFamily)
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 {
		ips = []string{svc.Spec.ClusterIP}
	}
	for _, s := range ips {
		// As kube-proxy reads a ClusterIP: k8s.io/utils/net's sloppy parser
		// (leading zeros decimal, no zone), IPv4 when it has a 4-byte form
		// (IPv4-mapped ones included).
		if ip := netutils.ParseIPSloppy(s); ip != nil && (ip.To4() != nil) == (f.BitLen == 32) {
			return true
		}
	}
	return false
}

func refOwners(live map[types.NamespacedName]*v1.Service) map[Key]types.NamespacedName {
	owners := map[Key]types.NamespacedName{}
	better := func(a, b *v1.Service) bool { // a beats b
		at, bt := a.CreationTimestamp.Time, b.CreationTimestamp.Time
		if at.IsZero() != bt.IsZero() {
			return bt.IsZero()
		}
		if !at.Equal(bt) {
			return at.Before(bt)
		}
		return a.Namespace+"\x00"+a.Name < b.Namespace+"\x00"+b.Name
	}
	for nn, svc := range live {
		for _, k := range refKeys(svc) {
			if cur, ok := owners[k]; !ok || better(svc, live[cur]) {
				owners[k] = nn
			}
		}
	}
	return owners
}

func FuzzRegistry(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 0, 1, 0, 1, 0, 1, 1, 0, 1, 0, 1, 0, 0, 1, 2, 0, 1, 1, 0, 1, 0})
	f.Add([]byte("\x01\x00\x02\x00\x00\x00\x02\x00\x01\x00\x00\x01\x01\x00\x00\x01\x01\x03\x01\x00\x00\x01\x00\x01\x00\x01\x01\x00\x00\x02\x02"))
	f.Add([]byte("nodeport registry fuzz seed with several operations and services in it"))
	f.Fuzz(func(t *testing.T, data []byte) {
		b := bytes(data)
		r := New(logr.Discard())
		notified := map[*family.Family]int{}
		r.OnChange(func(f *family.Family) { notified[f]++ })
		live := map[types.NamespacedName]*v1.Service{}
		prev := map[*family.Family]Reserved{}
		for _, f := range family.All {
			prev[f] = r.ReservedFor(f)
		}
		prevOwners := map[Key]types.NamespacedName{}
		for step := 0; len(b) > 0 && step < 64; step++ {
			clear(notified)
			svc := fuzzService(&b)
			nn := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
			before := live[nn]
			switch b.pick(5) {
			case 0:
				r.Delete(svc)
				delete(live, nn)
			case 1:
				r.Update(nil)
				r.Delete(nil)
			default:
				r.Update(svc)
				if svc.Name != "" {
					live[nn] = svc
				}
			}
			after := live[nn]

			// Each claimed key has exactly the one owner the reference picks.
			owners := refOwners(live)
			snap := r.Snapshot()
			got := map[Key]types.NamespacedName{}
			for i, c := range snap {
				if i > 0 && snap[i-1].Key.Compare(c.Key) >= 0 {
					t.Fatalf("step %d: Snapshot not sorted or repeats %v", step, c.Key)
				}
				got[c.Key] = c.Owner
				if o, ok := r.Owner(c.Key); !ok || o != c.Owner {
					t.Fatalf("step %d: Owner(%v) = %v, Snapshot says %v", step, c.Key, o, c.Owner)
				}
			}
			if !maps.Equal(got, owners) {
				t.Fatalf("step %d: owners %v, reference %v", step, got, owners)
			}

			for _, f := range family.All {
				// ReservedFor(f) is exactly the keys whose owner does not serve f.
				var want []Key
				for k, o := range owners {
					if !refServes(live[o], f) {
						want = append(want, k)
					}
				}
				slices.SortFunc(want, Key.Compare)
				cur := r.ReservedFor(f)
				if !slices.Equal(cur.Keys, want) {
					t.Fatalf("step %d: ReservedFor(%v) = %v, reference %v", step, f, cur.Keys, want)
				}
				// Notified, once, exactly when the reserved set changed.
				changed := !slices.Equal(cur.Keys, prev[f].Keys)
				if wantN := int(boolToUint(changed)); notified[f] != wantN || cur.Generation != prev[f].Generation+uint64(wantN) {
					t.Fatalf("step %d: %v changed=%v, notified %d times, generation %d→%d", step, f, changed, notified[f], prev[f].Generation, cur.Generation)
				}
				prev[f] = cur
				// An owner change concerning f reaches f: through the Service's own
				// event (it served f before or after) or through OnChange.
				sawEvent := (before != nil && refServes(before, f)) || (after != nil && refServes(after, f))
				servedBefore := func(o types.NamespacedName) bool {
					s := live[o]
					if o == nn {
						s = before
					}
					return s != nil && refServes(s, f)
				}
				for k := range keysOf(prevOwners, owners) {
					was, is := prevOwners[k], owners[k]
					if was != is && (servedBefore(was) || (live[is] != nil && refServes(live[is], f))) && !sawEvent && notified[f] == 0 {
						t.Fatalf("step %d: owner of %v changed %v→%v, unseen by %v", step, k, was, is, f)
					}
				}
			}
			for k := range keysOf(prevOwners, owners) {
				if o := prevOwners[k]; o != owners[k] && o != nn && owners[k] != nn {
					t.Fatalf("step %d: owner of %v changed %v→%v by an update of %v", step, k, o, owners[k], nn)
				}
			}
			prevOwners = owners
		}
	})
}

func keysOf[V any](ms ...map[Key]V) map[Key]bool {
	out := map[Key]bool{}
	for _, m := range ms {
		for k := range m {
			out[k] = true
		}
	}
	return out
}
