package nftables

import (
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nft"
)

func TestSlotMoves(t *testing.T) {
	a := func(ns ...int) []netip.AddrPort {
		var out []netip.AddrPort
		for _, n := range ns {
			out = append(out, ap(testaddr.Pod(family.IPv4, n), 80))
		}
		return out
	}
	for _, c := range []struct {
		name     string
		old, cur []netip.AddrPort
		to       []int32
		ghosts   []uint32
	}{
		{"unchanged", a(1, 2, 3), a(1, 2, 3), nil, nil},
		{"grown", a(1, 2), a(1, 2, 3), nil, nil},
		{"last removed", a(1, 2, 3), a(1, 2), nil, nil},
		{"first created", nil, a(1, 2), nil, nil},
		{"last moved into a hole", a(1, 2, 3, 4), a(1, 4, 3), []int32{0, dropEntry, 2, 1}, []uint32{3}},
		{"replaced", a(1, 2, 3), a(1, 5, 3), []int32{0, dropEntry, 2}, nil},
		{"two moved", a(1, 2, 3, 4, 5), a(4, 5, 3), []int32{dropEntry, dropEntry, 2, 0, 1}, []uint32{3, 4}},
	} {
		to, ghosts := slotMoves(c.old, c.cur)
		if !slices.Equal(to, c.to) || !slices.Equal(ghosts, c.ghosts) {
			t.Errorf("%s: slotMoves = %v, %v; want %v, %v", c.name, to, ghosts, c.to, c.ghosts)
		}
	}
}

// stickyWeb is the Service of the affinity-move tests: ClientIP affinity, a
// ClusterIP and a NodePort, pods 1-4 in slots 0-3.
func stickyWeb(e *env) model.ServicePortName {
	f := e.f
	return e.put(svc(f, "web", 10, 80, tcp, affinity(10800), nodePort(30080)),
		ep(f, 1, 8080, false), ep(f, 2, 8080, false), ep(f, 3, 8080, false), ep(f, 4, 8080, false))
}

// stickyClient is client i (pod 20+i) of stickyWeb.
func stickyClient(f *family.Family, i int) netip.Addr { return testaddr.Pod(f, 20+i) }

// affinityKeys are the keys of client's entries for web's ClusterIP (in
// @affinity) and NodePort (in @nodeport-affinity).
func affinityKeys(f *family.Family, client netip.Addr) (cluster, np []byte) {
	s := nft.AddrBytes(client)
	return nft.Concat(s, []byte(vipKey(cip(f, 10, 80).Addr(), tcp, 80))), nft.Concat(s, []byte(npKeyBytes(tcp, 30080)))
}

// putClients adds affinity entries putting client i on slot slots[i] of both
// of web's frontends, as the kernel's pick rule would.
func putClients(t *testing.T, e *env, k nft.Kernel, slots ...uint32) {
	t.Helper()
	tx := nft.NewTx(e.f)
	for i, s := range slots {
		ck, nk := affinityKeys(e.f, stickyClient(e.f, i))
		tx.AddElements(e.b.Table(), fixedSetNames[setAffinity], []nft.Element{{Key: ck, Data: nft.MarkBytes(s), Timeout: time.Hour}})
		tx.AddElements(e.b.Table(), fixedSetNames[setNodePortAffinity], []nft.Element{{Key: nk, Data: nft.MarkBytes(kinds[kindNP].offset() + s), Timeout: time.Hour}})
	}
	if err := k.Apply(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
}

// clientSlots returns the slot each client's entries hold (-1: none), failing
// the test when the two frontends disagree.
func clientSlots(t *testing.T, e *env, k nft.Kernel, n int) []int {
	t.Helper()
	read := func(set fixedSet) map[string]uint32 {
		els, err := k.ListElements(t.Context(), e.f, e.b.Table(), fixedSetNames[set])
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]uint32{}
		for _, el := range els {
			m[string(el.Key)] = binary.NativeEndian.Uint32(el.Data)
		}
		return m
	}
	cl, np := read(setAffinity), read(setNodePortAffinity)
	out := make([]int, n)
	for i := range n {
		ck, nk := affinityKeys(e.f, stickyClient(e.f, i))
		c, okc := cl[string(ck)]
		p, okp := np[string(nk)]
		switch {
		case okc != okp || (okc && p-kinds[kindNP].offset() != c):
			t.Fatalf("client %d: ClusterIP entry %d (%v), NodePort entry %#x (%v): not the same slot", i, c, okc, p, okp)
		case okc:
			out[i] = int(c)
		default:
			out[i] = -1
		}
	}
	return out
}

