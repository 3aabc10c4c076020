package healthcheck

import (
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// TestLeakChurnServiceHealth: health check Services that come and go (with
// open keep-alive connections) leave no Service, failure or goroutine behind.
func TestLeakChurnServiceHealth(t *testing.T) {
	fn := newFakeNet()
	s := NewServiceHealthServer(ServiceHealthConfig{Listen: fn.Listen})
	defer s.Close()
	f := family.IPv4
	s.SyncServices(f, nil)
	time.Sleep(50 * time.Millisecond)
	base := runtime.NumGoroutine()
	client := &http.Client{Transport: &http.Transport{}}
	for round := 0; round < 3; round++ {
		svcs := map[types.NamespacedName]uint16{}
		for i := 0; i < 30; i++ {
			svcs[types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("s%d-%d", round, i)}] = uint16(31000 + i)
		}
		fn.setFail(":31005", errors.New("in use"))
		s.SyncServices(f, svcs)
		for i := 0; i < 30; i++ {
			if i == 5 {
				continue
			}
			resp, err := client.Get(fn.url(t, fmt.Sprintf(":%d", 31000+i)))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		s.SyncServices(f, nil)
		fn.setFail(":31005", nil)
		client.CloseIdleConnections()
		time.Sleep(100 * time.Millisecond)
		fh := s.fams[f]
		if g := runtime.NumGoroutine(); g > base+2 || len(fh.services) != 0 || len(fh.failing) != 0 {
			t.Errorf("round %d: goroutines %d (baseline %d), services %d, failing %d", round, g, base, len(fh.services), len(fh.failing))
		}
	}
}
