//go:build netns

package nftables

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dsproxy/dsproxy/internal/netnstest"
	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/proxier"
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

func newNetlinkInNetNS(t testing.TB) *nft.Netlink {
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

// BenchmarkAffinityMove is the cost of a sync that removes one endpoint of a
// ClientIP affinity Service whose last endpoint then moves into the freed slot,
// with n affinity entries in the family (a quarter of them on the moved
// endpoint): the sync's transaction, the read of @affinity and
// @nodeport-affinity, and the transaction moving the entries. The read grows
// with the square of the entries (the kernel restarts its walk for each dump
// message). Syncs skip the read once a map held more than affinityMoveMax
// entries; here every sync reads.
//
//	go test -tags netns -run '^$' -bench AffinityMove -benchtime 5x ./pkg/proxier/nftables/
func BenchmarkAffinityMove(b *testing.B) {
	for _, f := range family.All {
		for _, n := range []int{1000, affinityMoveMax, 20000, 65535} {
			b.Run(fmt.Sprintf("%s/%d", f.Name, n), func(b *testing.B) {
				k := newNetlinkInNetNS(b)
				e := newEnv(b, f)
				e.b = New(f, k, Options{})
				web := stickyWeb(e)
				sync := func() {
					if _, err := e.b.Sync(b.Context(), &proxier.SyncRequest{State: e.state, Node: e.node, Changed: []model.ServicePortName{web}}); err != nil {
						b.Fatal(err)
					}
				}
				if _, err := e.b.Sync(b.Context(), syncAll(e)); err != nil {
					b.Fatal(err)
				}
				all := e.eps[web]
				for range b.N {
					b.StopTimer()
					e.put(e.state.Ports[web].ServicePort, all...)
					sync()
					tx := nft.NewTx(f)
					tx.FlushSet(e.b.Table(), fixedSetNames[setAffinity])
					tx.FlushSet(e.b.Table(), fixedSetNames[setNodePortAffinity])
					var cl, np []nft.Element
					for i := range n {
						c := testaddr.Plus(testaddr.Client(f, 0), i)
						ck, nk := affinityKeys(f, c)
						cl = append(cl, nft.Element{Key: ck, Data: nft.MarkBytes(uint32(i % 4)), Timeout: time.Hour})
						if i%8 == 0 { // fewer clients come through the NodePort
							np = append(np, nft.Element{Key: nk, Data: nft.MarkBytes(kinds[kindNP].offset() + uint32(i%4)), Timeout: time.Hour})
						}
					}
					tx.AddElements(e.b.Table(), fixedSetNames[setAffinity], cl)
					tx.AddElements(e.b.Table(), fixedSetNames[setNodePortAffinity], np)
					if err := k.Apply(b.Context(), tx); err != nil {
						b.Fatal(err)
					}
					first := e.b.c.ports[web].slotList(listCluster)[0]
					var rest []model.Endpoint
					for _, ep := range all {
						if ep.AddrPort() != first {
							rest = append(rest, ep)
						}
					}
					e.put(e.state.Ports[web].ServicePort, rest...)
					clear(e.b.affinitySeen)
					b.StartTimer()
					sync()
				}
			})
		}
	}
}