// endpointSlots returns how many @endpoints elements web's ClusterIP has.
func endpointSlots(t *testing.T, e *env, k nft.Kernel) int {
	t.Helper()
	els, err := k.ListElements(t.Context(), e.f, e.b.Table(), fixedSetNames[setEndpoints])
	if err != nil {
		t.Fatal(err)
	}
	front := vipKey(cip(e.f, 10, 80).Addr(), tcp, 80)
	n := 0
	for _, el := range els {
		if string(el.Key[:len(front)]) == front {
			n++
		}
	}
	return n
}

// testAffinityFollowsMoves is TestAffinityFollowsMoves on kernel k (the Fake,
// or the real kernel in the netns tests); e.b talks to k.
func testAffinityFollowsMoves(t *testing.T, e *env, k nft.Kernel) {
	web := stickyWeb(e)
	e.sync(true)
	putClients(t, e, k, 0, 1, 2, 3)

	// Pod 2 (slot 1) goes: pod 4 moves from slot 3 into it. Client 1 picks
	// again; client 3 follows pod 4; the others stay.
	dropPod2(e, web)
	if got, want := clientSlots(t, e, k, 4), []int{0, -1, 2, 1}; !slices.Equal(got, want) {
		t.Errorf("client slots after pod 2 went: %v, want %v", got, want)
	}
	if n := endpointSlots(t, e, k); n != 3 {
		t.Errorf("web's ClusterIP has %d endpoint elements, want 3 (the old slot 3 deleted)", n)
	}
	if res := e.sync(true); res.Repairs != 0 {
		t.Errorf("full sync after the move: %d repairs", res.Repairs)
	}

	// A rebuild moves what it carries: pod 1 (slot 0) goes and pod 3 moves
	// from slot 2 into it.
	e.b.opts.RebuildEvery = 1
	before := e.b.Table()
	e.put(e.state.Ports[web].ServicePort, ep(e.f, 3, 8080, false), ep(e.f, 4, 8080, false))
	e.sync(true)
	if e.b.Table() == before {
		t.Fatal("the full sync did not rebuild")
	}
	if got, want := clientSlots(t, e, k, 4), []int{-1, -1, 0, 1}; !slices.Equal(got, want) {
		t.Errorf("client slots after a rebuild without pod 1: %v, want %v", got, want)
	}
}

// TestAffinityFollowsMoves: when an endpoint leaves a ClientIP affinity
// Service's list and the last one moves into its slot, the moved endpoint's
// clients keep it and the removed one's clients pick again, as with
// kube-proxy's per-endpoint affinity sets; the moved endpoint's old slot stays
// reachable by its clients until their entries have moved.
func TestAffinityFollowsMoves(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			e := newEnv(t, f)
			testAffinityFollowsMoves(t, e, e.fake)
		})
		t.Run(f.Name+"/traffic", func(t *testing.T) {
			e, k, web := hookedSticky(t, f)
			trace := func(client int, dst netip.AddrPort) (netip.AddrPort, bool) {
				t.Helper()
				p := nft.Packet{Family: f, Src: ap(stickyClient(f, client), 40000), Dst: dst, Proto: tcp, Origin: nft.OriginInbound, InIface: podIface}
				res, err := e.fake.Trace(e.tnode(), p)
				if err != nil {
					t.Fatal(err)
				}
				return res.DNAT, strings.Contains(strings.Join(res.Trace, "\n"), "affinity hit\" => dnat")
			}
			// Between the sync's transaction and the one moving the entries,
			// client 3 still reaches pod 4 through its old slot.
			moving := 0
			k.before = func(tx *nft.Tx) error {
				if !deletesFrom(tx, fixedSetNames[setAffinity]) {
					return nil
				}
				moving++
				for _, dst := range []netip.AddrPort{cip(f, 10, 80), nodeAP(f, 30080)} {
					if got, hit := trace(3, dst); got != pod(f, 4, 8080) || !hit {
						t.Errorf("%v before the entries moved: client 3 reached %v (affinity hit %v), want pod 4", dst, got, hit)
					}
				}
				return nil
			}
			dropPod2(e, web)
			if moving != 1 {
				t.Fatalf("%d transactions moved affinity entries, want 1", moving)
			}
			for _, c := range []struct {
				client int
				want   netip.AddrPort
				hit    bool
			}{{0, pod(f, 1, 8080), true}, {1, pod(f, 1, 8080), false}, {2, pod(f, 3, 8080), true}, {3, pod(f, 4, 8080), true}} {
				for _, dst := range []netip.AddrPort{cip(f, 10, 80), nodeAP(f, 30080)} {
					if got, hit := trace(c.client, dst); got != c.want || hit != c.hit {
						t.Errorf("%v after pod 2 went: client %d reached %v (affinity hit %v), want %v (hit %v)", dst, c.client, got, hit, c.want, c.hit)
					}
				}
			}
		})
		t.Run(f.Name+"/move-fails", func(t *testing.T) {
			// Should the kernel refuse the moves, the old slots still go and
			// the table stays as the cache says; the moved endpoint's clients
			// pick again.
			e, k, web := hookedSticky(t, f)
			k.before = func(tx *nft.Tx) error {
				if deletesFrom(tx, fixedSetNames[setAffinity]) {
					return errors.New("refused")
				}
				return nil
			}
			dropPod2(e, web)
			if n := endpointSlots(t, e, k); n != 3 {
				t.Errorf("web's ClusterIP has %d endpoint elements, want 3", n)
			}
			if got, want := clientSlots(t, e, k, 4), []int{0, 1, 2, 3}; !slices.Equal(got, want) {
				t.Errorf("client slots: %v, want them untouched %v", got, want)
			}
			if e.b.dirty {
				t.Error("the backend will rebuild: the old slots were not deleted")
			}
			if res := e.sync(true); res.Repairs != 0 {
				t.Errorf("full sync: %d repairs", res.Repairs)
			}
		})
	}
}

