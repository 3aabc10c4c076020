// Package apialloc measures a cost of the Kubernetes API server that every
// proxy's W3 (one Service created, then deleted) includes: what kube-apiserver
// v1.36's ClusterIP allocator (pkg/registry/core/service/ipallocator) does for
// its metrics around every allocation and every release.
package apialloc

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	listersv1 "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
)

const managedBy = "ipallocator.k8s.io"

// used is the allocator's Used(), written after its code: list every
// IPAddress of the family the allocator manages from the informer's cache,
// through a label selector, and count those in its CIDR. After creating an
// IPAddress (an allocation) and after deleting one (a release) the allocator
// updates two gauges, allocated_ips with Used() and available_ips with Free(),
// which calls Used() again: two full lists per family, so four per
// dual-stack Service created and four per Service deleted.
func used(l listersv1.IPAddressLister, family string, prefix netip.Prefix) (int, error) {
	sel := labels.Set{networkingv1.LabelIPAddressFamily: family, networkingv1.LabelManagedBy: managedBy}.AsSelectorPreValidated()
	ips, err := l.List(sel)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip.Name); err == nil && prefix.Contains(a) {
			n++
		}
	}
	return n, nil
}

// addresses is a lister over the IPAddress objects of n dual-stack Services
// in 10.96.0.0/16 and fd00:96::/112, the benchmark's service CIDRs.
func addresses(tb testing.TB, n int) listersv1.IPAddressLister {
	tb.Helper()
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for i := range n {
		for fam, name := range map[string]string{
			"IPv4": fmt.Sprintf("10.96.%d.%d", i/256, i%256),
			"IPv6": fmt.Sprintf("fd00:96::%x", i),
		} {
			ip := &networkingv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
				networkingv1.LabelIPAddressFamily: fam, networkingv1.LabelManagedBy: managedBy,
			}}}
			if err := idx.Add(ip); err != nil {
				tb.Fatal(err)
			}
		}
	}
	return listersv1.NewIPAddressLister(idx)
}

func TestUsed(t *testing.T) {
	l := addresses(t, 300)
	for _, c := range []struct {
		family, prefix string
		want           int
	}{
		{"IPv4", "10.96.0.0/16", 300},
		{"IPv6", "fd00:96::/112", 300},
		{"IPv4", "10.96.0.0/24", 256}, // another CIDR of the family counts apart
		{"IPv6", "10.96.0.0/16", 0},
	} {
		got, err := used(l, c.family, netip.MustParsePrefix(c.prefix))
		if err != nil || got != c.want {
			t.Errorf("used(%s, %s) = %d, %v; want %d", c.family, c.prefix, got, err, c.want)
		}
	}
}

// BenchmarkUsed is one Used() of the IPv4 allocator at 1k, 10k and 30k
// dual-stack Services; ms/Service is the four per Service created (and again
// per Service deleted), on the API server's CPU.
func BenchmarkUsed(b *testing.B) {
	prefix := netip.MustParsePrefix("10.96.0.0/16")
	for _, n := range []int{1000, 10000, 30000} {
		l := addresses(b, n)
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			for b.Loop() {
				if got, err := used(l, "IPv4", prefix); err != nil || got != n {
					b.Fatalf("used = %d, %v; want %d", got, err, n)
				}
			}
			b.ReportMetric(4*float64(b.Elapsed())/float64(time.Millisecond)/float64(b.N), "ms/Service")
		})
	}
}
