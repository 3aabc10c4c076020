//go:build e2e && netns

package e2e

import (
	"flag"
	"fmt"
	"os"
	"sync"
	"time"
)

var flagSamples = flag.String("samples", "", "file to append every W2/W3 sample to, as CSV: proxy,services,workload,family,start,event,kernel (wall-clock RFC 3339, ns), to line samples up with a proxy's log or a kernel trace")

var samples struct {
	mu sync.Mutex
	f  *os.File
}

// recordSample appends one W2/W3 sample to the -samples file, if one is set:
// the change started at t0 (the API call), its watch event arrived at ev and
// the kernel showed it at at. A write error is reported once and stops the
// recording; the benchmark goes on.
func recordSample(p *proc, services int, workload, family string, t0, ev, at time.Time) {
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
	if _, err := fmt.Fprintf(samples.f, "%s,%d,%s,%s,%s,%s,%s\n", p.spec, services, workload, family,
		t0.Format(layout), ev.Format(layout), at.Format(layout)); err != nil {
		fmt.Fprintf(os.Stderr, "samples: %v (not recording)\n", err)
		*flagSamples = ""
	}
}
