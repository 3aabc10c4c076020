//go:build netns

package nftables

import (
	"context"
	"testing"
	"time"

	"github.com/dsproxy/dsproxy/internal/netnstest"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/nft"
)

// timedKernel records how long each Apply takes.
type timedKernel struct {
	nft.Kernel
	durations []time.Duration
}

func (k *timedKernel) Apply(ctx context.Context, tx *nft.Tx) error {
	start := time.Now()
	err := k.Kernel.Apply(ctx, tx)
	k.durations = append(k.durations, time.Since(start))
	return err
}

func newNetlinkInNetNS(t *testing.T) *nft.Netlink {
	t.Helper()
	nl, err := nft.NewNetlink(nft.WithNetNSFd(int(netnstest.New(t))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nl.Close() })
	return nl
}

// TestKernel runs the backend against the real kernel in a fresh netns: a cold
// start of 5k services, one-endpoint syncs, a full sync that must find nothing to
// repair (the kernel's read-back prints as written), a restart that swaps tables,
// and cleanup.
func TestKernel(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			k := &timedKernel{Kernel: newNetlinkInNetNS(t)}
			e, _ := bigEnv(t, f, 5000, nil)
			oneLocal(etpLocal(), sourceRange(1, 24), affinity(10800))(e)
			e.b = New(f, k, Options{MaxElementsPerTx: 20000})
			start := time.Now()
			res := e.sync(true)
			t.Logf("cold start: %v in %d transactions, longest %v", time.Since(start), res.Transactions, slowest(k.durations))

			name := e.name(7)
			eps := e.eps[name]
			k.durations = nil
			for i := range 20 {
				if i%2 == 0 {
					e.put(e.state.Ports[name].ServicePort, eps[1:]...)
				} else {
					e.put(e.state.Ports[name].ServicePort, eps...)
				}
				res = e.sync(false, name)
			}
			t.Logf("remove/add one endpoint x20: last %d operations, %v", res.Operations, k.durations)

			res = e.sync(true)
			if res.Repairs != 0 {
				t.Errorf("full sync on an untouched kernel: %d repairs", res.Repairs)
			}

			e.b = New(f, k, Options{MaxElementsPerTx: 20000})
			k.durations = nil
			res = e.sync(true)
			t.Logf("restart: %d transactions, swap transaction %v", res.Transactions, k.durations[len(k.durations)-1])
			if res := e.sync(true); res.Repairs != 0 {
				t.Errorf("full sync after restart: %d repairs", res.Repairs)
			}
			if err := e.b.Cleanup(t.Context()); err != nil {
				t.Fatal(err)
			}
			if tables, _ := k.ListTables(t.Context(), f); len(tables) != 0 {
				t.Errorf("tables after cleanup: %v", tables)
			}
		})
	}
}

func slowest(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}

// TestAffinityFollowsMovesKernel is TestAffinityFollowsMoves against the real
// kernel: its dynamic affinity maps take the moved entries (with the life they
// have left) and the old slots go.
func TestAffinityFollowsMovesKernel(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			k := newNetlinkInNetNS(t)
			e := newEnv(t, f)
			e.b = New(f, k, Options{})
			testAffinityFollowsMoves(t, e, k)
		})
	}
}
