package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

func ipvsSizes(b *Backend) string {
	n := 0
	for _, m := range b.draining {
		n += len(m)
	}
	return fmt.Sprintf("written=%d vsOwners=%d members=%d addrs=%d have=%d draining=%d/%d",
		len(b.written), len(b.vsOwners), len(b.members), len(b.addrs), len(b.have), len(b.draining), n)
}

// Churn with live connections: ports are scaled down (their removed endpoints
// drain), emptied, deleted; connections then end. Everything returns to
// baseline once the periodic check (Flushed) has run.
func TestLeakChurnIPVS(t *testing.T) {
	for _, f := range family.All {
		k := newFake()
		b := newBackend(f, k)
		st := model.NewState()
		n := node(f)
		sync(t, b, &proxier.SyncRequest{Full: true, State: st, Node: n, NodeChanged: true})
		base := ipvsSizes(b)
		baseKernel := fmt.Sprint(k.dump())
		// What the backend believes stays what the kernel holds: the periodic
		// check must not see drift after any partial sync (it would make every
		// check a full sync).
		sync := func(t *testing.T, b *Backend, req *proxier.SyncRequest) {
			t.Helper()
			sync(t, b, req)
			if b.drifted() {
				t.Fatalf("%s: drift seen after a sync of %d ports (full %v)", f, len(req.Changed), req.Full)
			}
		}
		for round := 0; round < 3; round++ {
			var names []model.ServicePortName
			for i := 0; i < 20; i++ {
				ps := port(f, fmt.Sprintf("s%d-%d", round, i), 10+i, 1+i%7, 2+i%7, 3+i%7)
				st.Ports[ps.Name] = ps
				names = append(names, ps.Name)
				for _, e := range ps.Cluster {
					k.conns[netip.AddrPortFrom(e.Addr, e.Port)] = 2
				}
			}
			sync(t, b, &proxier.SyncRequest{State: st, Node: n, Changed: names})
			for i, nm := range names { // scale down: drains
				st.Ports[nm] = port(f, nm.Name, 10+i, 1+i%7)
			}
			sync(t, b, &proxier.SyncRequest{State: st, Node: n, Changed: names})
			for i, nm := range names { // no endpoints: the VS is kept, draining
				st.Ports[nm] = port(f, nm.Name, 10+i)
			}
			sync(t, b, &proxier.SyncRequest{State: st, Node: n, Changed: names})
			if round == 1 {
				sync(t, b, &proxier.SyncRequest{Full: true, State: st, Node: n})
			}
			for _, nm := range names {
				delete(st.Ports, nm)
			}
			sync(t, b, &proxier.SyncRequest{State: st, Node: n, Changed: names})
			clear(k.conns)
			b.Flushed(context.Background())
			if got := ipvsSizes(b); got != base {
				t.Errorf("%s round %d: %s, baseline %s", f, round, got, base)
			}
			if got := fmt.Sprint(k.dump()); got != baseKernel {
				t.Errorf("%s round %d: kernel %s, baseline %s", f, round, got, baseKernel)
			}
		}
	}
}

// TestLeakIPVSDrainingOfVanishedVirtualServer: a virtual server kept for its
// draining real servers (its port has no endpoints) that disappears from the
// kernel by other means (ipvsadm -C, kube-proxy --cleanup...) is forgotten by
// the next full sync; it stayed, and every periodic check failed to read it.
func TestLeakIPVSDrainingOfVanishedVirtualServer(t *testing.T) {
	f := family.IPv4
	k := newFake()
	b := newBackend(f, k)
	n := node(f)
	ps := port(f, "web", 10, 1, 2)
	st := state(ps)
	for _, e := range ps.Cluster {
		k.conns[netip.AddrPortFrom(e.Addr, e.Port)] = 1
	}
	sync(t, b, &proxier.SyncRequest{Full: true, State: st, Node: n, NodeChanged: true})
	st.Ports[ps.Name] = port(f, "web", 10) // no endpoints: drain, keep the VS
	sync(t, b, &proxier.SyncRequest{State: st, Node: n, Changed: []model.ServicePortName{ps.Name}})
	if len(b.draining) == 0 {
		t.Fatal("nothing draining")
	}
	for key := range b.draining { // someone else removes it
		delete(k.svcs, key)
		delete(k.dests, key)
	}
	for range 3 {
		b.Flushed(context.Background())
		sync(t, b, &proxier.SyncRequest{Full: true, State: st, Node: n})
	}
	b.Flushed(context.Background())
	if len(b.draining) != 0 {
		t.Errorf("draining still holds %d virtual servers the kernel no longer has (%s); reads=%d", len(b.draining), ipvsSizes(b), k.reads)
	}
}
