package nftables

import (
	"fmt"
	"testing"
	"time"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nft"
)

// cacheSize counts the entries of a backend's cache.
type cacheSize struct {
	ports, groups, grp, byID, chains, sets, elems, touched, moves, vm int
}

func sizeOf(e *env) cacheSize {
	c := e.b.c
	s := cacheSize{ports: len(c.ports), groups: len(c.groups), grp: len(c.grp), byID: len(c.byID),
		chains: len(c.chains), sets: len(c.sets), touched: len(c.touched), moves: len(c.moves)}
	for _, st := range c.sets {
		s.elems += len(st.elems)
	}
	for _, m := range c.vmaps {
		s.vm += len(m)
	}
	return s
}

// TestLeakChurnNFTablesCache: add services with varying endpoint counts,
// affinity, ranges; delete them all; the cache returns to baseline after a
// (non-rebuilding) full sync, and partial-sync-only churn stays bounded.
func TestLeakChurnNFTablesCache(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			e := newEnv(t, f)
			e.b.opts.RebuildEvery = -1
			e.sync(true)
			base := sizeOf(e)
			baseDump := e.fake.Dump(f)
			for round := 0; round < 5; round++ {
				var names []model.ServicePortName
				for i := 0; i < 40; i++ {
					n := 10 + i
					opts := []svcOpt{nodePort(uint16(30000 + i)), lbVIP(i + 1), sourceRange(1, 24)}
					if i%3 == 0 {
						opts = append(opts, affinity(uint32(100+i)))
					}
					if i%4 == 0 {
						opts = append(opts, etpLocal())
					}
					sp := svc(f, fmt.Sprintf("s%d-%d", round, i), n, 80, []uint8{tcp, udp, sctp}[i%3], opts...)
					var eps []model.Endpoint
					for j := 0; j <= i%7; j++ {
						eps = append(eps, ep(f, 1+(7*i+j+round)%250, 8080, j%2 == 0))
					}
					names = append(names, e.put(sp, eps...))
				}
				e.sync(false, names...)
				// Every Service's endpoints change.
				for i, n := range names {
					ps := e.state.Ports[n]
					var eps []model.Endpoint
					for j := 0; j <= (i+round)%5; j++ {
						eps = append(eps, ep(f, 1+(11*i+j+3*round)%250, 8080, j%2 == 1))
					}
					e.put(ps.ServicePort, eps...)
				}
				e.sync(false, names...)
				for _, n := range names {
					e.del(n)
				}
				e.sync(false, names...)
			}
			e.sync(true)
			got := sizeOf(e)
			if got != base {
				t.Errorf("after churn and a full sync: %+v, baseline %+v", got, base)
			}
			if d := e.fake.Dump(f); d != baseDump {
				t.Errorf("kernel after churn and a full sync:\n%s\nbaseline:\n%s", d, baseDump)
			}
		})
	}
}

