package nftables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// recorder is a Kernel that remembers the last transaction it passed on; without an
// inner kernel it accepts everything (for benchmarks of the pure-Go part).
type recorder struct {
	nft.Kernel
	last *nft.Tx
}

func (r *recorder) Apply(ctx context.Context, tx *nft.Tx) error {
	r.last = tx
	if r.Kernel == nil {
		return nil
	}
	return r.Kernel.Apply(ctx, tx)
}

func (r *recorder) ListTables(ctx context.Context, f *family.Family) ([]string, error) {
	if r.Kernel == nil {
		return nil, nil
	}
	return r.Kernel.ListTables(ctx, f)
}

func (r *recorder) ListRules(ctx context.Context, f *family.Family, table, chain string) ([]nft.Rule, error) {
	if r.Kernel == nil {
		return nil, nil
	}
	return r.Kernel.ListRules(ctx, f, table, chain)
}

// nonElementOps lists the operations of tx that are not element operations.
func nonElementOps(tx *nft.Tx) []string {
	var kinds []string
	for _, op := range tx.Ops {
		if op.Kind != nft.OpAddElements && op.Kind != nft.OpDeleteElements {
			kinds = append(kinds, op.Kind.String()+" "+op.SetName+op.Name)
		}
	}
	return kinds
}

// addrPlus returns base + i.
func addrPlus(base netip.Addr, i int) netip.Addr {
	b := base.AsSlice()
	for j := len(b) - 1; j >= 0 && i > 0; j-- {
		s := int(b[j]) + i
		b[j], i = byte(s), s>>8
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// bigEnv returns an env with n services of 10 remote endpoints each (service 1 has
// 11, so that @svc-11 exists), talking to a recorder over k.
func bigEnv(tb testing.TB, f *family.Family, n int, k nft.Kernel) (*env, *recorder) {
	e := newEnv(tb, f)
	rec := &recorder{Kernel: k}
	e.b = New(f, rec, Options{})
	for i := range n {
		sp := svc(f, fmt.Sprintf("s%d", i), 0, 80, tcp, nodePort(uint16(30000+i)))
		sp.ClusterIP = addrPlus(testaddr.Svc(f, 0), 256+i)
		count := 10
		if i == 1 {
			count = 11
		}
		eps := make([]model.Endpoint, count)
		for j := range eps {
			eps[j] = ep(f, 0, 8080, false)
			eps[j].Addr = addrPlus(testaddr.Pod(f, 0), 256+i*16+j)
		}
		e.put(sp, eps...)
	}
	return e, rec
}

func (e *env) name(i int) model.ServicePortName {
	return svc(e.f, fmt.Sprintf("s%d", i), 0, 80, tcp).Name
}

// TestOperationCounts checks that endpoint and service churn are a few element
// operations and never touch chains or rules.
func TestOperationCounts(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			fake := nft.NewFake()
			e, rec := bigEnv(t, f, 1000, fake)
			e.fake = fake
			e.sync(true)
			step := func(what string, max int, names ...model.ServicePortName) {
				t.Helper()
				res := e.sync(false, names...)
				t.Logf("%s: %d ops", what, res.Operations)
				if other := nonElementOps(rec.last); len(other) > 0 {
					t.Errorf("%s: non-element operations %v", what, other)
				}
				if res.Transactions != 1 || res.Operations > max || res.Operations == 0 {
					t.Errorf("%s: %d operations in %d transactions, want 1..%d in 1:\n%s", what, res.Operations, res.Transactions, max, rec.last)
				}
			}
			name := e.name(5)
			eps := e.eps[name]

			// Each of the service's frontends (ClusterIP and NodePort) has its own
			// endpoint elements, so endpoint churn costs per frontend.
			const frontends = 2
			// 10 -> 11 endpoints: per frontend one endpoint element and a key move
			// (@svc-10 -> @svc-11, @np-10 -> @np-11).
			extra := ep(f, 0, 8080, false)
			extra.Addr = addrPlus(testaddr.Pod(f, 0), 60000)
			e.put(e.state.Ports[name].ServicePort, append(eps, extra)...)
			step("add endpoint", frontends*3, name)

			// 11 -> 10, removing one in the middle: per frontend its slot gets the
			// last endpoint (delete + add), the last slot goes, and the key moves.
			e.put(e.state.Ports[name].ServicePort, append(eps[:3:3], append(eps[4:], extra)...)...)
			step("remove middle endpoint", frontends*5, name)
			e.check(to(fromPod(1), ap(e.state.Ports[name].ClusterIP, 80), tcp)(f), dnatTo(false, addrPorts(e.eps[name])...))

			// Delete and re-add a whole service: O(endpoints x frontends).
			sp := e.state.Ports[name].ServicePort
			e.del(name)
			step("delete service", frontends*(10+1)+1, name)
			e.put(sp, eps...)
			step("add service", frontends*(10+1)+1, name)
			e.check(to(fromClient, nodeAP(f, sp.NodePort), tcp)(f), dnatTo(true, addrPorts(eps)...))
		})
	}
}

