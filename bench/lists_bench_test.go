package bench

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/dsproxy/dsproxy/internal/liststream"
	"github.com/dsproxy/dsproxy/pkg/endpointslice"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/kubeclient"
	"github.com/dsproxy/dsproxy/pkg/metaproxier"
	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/nodeport"
	"github.com/dsproxy/dsproxy/pkg/proxier"
	"github.com/dsproxy/dsproxy/pkg/proxier/nftables"
	"github.com/dsproxy/dsproxy/pkg/watch"
)

// encodeLists encodes w's Services and EndpointSlices as the API server streams
// the informers' initial lists.
func encodeLists(tb testing.TB, w Workload) *liststream.Streams {
	tb.Helper()
	var svcs, slices []runtime.Object
	for i := range w.Services {
		s := w.Service(i)
		s.ResourceVersion = "1"
		svcs = append(svcs, s)
		for _, f := range family.All {
			es := w.Slice(f, i, w.EndpointCount(i))
			es.ResourceVersion = "1"
			slices = append(slices, es)
		}
	}
	ls, err := liststream.Encode(map[string][]runtime.Object{liststream.ServicesPath: svcs, liststream.EndpointSlicesPath: slices})
	if err != nil {
		tb.Fatal(err)
	}
	return ls
}

// BenchmarkInitialLists measures W1's first part in process: dsproxy's API client
// and informers receiving the initial lists of n dual-stack Services and their 2n
// EndpointSlices (10 endpoints each) as a v1.36 API server streams them, over TLS
// in protobuf, until watch.Start returns (every handler has had every object).
// The handlers are either CountingHandler (the client and the informers alone)
// or both families' proxiers behind a MetaProxier with the NodePort registry, as
// the daemon's (their trackers; no sync, the kernel a Fake). The server only
// writes bytes encoded beforehand; its TLS and HTTP framing are in the same
// process and in cpu-ms/op. One op is one proxy start.
func BenchmarkInitialLists(b *testing.B) {
	for _, n := range sizes {
		w := Workload{Services: n, EndpointsPerFamily: 10, NodePortEvery: 4, NodeName: "node-0"}
		ls := encodeLists(b, w)
		ts, rc := liststream.StartTLS(ls)
		for _, handler := range []string{"count", "proxiers"} {
			b.Run(fmt.Sprintf("services=%d/handler=%s", n, handler), func(b *testing.B) {
				b.ReportAllocs()
				var cpu time.Duration
				for b.Loop() {
					client, err := kubeclient.New(rc)
					if err != nil {
						b.Fatal(err)
					}
					counts := &CountingHandler{}
					var h watch.Handler = counts
					if handler == "proxiers" {
						h = newProxiersHandler(b, w.NodeName, counts)
					}
					ctx, cancel := context.WithCancel(context.Background())
					cpu0 := processCPU()
					err = watch.Start(ctx, client, h, watch.Options{})
					cpu += processCPU() - cpu0
					cancel()
					if err != nil {
						b.Fatal(err)
					}
					if got := counts.Services.Load(); got != int64(n) {
						b.Fatalf("%d Services delivered, want %d", got, n)
					}
					if got, want := counts.Endpoints.Load(), int64(2*n*w.EndpointsPerFamily); counts.Slices.Load() != int64(2*n) || got != want {
						b.Fatalf("%d EndpointSlices with %d endpoints delivered, want %d with %d", counts.Slices.Load(), got, 2*n, want)
					}
				}
				if u := ls.Unexpected.Load(); u > 0 {
					b.Fatalf("%d requests were not streaming lists", u)
				}
				b.ReportMetric(float64(cpu.Microseconds())/1e3/float64(b.N), "cpu-ms/op")
				b.ReportMetric(float64(ls.Bytes())/float64(3*n), "B/object")
			})
		}
		ts.Close()
	}
}

// proxiersHandler is the daemon's watch.Handler: the NodePort registry, then both
// families' proxiers behind a MetaProxier; it also counts the adds into counts.
type proxiersHandler struct {
	*metaproxier.MetaProxier
	reg    *nodeport.Registry
	counts *CountingHandler
}

func (h proxiersHandler) OnServiceAdd(s *v1.Service) {
	h.counts.OnServiceAdd(s)
	h.reg.Update(s)
	h.MetaProxier.OnServiceAdd(s)
}

func (h proxiersHandler) OnEndpointSliceAdd(o *endpointslice.Object) {
	h.counts.OnEndpointSliceAdd(o)
	h.MetaProxier.OnEndpointSliceAdd(o)
}

func newProxiersHandler(tb testing.TB, nodeName string, counts *CountingHandler) proxiersHandler {
	tb.Helper()
	reg := nodeport.New(logr.Discard())
	var fps []metaproxier.FamilyProxier
	for _, f := range family.All {
		p, err := proxier.New(proxier.Config{Family: f, NodeName: nodeName, Backend: nftables.New(f, nft.NewFake(), nftables.Options{}), NodePorts: reg})
		if err != nil {
			tb.Fatal(err)
		}
		fps = append(fps, p)
	}
	mp, err := metaproxier.New(fps...)
	if err != nil {
		tb.Fatal(err)
	}
	return proxiersHandler{mp, reg, counts}
}

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