// putClientsFrom adds affinity entries for clients first..first+n-1 of web, on
// slots 0..n-1, as the kernel's pick rule does.
func putClientsFrom(t *testing.T, e *env, first, n int) {
	t.Helper()
	tx := nft.NewTx(e.f)
	for i := range n {
		c := nft.AddrBytes(stickyClient(e.f, first+i))
		ck := nft.Concat(c, []byte(vipKey(cip(e.f, 10, 80).Addr(), tcp, 80)))
		nk := nft.Concat(c, []byte(npKeyBytes(tcp, 30080)))
		tx.AddElements(e.b.Table(), fixedSetNames[setAffinity], []nft.Element{{Key: ck, Data: nft.MarkBytes(uint32(i)), Timeout: 3 * time.Hour}})
		tx.AddElements(e.b.Table(), fixedSetNames[setNodePortAffinity], []nft.Element{{Key: nk, Data: nft.MarkBytes(kinds[kindNP].offset() + uint32(i)), Timeout: 3 * time.Hour}})
	}
	if err := e.fake.Apply(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
}

func affinityCount(t *testing.T, e *env) int {
	t.Helper()
	n := 0
	for _, s := range []fixedSet{setAffinity, setNodePortAffinity} {
		els, err := e.fake.ListElements(t.Context(), e.f, e.b.Table(), fixedSetNames[s])
		if err != nil {
			t.Fatal(err)
		}
		n += len(els)
	}
	return n
}

// TestLeakAffinityEntriesOfDeletedServices: a rebuild (the daemon's hourly full
// sync) does not carry the ClientIP affinity entries of a deleted Service into
// the new table. Carried, they stayed in the family's one @affinity map (65535
// entries for every Service) until their timeout, up to a day; kube-proxy's
// affinity sets are per endpoint and go at the sync after the endpoint does.
func TestLeakAffinityEntriesOfDeletedServices(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			e := newEnv(t, f)
			e.b.opts.RebuildEvery = 1 // as the daemon
			e.sync(true)
			for round := range 3 {
				web := stickyWeb(e)
				e.sync(false, web)
				putClientsFrom(t, e, 10*round, 4) // four new clients
				e.del(web)
				e.sync(false, web)
				e.sync(true) // the hourly full sync: a rebuild
				if n := affinityCount(t, e); n != 0 {
					t.Errorf("round %d: every Service deleted, the affinity maps still hold %d entries", round, n)
				}
			}
		})
	}
}

// TestRebuildKeepsLiveAffinity: a rebuild carries the affinity entries of every
// frontend of a Service with ClientIP affinity (its ClusterIP, ExternalIP, ETP
// Local VIP and NodePort), drops those of a Service without affinity, and those
// of the first Service once it loses its affinity.
func TestRebuildKeepsLiveAffinity(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			e := newEnv(t, f)
			e.b.opts.RebuildEvery = 1 // as the daemon
			sticky := func(opts ...svcOpt) *model.ServicePort {
				return svc(f, "lb", 10, 80, tcp, append([]svcOpt{nodePort(30080), externalIP(1), lbVIP(2), etpLocal()}, opts...)...)
			}
			lb := e.put(sticky(affinity(10800)), ep(f, 1, 8080, true), ep(f, 2, 8080, false))
			plain := e.put(svc(f, "plain", 11, 80, tcp), ep(f, 3, 8080, false))
			e.sync(true)
			client := nft.AddrBytes(stickyClient(f, 0))
			entry := func(key string) nft.Element {
				return nft.Element{Key: nft.Concat(client, []byte(key)), Data: nft.MarkBytes(0), Timeout: time.Hour}
			}
			tx := nft.NewTx(f)
			tx.AddElements(e.b.Table(), fixedSetNames[setAffinity], []nft.Element{
				entry(vipKey(cip(f, 10, 80).Addr(), tcp, 80)), entry(vipKey(ext(f, 1, 80).Addr(), tcp, 80)),
				entry(vipKey(ext(f, 2, 80).Addr(), tcp, 80)), entry(vipKey(cip(f, 11, 80).Addr(), tcp, 80)),
			})
			tx.AddElements(e.b.Table(), fixedSetNames[setNodePortAffinity], []nft.Element{entry(npKeyBytes(tcp, 30080))})
			if err := e.fake.Apply(t.Context(), tx); err != nil {
				t.Fatal(err)
			}
			e.sync(true)
			if n := affinityCount(t, e); n != 4 {
				t.Errorf("after a rebuild: %d affinity entries, want 4 (lb's ClusterIP, ExternalIP, VIP and NodePort; not plain's)", n)
			}
			e.put(sticky(), ep(f, 1, 8080, true), ep(f, 2, 8080, false))
			e.sync(false, lb, plain)
			e.sync(true)
			if n := affinityCount(t, e); n != 0 {
				t.Errorf("lb without affinity, after a rebuild: %d affinity entries, want 0", n)
			}
		})
	}
}