func addrPorts(eps []model.Endpoint) []netip.AddrPort {
	out := make([]netip.AddrPort, len(eps))
	for i := range eps {
		out[i] = eps[i].AddrPort()
	}
	return out
}

// TestNewCountAddsRules checks that a new endpoint count adds its group chain
// once, and that a full sync collects the chain of a count no longer used.
func TestNewCountAddsRules(t *testing.T) {
	e := newEnv(t, family.IPv4)
	name := e.put(svc(e.f, "web", 10, 80, tcp), ep(e.f, 1, 8080, false))
	e.sync(true)
	e.put(e.state.Ports[name].ServicePort, ep(e.f, 1, 8080, false), ep(e.f, 2, 8080, false), ep(e.f, 3, 8080, false))
	e.sync(false, name)
	if !strings.Contains(e.fake.Dump(e.f), "chain clusterip-lb-svc-3\n") {
		t.Errorf("no chain for svc-3:\n%s", e.fake.Dump(e.f))
	}
	// The now unused svc-1 goes at the next full sync (svc-2 stays: a spare of 3).
	res := e.sync(true)
	if res.Repairs != 0 {
		t.Errorf("full sync found %d repairs on an untouched kernel", res.Repairs)
	}
	d := e.fake.Dump(e.f)
	if strings.Contains(d, "clusterip-lb-svc-1") {
		t.Errorf("svc-1 not garbage-collected:\n%s", d)
	}
	if !strings.Contains(d, "chain clusterip-lb-svc-2\n") {
		t.Errorf("spare svc-2 collected:\n%s", d)
	}
	e.check(to(fromPod(5), cip(e.f, 10, 80), tcp)(e.f), dnatTo(false, pod(e.f, 1, 8080), pod(e.f, 2, 8080), pod(e.f, 3, 8080)))
}