// TestAffinityMoveBounded: a family whose affinity map held more than
// affinityMoveMax entries when last read does not read it at a sync: the moved
// endpoint's clients pick again, as before entries followed moves. A rebuild
// reads the map again.
func TestAffinityMoveBounded(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			e := newEnv(t, f)
			web := stickyWeb(e)
			e.sync(true)
			putClients(t, e, e.fake, 0, 1, 2, 3)
			e.b.affinitySeen[setAffinity] = affinityMoveMax + 1
			e.b.affinitySeen[setNodePortAffinity] = affinityMoveMax + 1
			dropPod2(e, web)
			if got, want := clientSlots(t, e, e.fake, 4), []int{0, 1, 2, 3}; !slices.Equal(got, want) {
				t.Errorf("client slots: %v, want them untouched %v", got, want)
			}
			if n := endpointSlots(t, e, e.fake); n != 3 {
				t.Errorf("web's ClusterIP has %d endpoint elements, want 3", n)
			}
			e.b.opts.RebuildEvery = 1
			e.sync(true)
			if n := e.b.affinitySeen[setAffinity]; n != 4 {
				t.Errorf("after a rebuild @affinity was seen with %d entries, want 4", n)
			}
		})
	}
}

// hookedSticky is an env whose backend talks to the Fake through a
// hookKernel, holding stickyWeb with clients 0-3 on slots 0-3.
func hookedSticky(t *testing.T, f *family.Family) (*env, *hookKernel, model.ServicePortName) {
	e := newEnv(t, f)
	k := &hookKernel{Kernel: e.fake}
	e.b = New(f, k, Options{})
	web := stickyWeb(e)
	e.sync(true)
	putClients(t, e, k, 0, 1, 2, 3)
	return e, k, web
}

// dropPod2 removes stickyWeb's pod 2 (slot 1), so pod 4 moves from slot 3
// into it, and syncs.
func dropPod2(e *env, web model.ServicePortName) {
	e.t.Helper()
	e.put(e.state.Ports[web].ServicePort, ep(e.f, 1, 8080, false), ep(e.f, 3, 8080, false), ep(e.f, 4, 8080, false))
	e.sync(false, web)
}

// hookKernel calls before ahead of each Apply; an error fails the Apply.
type hookKernel struct {
	nft.Kernel
	before func(*nft.Tx) error
}

func (k *hookKernel) Apply(ctx context.Context, tx *nft.Tx) error {
	if k.before != nil {
		if err := k.before(tx); err != nil {
			return err
		}
	}
	return k.Kernel.Apply(ctx, tx)
}

func deletesFrom(tx *nft.Tx, set string) bool {
	return slices.ContainsFunc(tx.Ops, func(op nft.Op) bool { return op.Kind == nft.OpDeleteElements && op.SetName == set })
}
