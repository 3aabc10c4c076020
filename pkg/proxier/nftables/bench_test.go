package nftables

import (
	"fmt"
	"testing"
	"time"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
)

// benchSizes are the Service counts of issue 5's micro-benchmarks.
var benchSizes = []int{1000, 10000, 30000}

// syncedBigEnv is bigEnv over a kernel that accepts everything, after its cold sync.
func syncedBigEnv(b *testing.B, f *family.Family, n int) (*env, *recorder) {
	e, rec := bigEnv(b, f, n, nil)
	e.t = nil
	if _, err := e.b.Sync(b.Context(), syncAll(e)); err != nil {
		b.Fatal(err)
	}
	return e, rec
}

// BenchmarkOneEndpointChange measures the pure-Go cost of a sync that adds or
// removes one endpoint of one service (diff + transaction building), with a kernel
// that accepts everything.
func BenchmarkOneEndpointChange(b *testing.B) {
	for _, n := range benchSizes {
		for _, f := range family.All {
			b.Run(fmt.Sprintf("%s/services=%d", f, n), func(b *testing.B) {
				e, rec := syncedBigEnv(b, f, n)
				name := e.name(n / 2)
				sp := e.state.Ports[name].ServicePort
				eps := e.eps[name]
				extra := ep(f, 0, 8080, false)
				extra.Addr = addrPlus(testaddr.Pod(f, 0), 1<<20)
				grown := append(append(eps[:0:0], eps...), extra)
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					if i%2 == 0 {
						e.put(sp, grown...)
					} else {
						e.put(sp, eps...)
					}
					res, err := e.b.Sync(b.Context(), syncChanged(e, name))
					// ClusterIP and NodePort frontends: per frontend, the set move and the endpoint element.
					if err != nil || res.Operations > 6 {
						b.Fatalf("sync: %v, %d operations:\n%s", err, res.Operations, rec.last)
					}
				}
			})
		}
	}
}

// BenchmarkColdStart measures the pure-Go cost of a rebuild (cache fill, element
// lists, transaction building) with a kernel that accepts everything: the usual
// 10 endpoints per Service, and at 10k Services also 1 … 40 (40 dispatch groups
// per kind, twice the endpoint elements).
func BenchmarkColdStart(b *testing.B) {
	run := func(b *testing.B, e *env) {
		f := e.f
		e.t = nil
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			e.b = New(f, &recorder{}, Options{})
			if _, err := e.b.Sync(b.Context(), syncAll(e)); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			e, _ := bigEnv(b, family.IPv4, n, nil)
			run(b, e)
		})
	}
	b.Run("services=10000/counts=1-40", func(b *testing.B) {
		f := family.IPv4
		e := newEnv(b, f)
		for i := range 10000 {
			sp := svc(f, fmt.Sprintf("s%d", i), 0, 80, tcp, nodePort(uint16(30000+i%2500)))
			sp.ClusterIP = addrPlus(testaddr.Svc(f, 0), 256+i)
			eps := make([]model.Endpoint, 1+i%40)
			for j := range eps {
				eps[j] = ep(f, 0, 8080, false)
				eps[j].Addr = addrPlus(testaddr.Pod(f, 0), 256+i*64+j)
			}
			e.put(sp, eps...)
		}
		run(b, e)
	})
}

// BenchmarkOneServiceAddDelete measures the pure-Go cost of the two syncs that add a
// new NodePort Service with 10 endpoints and delete it again (diff + transaction
// building), with a kernel that accepts everything. One op is the pair; each sync
// may touch at most the ClusterIP and NodePort frontends (an element in a dispatch map
// and one per endpoint each) and @cluster-ips.
func BenchmarkOneServiceAddDelete(b *testing.B) {
	for _, n := range benchSizes {
		for _, f := range family.All {
			b.Run(fmt.Sprintf("%s/services=%d", f, n), func(b *testing.B) {
				e, rec := syncedBigEnv(b, f, n)
				sp := svc(f, "added", 0, 80, tcp, nodePort(uint16(30000+n)))
				sp.ClusterIP = addrPlus(testaddr.Svc(f, 0), 256+n)
				eps := make([]model.Endpoint, 10)
				for j := range eps {
					eps[j] = ep(f, 0, 8080, false)
					eps[j].Addr = addrPlus(testaddr.Pod(f, 0), 256+n*16+j)
				}
				var addT, delT time.Duration
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					t0 := time.Now()
					name := e.put(sp, eps...)
					add, err := e.b.Sync(b.Context(), syncChanged(e, name))
					t1 := time.Now()
					if err != nil || add.Operations == 0 || add.Operations > 2*(1+len(eps))+1 {
						b.Fatalf("add: %v, %d operations:\n%s", err, add.Operations, rec.last)
					}
					e.del(name)
					del, err := e.b.Sync(b.Context(), syncChanged(e, name))
					t2 := time.Now()
					if err != nil || del.Operations == 0 || del.Operations > 2*(1+len(eps))+1 {
						b.Fatalf("delete: %v, %d operations:\n%s", err, del.Operations, rec.last)
					}
					addT += t1.Sub(t0)
					delT += t2.Sub(t1)
				}
				// The two halves apart: a delete is expected to cost about an add.
				b.ReportMetric(float64(addT.Nanoseconds())/float64(b.N), "add-ns/op")
				b.ReportMetric(float64(delT.Nanoseconds())/float64(b.N), "delete-ns/op")
			})
		}
	}
}