// TestNewCountAppends: a new endpoint count creates its group chains and
// verdict map elements and rewrites no chain, with spares only while the
// endpoint map is small; a count next to a used one is already there (a spare)
// and costs only element operations.
func TestNewCountAppends(t *testing.T) {
	for _, big := range []bool{false, true} {
		n := 10
		if big {
			n = spareMaxElements/10 + 10
		}
		fake := nft.NewFake()
		e, rec := bigEnv(t, family.IPv4, n, fake)
		e.fake = fake
		e.sync(true)
		name := e.name(5)
		sp := e.state.Ports[name].ServicePort
		eps := e.eps[name]

		e.put(sp, eps[:9]...) // 10 -> 9: a spare
		e.sync(false, name)
		if other := nonElementOps(rec.last); len(other) > 0 {
			t.Errorf("big=%v: to a spare count: non-element operations %v", big, other)
		}
		e.put(sp, eps[:5]...) // 9 -> 5: new
		e.sync(false, name)
		var created []string
		for _, op := range rec.last.Ops {
			switch {
			case op.Kind == nft.OpAppendRules || op.Kind == nft.OpSetChain && !strings.Contains(op.Chain.Name, "-lb-"):
				t.Errorf("big=%v: chain %s rewritten:\n%s", big, op.Chain.Name, rec.last)
			case op.Kind == nft.OpSetChain:
				created = append(created, op.Chain.Name)
			case op.Kind == nft.OpAddSet:
				t.Errorf("big=%v: set %s created", big, op.Set.Name)
			}
		}
		want := []string{"clusterip-lb-svc-5", "nodeport-lb-np-5", "clusterip-lb-svc-4", "clusterip-lb-svc-6", "nodeport-lb-np-4", "nodeport-lb-np-6"}
		if big {
			want = want[:2]
		}
		if !slices.Equal(created, want) {
			t.Errorf("big=%v: new chains %v, want %v", big, created, want)
		}
		e.check(to(fromPod(1), ap(sp.ClusterIP, 80), tcp)(e.f), dnatTo(false, addrPorts(eps[:5])...))
		if res := e.sync(true); res.Repairs != 0 {
			t.Errorf("big=%v: full sync found %d repairs", big, res.Repairs)
		}
	}
}

// TestFailureRecovery: after a failed transaction the next sync rebuilds.
func TestFailureRecovery(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			e := newEnv(t, f)
			name := e.put(svc(f, "web", 10, 80, tcp), ep(f, 1, 8080, false))
			e.sync(true)
			e.put(e.state.Ports[name].ServicePort, ep(f, 2, 8080, false))
			e.fake.FailNext(syscall.ENOBUFS)
			res, err := e.b.Sync(t.Context(), &proxier.SyncRequest{State: e.state, Changed: []model.ServicePortName{name}, Node: e.node})
			if !errors.Is(err, syscall.ENOBUFS) || !strings.Contains(err.Error(), f.Name) {
				t.Fatalf("sync error %v, want ENOBUFS naming %s", err, f)
			}
			if !res.NFTablesFailed {
				t.Error("failed sync not reported as an nftables failure")
			}
			e.check(to(fromPod(5), cip(f, 10, 80), tcp)(f), dnatTo(false, pod(f, 1, 8080))) // old rules still work
			if res := e.sync(true); res.NFTablesFailed {
				t.Error("successful rebuild reported as an nftables failure")
			}
			e.check(to(fromPod(5), cip(f, 10, 80), tcp)(f), dnatTo(false, pod(f, 2, 8080)))
			if tables, _ := e.fake.ListTables(t.Context(), f); len(tables) != 1 {
				t.Errorf("tables after rebuild: %v", tables)
			}
		})
	}
}

// TestDriftRepair deletes state behind the backend's back; a full sync repairs it.
func TestDriftRepair(t *testing.T) {
	cases := []struct {
		name   string
		break_ func(e *env, table string) *nft.Tx
	}{
		{"element", func(e *env, table string) *nft.Tx {
			tx := nft.NewTx(e.f)
			tx.DeleteElements(table, "svc-groups", []nft.Element{{Key: []byte(vipKey(testaddr.Svc(e.f, 10), tcp, 80))}})
			return tx
		}},
		{"extra element", func(e *env, table string) *nft.Tx {
			tx := nft.NewTx(e.f)
			tx.AddElements(table, "no-endpoint-services", []nft.Element{{Key: []byte(vipKey(testaddr.Svc(e.f, 10), tcp, 80))}})
			return tx
		}},
		{"flushed verdict map", func(e *env, table string) *nft.Tx {
			tx := nft.NewTx(e.f)
			tx.FlushSet(table, groupVmap(chainClusterIPLB))
			return tx
		}},
		{"flushed chain", func(e *env, table string) *nft.Tx {
			tx := nft.NewTx(e.f)
			tx.SetChain(table, &nft.Chain{Name: chainClusterIPLB})
			return tx
		}},
		{"table", func(e *env, table string) *nft.Tx {
			tx := nft.NewTx(e.f)
			tx.DeleteTable(table)
			return tx
		}},
	}
	for _, f := range family.All {
		for _, tc := range cases {
			t.Run(f.Name+"/"+tc.name, func(t *testing.T) {
				e := newEnv(t, f)
				e.put(svc(f, "web", 10, 80, tcp), ep(f, 1, 8080, false))
				e.sync(true)
				if err := e.fake.Apply(t.Context(), tc.break_(e, e.b.Table())); err != nil {
					t.Fatal(err)
				}
				if res := e.sync(true); res.Repairs == 0 {
					t.Errorf("full sync found no repairs")
				}
				e.check(to(fromPod(5), cip(f, 10, 80), tcp)(f), dnatTo(false, pod(f, 1, 8080)))
				if res := e.sync(true); res.Repairs != 0 || res.Operations != 0 {
					t.Errorf("second full sync: %+v, want nothing to do", res)
				}
			})
		}
	}
}

