package nftables

import (
	"fmt"
	"testing"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/family"
)

// BenchmarkOneEndpointChange measures the pure-Go cost of a sync that adds or
// removes one endpoint of one service (diff + transaction building), with a kernel
// that accepts everything.
func BenchmarkOneEndpointChange(b *testing.B) {
	for _, n := range []int{10000, 30000} {
		for _, f := range family.All {
			b.Run(fmt.Sprintf("%s/services=%d", f, n), func(b *testing.B) {
				e, rec := bigEnv(b, f, n, nil)
				e.t = nil
				if _, err := e.b.Sync(b.Context(), syncAll(e)); err != nil {
					b.Fatal(err)
				}
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
// lists, transaction building) with a kernel that accepts everything.
func BenchmarkColdStart(b *testing.B) {
	for _, n := range []int{10000, 30000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			f := family.IPv4
			e, _ := bigEnv(b, f, n, nil)
			e.t = nil
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				e.b = New(f, &recorder{}, Options{})
				if _, err := e.b.Sync(b.Context(), syncAll(e)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
