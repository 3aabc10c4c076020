//go:build e2e && netns

package e2e

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

var flagSamples = flag.String("samples", "", "file to append every W2/W3 sample to, as CSV: proxy,services,workload,family,start,event,kernel (wall-clock RFC 3339, ns),ran,waited (the proxy's threads' CPU time and time waiting for a CPU from start until the kernel showed the change, in both families for W3, ns; empty if unread), to line samples up with a proxy's log or a kernel trace")

var samples struct {
	mu sync.Mutex
	f  *os.File
}

// recordSample appends one W2/W3 sample to the -samples file, if one is set:
// the change started at t0 (the API call), its watch event arrived at ev and
// the kernel showed it at at; sc is what the scheduler accounted to the proxy
// and to etcd and kube-apiserver meanwhile. A write error is reported once and stops the
// recording; the benchmark goes on.
func recordSample(p *proc, services int, workload, family string, t0, ev, at time.Time, sc slowChange) {
	samples.mu.Lock()
	defer samples.mu.Unlock()
	if *flagSamples == "" {
		return
	}
	if samples.f == nil {
		f, err := os.OpenFile(*flagSamples, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintf(os.Stderr, "samples: %v (not recording)\n", err)
			*flagSamples = ""
			return
		}
		samples.f = f
	}
	const layout = "2006-01-02T15:04:05.000000000Z07:00"
	ran, waited, cpRan, cpWaited := "", "", "", ""
	if sc.ok {
		ran, waited = strconv.FormatInt(int64(sc.sched.ran), 10), strconv.FormatInt(int64(sc.sched.waited), 10)
	}
	if sc.cpOK {
		cpRan, cpWaited = strconv.FormatInt(int64(sc.cp.ran), 10), strconv.FormatInt(int64(sc.cp.waited), 10)
	}
	if _, err := fmt.Fprintf(samples.f, "%s,%d,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", p.spec, services, workload, family,
		t0.Format(layout), ev.Format(layout), at.Format(layout), ran, waited, cpRan, cpWaited); err != nil {
		fmt.Fprintf(os.Stderr, "samples: %v (not recording)\n", err)
		*flagSamples = ""
	}
}