// TestCleanup removes every table of both families.
func TestCleanup(t *testing.T) {
	e := newEnv(t, family.IPv4)
	e.put(svc(e.f, "web", 10, 80, tcp), ep(e.f, 1, 8080, false))
	e.sync(true)
	e.sync(true) // may swap table names on a rebuild; leftovers must go too
	other := New(family.IPv6, e.fake, Options{})
	if _, err := other.Sync(t.Context(), &proxier.SyncRequest{State: model.NewState(), Node: defaultNode(family.IPv6)}); err != nil {
		t.Fatal(err)
	}
	if err := e.b.Cleanup(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, f := range family.All {
		if d := e.fake.Dump(f); d != "" {
			t.Errorf("%s after cleanup:\n%s", f, d)
		}
	}
}

// TestRestartSwapsWithoutGap: a new backend over a live table builds the new one
// beside it and swaps in one transaction that also deletes the old one.
func TestRestartSwapsWithoutGap(t *testing.T) {
	e := newEnv(t, family.IPv6)
	e.put(svc(e.f, "web", 10, 80, tcp), ep(e.f, 1, 8080, false))
	e.sync(true)
	rec := &recorder{Kernel: e.fake}
	e.b = New(e.f, rec, Options{MaxElementsPerTx: 2})
	res := e.sync(true)
	if res.Transactions < 2 {
		t.Errorf("cold start in %d transactions, want several of <= 2 elements", res.Transactions)
	}
	last := rec.last.String()
	if !strings.Contains(last, "delete table ip6 dsproxy\n") || !strings.Contains(last, "type nat hook prerouting") {
		t.Errorf("swap transaction:\n%s", last)
	}
	if e.b.Table() != tableB {
		t.Errorf("live table %q, want %q", e.b.Table(), tableB)
	}
	e.check(to(fromPod(5), cip(e.f, 10, 80), tcp)(e.f), dnatTo(false, pod(e.f, 1, 8080)))
}

// TestAffinitySticks: a client keeps its endpoint while other endpoints come and
// go, and when its own endpoint goes it sticks to one of the others.
func TestAffinitySticks(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			e := newEnv(t, f)
			name := e.put(svc(f, "web", 10, 80, tcp, affinity(10800)), ep(f, 1, 8080, false), ep(f, 2, 8080, false), ep(f, 3, 8080, false))
			e.sync(true)
			p := to(fromPod(5), cip(f, 10, 80), tcp)(f)
			first, err := e.fake.Trace(e.tnode(), p)
			if err != nil {
				t.Fatal(err)
			}
			e.check(p, dnatTo(false, first.DNAT))
			without := func(eps []model.Endpoint, a netip.AddrPort) []model.Endpoint {
				var out []model.Endpoint
				for _, x := range eps {
					if x.AddrPort() != a {
						out = append(out, x)
					}
				}
				return out
			}
			// Another endpoint goes (the last one moves into its slot): no change.
			var other netip.AddrPort
			for _, x := range e.eps[name] {
				if x.AddrPort() != first.DNAT {
					other = x.AddrPort()
					break
				}
			}
			e.put(e.state.Ports[name].ServicePort, without(e.eps[name], other)...)
			e.sync(false, name)
			e.check(p, dnatTo(false, first.DNAT))
			// Its own endpoint goes: it sticks to one of the rest.
			rest := without(e.eps[name], first.DNAT)
			e.put(e.state.Ports[name].ServicePort, rest...)
			e.sync(false, name)
			now, err := e.fake.Trace(e.tnode(), p)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(addrPorts(rest), now.DNAT) {
				t.Fatalf("DNAT to %v after its endpoint went, want one of %v", now.DNAT, addrPorts(rest))
			}
			e.check(p, dnatTo(false, now.DNAT))
		})
	}
}

