//go:build e2e && netns

package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	"k8s.io/client-go/rest"

	"github.com/dsproxy/dsproxy/bench"
	"github.com/dsproxy/dsproxy/pkg/kubeclient"
	"github.com/dsproxy/dsproxy/pkg/watch"
	"github.com/dsproxy/dsproxy/test/e2e/framework"
)

// listTransport is one way of taking the informers' initial lists.
type listTransport struct {
	name      string
	http2     bool // lists over the shared HTTP/2 connection (dsproxy before b59ce2d, kube-proxy)
	watchList bool // streaming lists (client-go's default) rather than LISTs
}

var listTransports = []listTransport{
	{"HTTP/2 streaming list", true, true},
	{"HTTP/1.1 streaming list", false, true},
	{"HTTP/2 LIST", true, false},
	{"HTTP/1.1 LIST", false, false},
}

// TestListTransports measures the informers' initial lists alone against the test
// control plane loaded with the largest of -services: dsproxy's API client and
// informers (watch.Start with counting handlers: no proxier), over HTTP/2 and
// HTTP/1.1, as streaming lists and as LISTs, in four alternating rounds. Each
// line gives the wall time to watch.Start's return, this process's CPU and
// kube-apiserver's; the medians follow. It measures no proxy and writes no
// files:
//
//	go test -tags e2e,netns -run TestListTransports -v -count=1 -timeout 60m ./bench/e2e/ -args -services=10000
func TestListTransports(t *testing.T) {
	sizes, root := prologue(t)
	n := sizes[len(sizes)-1]
	cp := startControlPlane(t, root)
	ld, err := newLoad(t, cp, []int{n}, *flagSpread)
	if err != nil {
		t.Fatal(err)
	}
	if err := ld.grow(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	settle(t, "the lists")
	type sample struct{ wall, cpu, api float64 }
	got := map[string][]sample{}
	for round := range 4 {
		for _, lt := range listTransports {
			s, objects, err := measureLists(t, cp, lt)
			if err != nil {
				t.Fatalf("%s: %v", lt.name, err)
			}
			// The load's n Services and 2n slices, and a few more (the
			// kubernetes Service, the benchmark's real Services).
			if want := int64(3 * n); objects < want || objects > want+100 {
				t.Fatalf("%s: %d objects delivered, want %d and a few", lt.name, objects, want)
			}
			got[lt.name] = append(got[lt.name], sample{s[0], s[1], s[2]})
			t.Logf("round %d, %-23s: %d objects in %.3f s; this process's CPU %.2f s, kube-apiserver's %.2f s", round+1, lt.name, objects, s[0], s[1], s[2])
			time.Sleep(3 * time.Second)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "initial lists of %d Services and %d EndpointSlices, median of 4 (min – max):\n", n, 2*n)
	for _, lt := range listTransports {
		col := func(f func(sample) float64) string {
			var v []float64
			for _, s := range got[lt.name] {
				v = append(v, f(s))
			}
			slices.Sort(v)
			return fmt.Sprintf("%.2f s (%.2f – %.2f)", (v[1]+v[2])/2, v[0], v[3])
		}
		fmt.Fprintf(&b, "  %-23s  wall %s  client CPU %s  kube-apiserver CPU %s\n", lt.name,
			col(func(s sample) float64 { return s.wall }), col(func(s sample) float64 { return s.cpu }), col(func(s sample) float64 { return s.api }))
	}
	t.Log("\n" + b.String())
}

// measureLists runs one watch.Start over lt and returns its wall time, this
// process's CPU and kube-apiserver's (seconds) and the objects delivered.
func measureLists(t *testing.T, cp *framework.ControlPlane, lt listTransport) ([3]float64, int64, error) {
	clientfeaturestesting.SetFeatureDuringTest(t, features.WatchListClient, lt.watchList)
	rc := rest.CopyConfig(cp.Config)
	if lt.http2 {
		// kubeclient uses a transport a config brings for every request:
		// client-go's own (TLS, HTTP/2, dialling into the control plane's
		// namespace), as dsproxy before b59ce2d and kube-proxy.
		rt, err := rest.TransportFor(cp.Config)
		if err != nil {
			return [3]float64{}, 0, err
		}
		rc = &rest.Config{Host: cp.Config.Host, Transport: rt}
	}
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.QPS = -1
	c, err := kubeclient.New(rc)
	if err != nil {
		return [3]float64{}, 0, err
	}
	h := &bench.CountingHandler{}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// This process alone: the control plane's processes are its children.
	self, _, err := statTicks(os.Getpid())
	if err != nil {
		return [3]float64{}, 0, err
	}
	api := apiserverCPU(cp)
	start := time.Now()
	if err := watch.Start(ctx, c, h, watch.Options{}); err != nil {
		return [3]float64{}, 0, err
	}
	wall := time.Since(start).Seconds()
	self2, _, _ := statTicks(os.Getpid())
	return [3]float64{wall, float64(self2-self) / 100, apiserverCPU(cp) - api}, h.Services.Load() + h.Slices.Load(), nil
}
