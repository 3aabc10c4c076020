package nftables

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nft"
)

// randomPort returns a service port called name with attributes drawn from small
// pools, so that ports often share a frontend (ClusterIP, ExternalIP, VIP or
// NodePort with the same protocol and port) and an endpoint, and its endpoints.
func randomPort(f *family.Family, r *rand.Rand, name string) (*model.ServicePort, []model.Endpoint) {
	var opts []svcOpt
	if r.IntN(3) == 0 {
		opts = append(opts, nodePort(uint16(30000+r.IntN(3))))
	}
	for range r.IntN(3) {
		opts = append(opts, externalIP(1+r.IntN(3)))
	}
	if r.IntN(4) == 0 {
		opts = append(opts, lbVIP(1+r.IntN(3)))
	}
	if r.IntN(3) == 0 {
		opts = append(opts, etpLocal())
	}
	if r.IntN(5) == 0 {
		opts = append(opts, itpLocal())
	}
	if r.IntN(6) == 0 {
		opts = append(opts, affinity(uint32(60*(1+r.IntN(2)))))
	}
	sp := svc(f, name, 1+r.IntN(4), uint16(80+r.IntN(2)), []uint8{tcp, udp}[r.IntN(2)], opts...)
	sp.Name.Protocol = protoNames[tcp] // the name stays when the protocol changes
	slices.SortFunc(sp.ExternalIPs, netip.Addr.Compare)
	sp.ExternalIPs = slices.Compact(sp.ExternalIPs)
	var eps []model.Endpoint
	for range r.IntN(7) {
		n := 1 + r.IntN(12)
		e := ep(f, n, uint16(8080+r.IntN(2)), n%3 == 0)
		if r.IntN(8) == 0 {
			e.Ready, e.Terminating = false, true
		}
		eps = append(eps, e)
	}
	return sp, eps
}

// setContents lists the elements of every set of e's family in the kernel, one
// line each ("set header: element"), in a canonical order. The index of an
// endpoint map's element is left out (a list's slots depend on its history),
// after checking that every list's indexes are dense.
func setContents(t *testing.T, e *env) string {
	t.Helper()
	var lines []string
	set := ""
	type list struct{ n, max uint64 }
	lists := map[string]*list{}
	for _, l := range strings.Split(e.fake.Dump(e.f), "\n") {
		switch {
		case strings.HasPrefix(l, "    ") && set != "":
			el := strings.TrimSpace(l)
			if strings.HasPrefix(set, "map endpoints ") || strings.HasPrefix(set, "map nodeport-endpoints ") {
				key, data, _ := strings.Cut(el, " : ")
				i := strings.LastIndex(key, " . ")
				idx, err := strconv.ParseUint(key[i+3:], 10, 32)
				if err != nil {
					t.Fatalf("element %q: index: %v", el, err)
				}
				front := key[:i]
				switch {
				case idx >= shortOffset:
					idx -= shortOffset
					front += " short"
				case idx >= localOffset:
					idx -= localOffset
					front += " local"
				case idx >= clusterOffset:
					idx -= clusterOffset
					front += " cluster"
				}
				lk := set + front
				if lists[lk] == nil {
					lists[lk] = &list{}
				}
				lists[lk].n++
				lists[lk].max = max(lists[lk].max, idx)
				el = front + " : " + data
			}
			lines = append(lines, set+": "+el)
		case strings.HasPrefix(l, "  ") && !strings.HasPrefix(l, "    "):
			set = ""
			if !strings.HasPrefix(l, "  chain ") {
				set = strings.TrimSpace(l)
			}
		}
	}
	for k, l := range lists {
		if l.max+1 != l.n {
			t.Errorf("list %s: %d elements, highest index %d", k, l.n, l.max)
		}
	}
	return strings.Join(groupsByName(t, lines), "\n")
}

// groupsByName rewrites set content lines so that two tables built along
// different paths compare equal: a dispatch map element names its group (via
// the verdict maps) rather than its id, which depends on the order groups were
// created in, and the verdict maps' own lines go (unused groups, such as spares,
// differ between paths). The lines come back sorted.
func groupsByName(t *testing.T, lines []string) []string {
	t.Helper()
	name := map[string]string{}
	isVmap := func(l string) bool { return strings.Contains(l, " : verdict;") }
	for _, l := range lines {
		if !isVmap(l) {
			continue
		}
		_, el, _ := strings.Cut(l, "}: ")
		id, target, ok := strings.Cut(el, " : goto ")
		if !ok {
			t.Fatalf("verdict map element %q: not a goto", l)
		}
		for _, use := range useChains {
			if g, ok := strings.CutPrefix(target, use+"-"); ok {
				name[id] = g
			}
		}
	}
	var out []string
	for _, l := range lines {
		switch {
		case isVmap(l):
			continue
		case strings.Contains(l, "-groups {"):
			i := strings.LastIndex(l, " : ")
			g, ok := name[l[i+3:]]
			if !ok {
				t.Fatalf("dispatch map element %q: no verdict map element for its group", l)
			}
			l = l[:i+3] + g
		}
		out = append(out, l)
	}
	slices.Sort(out)
	return out
}