// TestAffinityKeepsMark: the affinity hit rule passes the endpoint index through
// the packet mark; the packet must leave with its own mark (plus the masquerade
// bit, which masquerading clears again).
func TestAffinityKeepsMark(t *testing.T) {
	const mark = 0x10001
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			e := twoRemoteSticky(t, f)
			for _, tc := range []struct {
				name string
				p    nft.Packet
				masq bool
			}{
				{"clusterIP from a pod", to(fromPod(5), cip(f, 10, 80), tcp)(f), false},
				{"nodePort from outside", to(fromClient, nodeAP(f, 30080), tcp)(f), true},
				{"externalIP from outside", to(fromClient, ext(f, 1, 80), tcp)(f), true},
			} {
				tc.p.Mark = mark
				for _, what := range []string{"pick", "hit"} {
					res, err := e.fake.Trace(e.tnode(), tc.p)
					if err != nil {
						t.Fatal(err)
					}
					if !res.DNAT.IsValid() || res.Masquerade != tc.masq || res.Mark != mark {
						t.Errorf("%s, %s: dnat %v masquerade %v mark %#x, want DNAT, masquerade %v, mark %#x\n%s",
							tc.name, what, res.DNAT, res.Masquerade, res.Mark, tc.masq, mark, strings.Join(res.Trace, "\n"))
					}
					if tr := strings.Join(res.Trace, "\n"); !strings.Contains(tr, "affinity "+what+"\" => dnat") {
						t.Errorf("%s, %s: the affinity %s rule did not DNAT:\n%s", tc.name, what, what, tr)
					}
				}
			}
		})
	}
}

// TestTableNamesAreDistinct guards the swap logic.
func TestTableNamesAreDistinct(t *testing.T) {
	if otherTable(tableA) != tableB || otherTable(tableB) != tableA || otherTable("") != tableA {
		t.Error("otherTable")
	}
}

func TestAssignSlots(t *testing.T) {
	f := family.IPv4
	eps := func(ns ...int) []model.Endpoint {
		var out []model.Endpoint
		for _, n := range ns {
			out = append(out, ep(f, n, 80, false))
		}
		return out
	}
	s := assignSlots(nil, eps(1, 2, 3, 4))
	s2 := assignSlots(s, eps(1, 3, 4)) // 2 removed: 4 moves into slot 1
	if fmt.Sprint(s2) != fmt.Sprint([]netip.AddrPort{pod(f, 1, 80), pod(f, 4, 80), pod(f, 3, 80)}) {
		t.Errorf("remove: %v", s2)
	}
	s3 := assignSlots(s2, eps(1, 3, 4, 5, 6))
	if fmt.Sprint(s3[:3]) != fmt.Sprint(s2) || len(s3) != 5 {
		t.Errorf("add: %v", s3)
	}
	if s4 := assignSlots(s3, eps(6)); fmt.Sprint(s4) != fmt.Sprint([]netip.AddrPort{pod(f, 6, 80)}) {
		t.Errorf("shrink: %v", s4)
	}
}

