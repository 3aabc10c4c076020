//go:build netns

package netns

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// prober opens new TCP connections from one namespace to one address per
// family, over and over, until stopped: what a client of a Service sees while
// the proxy changes under it.
type prober struct {
	mu       sync.Mutex
	failures []string
	dials    map[*family.Family]int
	stopc    chan struct{}
	wg       sync.WaitGroup
}

// startProber dials each of dsts from from, pausing between dials.
func startProber(from *NS, dsts map[*family.Family]netip.AddrPort, pause time.Duration) *prober {
	p := &prober{dials: map[*family.Family]int{}, stopc: make(chan struct{})}
	for f, dst := range dsts {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for {
				select {
				case <-p.stopc:
					return
				default:
				}
				_, err := Dial(from, TCP, dst, time.Second)
				p.mu.Lock()
				p.dials[f]++
				if err != nil {
					p.failures = append(p.failures, fmt.Sprintf("%s %s new connection to %s: %v", time.Now().Format("15:04:05.000"), f, dst, err))
				}
				p.mu.Unlock()
				time.Sleep(pause)
			}
		}()
	}
	return p
}

// stop ends the dials and returns their count per family and the failures.
func (p *prober) stop() (map[*family.Family]int, []string) {
	close(p.stopc)
	p.wg.Wait()
	return p.dials, p.failures
}

// check stops the dials and fails the test if any failed, or if a family had
// fewer than minDials across what the test did (across, for the messages).
func (p *prober) check(t *testing.T, e *proxyNode, across string, minDials int) {
	t.Helper()
	dials, failures := p.stop()
	if len(failures) > 0 {
		e.fatalf(t, "%d of %v new connections failed across %s:\n%s", len(failures), dials, across, strings.Join(failures, "\n"))
	}
	for _, f := range family.All {
		if dials[f] < minDials {
			e.fatalf(t, "%s: only %d new connections across %s", f, dials[f], across)
		}
	}
	t.Logf("new connections across %s: %v", across, dials)
}