// TestRandomChanges applies random changes to random service ports, often sharing
// frontends and endpoints, one incremental sync at a time, and checks after every
// sync that the kernel holds exactly what a cold start of the same state writes
// (same elements in every set), and that a periodic full sync finds nothing to
// repair. Ports get increasing names and keep them while they live, so owner ids
// order them the same way in both: a frontend claimed by two ports resolves to the
// same one.
func TestRandomChanges(t *testing.T) {
	for _, f := range family.All {
		for seed := range uint64(20) {
			t.Run(fmt.Sprintf("%s/seed=%d", f.Name, seed), func(t *testing.T) {
				r := rand.New(rand.NewPCG(seed, 1))
				inc := newEnv(t, f)
				inc.sync(true)
				next := 0
				var live []model.ServicePortName
				for step := range 40 {
					var changed []model.ServicePortName
					for range 1 + r.IntN(3) {
						switch op := r.IntN(4); {
						case op == 0 && len(live) > 0: // delete
							i := r.IntN(len(live))
							inc.del(live[i])
							changed = append(changed, live[i])
							live = slices.Delete(live, i, i+1)
						case op == 1 && len(live) > 0: // change
							name := live[r.IntN(len(live))]
							sp, eps := randomPort(f, r, name.Name)
							inc.put(sp, eps...)
							changed = append(changed, name)
						default: // create
							next++
							sp, eps := randomPort(f, r, fmt.Sprintf("p%04d", next))
							live = append(live, inc.put(sp, eps...))
							changed = append(changed, sp.Name)
						}
					}
					full := step%10 == 9
					res := inc.sync(full, changed...)
					if full && res.Repairs != 0 {
						t.Fatalf("step %d: full sync repaired %d elements", step, res.Repairs)
					}
					cold := newEnv(t, f)
					for _, n := range live {
						cold.put(inc.state.Ports[n].ServicePort, inc.eps[n]...)
					}
					cold.sync(true)
					if got, want := setContents(t, inc), setContents(t, cold); got != want {
						t.Fatalf("step %d: incremental syncs differ from a cold start:\n%s", step, lineDiff(got, want))
					}
				}
			})
		}
	}
}

// lineDiff lists the lines only in got (-) and only in want (+).
func lineDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	var out []string
	for _, l := range g {
		if !slices.Contains(w, l) {
			out = append(out, "- "+l)
		}
	}
	for _, l := range w {
		if !slices.Contains(g, l) {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

// txLog is a Kernel that records how many set and map elements each transaction
// adds.
type txLog struct {
	nft.Kernel
	adds []int
}

func (l *txLog) Apply(ctx context.Context, tx *nft.Tx) error {
	n := 0
	for _, op := range tx.Ops {
		// The group verdict maps' elements are chain layout, created with the chains.
		if op.Kind == nft.OpAddElements && (len(op.Elements) == 0 || op.Elements[0].Verdict == nil) {
			n += len(op.Elements)
		}
	}
	l.adds = append(l.adds, n)
	return l.Kernel.Apply(ctx, tx)
}

// TestColdStartChunks: a cold start split into transactions of at most n
// elements (endpoint lists expanded as each transaction is built, a list split
// across two when it does not fit) writes exactly what one transaction writes,
// every transaction but the last full.
func TestColdStartChunks(t *testing.T) {
	for _, f := range family.All {
		r := rand.New(rand.NewPCG(7, 7))
		one := newEnv(t, f)
		for i := range 40 {
			sp, eps := randomPort(f, r, fmt.Sprintf("p%04d", i))
			one.put(sp, eps...)
		}
		one.sync(true)
		want := one.fake.Dump(f)
		for _, n := range []int{1, 3, 7, 64} {
			t.Run(fmt.Sprintf("%s/%d", f.Name, n), func(t *testing.T) {
				e := newEnv(t, f)
				log := &txLog{Kernel: e.fake}
				e.b = New(f, log, Options{MaxElementsPerTx: n})
				e.state, e.eps = one.state, one.eps
				e.sync(true)
				if got := e.fake.Dump(f); got != want {
					t.Fatalf("ruleset differs from one transaction's:\n%s", lineDiff(got, want))
				}
				total := 0
				for i, a := range log.adds {
					total += a
					if a > n || (a < n && i < len(log.adds)-1) {
						t.Errorf("transaction %d of %d adds %d elements (limit %d)", i+1, len(log.adds), a, n)
					}
				}
				if elems := len(strings.Split(setContents(t, one), "\n")); len(log.adds) < 2 || total != elems {
					t.Errorf("%d transactions adding %d elements; the ruleset has %d", len(log.adds), total, elems)
				}
			})
		}
	}
}

// The sets kept as lists are never read back: verify compares a set's elements
// with the kernel's one for one, which a list is not.
func TestListSetsAreUnread(t *testing.T) {
	lists := 0
	for f := fixedSet(1); f < numFixedSets; f++ {
		if k := fixedKey(f); listSet(k) {
			lists++
			if !unreadSet(k) {
				t.Errorf("%s is kept as lists but verify reads it back", k)
			}
		}
	}
	if lists != 2 {
		t.Errorf("%d sets kept as lists, want the two endpoint maps", lists)
	}
}