// TestSlotsKeptOnlyOutOfOrder: a port keeps its slots only while they differ from
// its endpoints' order; either way the elements it wrote are recomputed exactly
// (a full sync afterwards finds nothing to repair or do).
func TestSlotsKeptOnlyOutOfOrder(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			e := newEnv(t, f)
			e.b.opts.RebuildEvery = -1 // no scheduled rebuild among the full syncs
			eps := func(ns ...int) []model.Endpoint {
				var out []model.Endpoint
				for _, n := range ns {
					out = append(out, ep(f, n, 8080, false))
				}
				return out
			}
			sp := svc(f, "web", 10, 80, tcp)
			name := e.put(sp, eps(1, 2, 3, 4)...)
			e.sync(true)
			steps := []struct {
				eps  []int
				kept bool  // explicit slots stored
				want []int // slot order
			}{
				{[]int{1, 2, 3, 4}, false, []int{1, 2, 3, 4}},
				{[]int{1, 3, 4}, true, []int{1, 4, 3}},           // 4 moves into 2's slot
				{[]int{1, 3, 4, 5}, true, []int{1, 4, 3, 5}},     // 5 appended
				{[]int{1, 4, 3, 5}, false, []int{1, 4, 3, 5}},    // the order now matches
				{[]int{1, 4, 3, 5, 5}, false, []int{1, 4, 3, 5}}, // a duplicate takes no slot
				{[]int{9}, false, []int{9}},
			}
			for i, st := range steps {
				if i > 0 {
					e.put(sp, eps(st.eps...)...)
					e.sync(false, name)
				}
				rec := e.b.c.ports[name]
				if got := rec.slots[listCluster] != nil; got != st.kept {
					t.Errorf("step %d %v: slots kept %v, want %v", i, st.eps, got, st.kept)
				}
				var want []netip.AddrPort
				for _, n := range st.want {
					want = append(want, pod(f, n, 8080))
				}
				if got := rec.slotList(listCluster); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("step %d %v: slots %v, want %v", i, st.eps, got, want)
				}
				e.check(to(fromPod(20), cip(f, 10, 80), tcp)(f), dnatTo(false, want...))
				// A full sync may drop unused dispatch groups, but repairs nothing; a
				// second one has nothing to do.
				if res := e.sync(true); res.Repairs != 0 {
					t.Errorf("step %d %v: full sync afterwards repaired %+v", i, st.eps, res)
				}
				if res := e.sync(true); res.Operations != 0 {
					t.Errorf("step %d %v: second full sync %+v, want nothing to do", i, st.eps, res)
				}
			}
			e.del(name)
			e.sync(false, name)
			if res := e.sync(true); res.Repairs != 0 {
				t.Errorf("full sync after the delete repaired %+v", res)
			}
		})
	}
}

// TestAffinityMapFull: once @affinity is full, a new client still gets an
// endpoint (without stickiness), where the add breaking the pick rule left its
// packet without DNAT (a ClusterIP connection was then refused).
func TestAffinityMapFull(t *testing.T) {
	defer func(n uint32) { affinitySize = n }(affinitySize)
	affinitySize = 2
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			e := twoRemoteSticky(t, f)
			for _, tc := range []struct {
				name string
				to   func(src int) nft.Packet
			}{
				{"clusterIP", func(src int) nft.Packet { return to(fromPod(src), cip(f, 10, 80), tcp)(f) }},
				{"nodePort", func(src int) nft.Packet { return to(fromPod(src), nodeAP(f, 30080), tcp)(f) }},
			} {
				for src := 5; src < 9; src++ {
					res, err := e.fake.Trace(e.tnode(), tc.to(src))
					if err != nil {
						t.Fatal(err)
					}
					if !res.DNAT.IsValid() {
						t.Fatalf("%s, client %d of 4 (map of 2): no DNAT\n%s", tc.name, src-4, strings.Join(res.Trace, "\n"))
					}
					if tr := strings.Join(res.Trace, "\n"); src >= 7 && !strings.Contains(tr, "affinity full\" => dnat") {
						t.Errorf("%s, client %d: not DNATed by the full-map rule:\n%s", tc.name, src-4, tr)
					}
				}
			}
		})
	}
}

// TestAffinitySurvivesRebuild: a rebuild (the daemon's hourly full sync, and the
// first sync after a restart) carries the ClientIP affinity entries into the new
// table, with the endpoints' slots, so a client keeps its endpoint, as with
// kube-proxy's affinity sets. The lists' slots after a restart are those of a
// fresh build: a client whose list had been reordered may move.
func TestAffinitySurvivesRebuild(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			e := newEnv(t, f)
			e.b.opts.RebuildEvery = 1
			web := e.put(svc(f, "web", 10, 80, tcp, affinity(10800), nodePort(30080)), ep(f, 1, 8080, false), ep(f, 2, 8080, false), ep(f, 3, 8080, false))
			e.put(svc(f, "api", 11, 80, tcp, affinity(10800)), ep(f, 1, 8081, false), ep(f, 2, 8081, false))
			e.sync(true)
			client := func(name string, dst netip.AddrPort) nft.Packet { return to(fromPod(5), dst, tcp)(f) }
			trace := func(what string, p nft.Packet) (netip.AddrPort, bool) {
				t.Helper()
				res, err := e.fake.Trace(e.tnode(), p)
				if err != nil {
					t.Fatal(err)
				}
				return res.DNAT, strings.Contains(strings.Join(res.Trace, "\n"), "affinity hit\" => dnat")
			}
			webP, npP, apiP := client("web", cip(f, 10, 80)), client("np", nodeAP(f, 30080)), client("api", cip(f, 11, 80))
			for _, p := range []nft.Packet{webP, npP, apiP} {
				trace("pick", p)
			}
			// web's first endpoint, the client's, goes: the client picks again,
			// as from kube-proxy's affinity sets (the Fake's numgen picks slot 0,
			// where the last endpoint, pod 3, moved), and then sticks.
			e.put(e.state.Ports[web].ServicePort, ep(f, 2, 8080, false), ep(f, 3, 8080, false))
			e.sync(false, web)
			for _, p := range []nft.Packet{webP, npP} {
				if got, hit := trace("repick", p); got != pod(f, 3, 8080) || hit {
					t.Fatalf("%v after its endpoint went: %v (hit %v), want a new pick of pod 3", p.Dst, got, hit)
				}
				if got, hit := trace("before", p); got != pod(f, 3, 8080) || !hit {
					t.Fatalf("%v after the change: %v (hit %v), want pod 3 by affinity", p.Dst, got, hit)
				}
			}
			before := e.b.Table()
			e.sync(true) // a rebuild
			if e.b.Table() == before {
				t.Fatal("the full sync did not rebuild")
			}
			for _, c := range []struct {
				p    nft.Packet
				want netip.AddrPort
			}{{webP, pod(f, 3, 8080)}, {npP, pod(f, 3, 8080)}, {apiP, pod(f, 1, 8081)}} {
				if got, hit := trace("after", c.p); got != c.want || !hit {
					t.Errorf("%v after a rebuild: %v (affinity hit %v), want %v by affinity", c.p.Dst, got, hit, c.want)
				}
			}
			// A restart: a new backend rebuilds from the live table.
			e.b = New(f, e.fake, Options{})
			e.sync(true)
			if got, hit := trace("restart", apiP); got != pod(f, 1, 8081) || !hit {
				t.Errorf("api after a restart: %v (affinity hit %v), want pod 1 by affinity", got, hit)
			}
			if _, hit := trace("restart", webP); !hit {
				t.Errorf("web after a restart: the client's entry was not carried")
			}
		})
	}
}

// twoRemoteSticky is an env holding twoRemote's Service with ClientIP affinity
// (60 s), synced.
func twoRemoteSticky(t *testing.T, f *family.Family) *env {
	e := newEnv(t, f)
	twoRemote(affinity(60))(e)
	e.sync(true)
	return e
}
