package nftables

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/dsproxy/dsproxy/internal/testaddr"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// An element keeps its owners ordered by id whatever the order they come and go
// in; the lowest is the effective one, and removing the last one reports it.
func TestElementOwners(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		n := 1 + r.IntN(6)
		ids := r.Perm(n)
		owners := make([]owner, n)
		for i, id := range ids {
			owners[i] = owner{id: uint32(id + 1), data: string(rune('a' + id))}
		}
		e := element{first: owners[0]}
		for _, o := range owners[1:] {
			e.insert(o)
		}
		check := func(want []owner) {
			t.Helper()
			sorted := slices.SortedFunc(slices.Values(want), func(a, b owner) int { return cmpU32(a.id, b.id) })
			got := append([]owner{e.first}, e.others()...)
			if !slices.Equal(got, sorted) {
				t.Fatalf("round %d: owners %v, want %v", round, got, sorted)
			}
			if e.effective() != sorted[0].data {
				t.Fatalf("round %d: effective %q, want %q", round, e.effective(), sorted[0].data)
			}
			if len(want) == 1 && e.more != nil {
				t.Fatalf("round %d: one owner left but more is %v", round, *e.more)
			}
		}
		check(owners)
		left := slices.Clone(owners)
		for _, i := range r.Perm(n) {
			o := owners[i]
			stillOwned := e.remove(o)
			left = slices.DeleteFunc(left, func(x owner) bool { return x == o })
			if stillOwned != (len(left) > 0) {
				t.Fatalf("round %d: remove(%v) = %v with %d owners left", round, o, stillOwned, len(left))
			}
			if len(left) > 0 {
				check(left)
			}
		}
	}
}

// A port's elements are not stored but computed again when it changes, from the
// state and node config it was programmed with. A loadBalancerSourceRange that
// holds the node IP adds the VIPs as allowed sources; when the node IP then moves
// out of the range without the port changing, deleting the port must still remove
// the elements the old node IP made, leaving what the port deleted under the new node IP leaves.
func TestPortRemovalAfterNodeChange(t *testing.T) {
	for _, f := range family.All {
		t.Run(f.Name, func(t *testing.T) {
			e := newEnv(t, f)
			sp := svc(f, "lb", 1, 80, tcp, lbVIP(1), lbVIP(2))
			sp.SourceRanges = []netip.Prefix{netip.PrefixFrom(testaddr.Node(f, 1), f.BitLen)}
			name := e.put(sp, ep(f, 1, 8080, false))
			e.sync(false, name)
			other := newEnv(t, f)
			other.node.NodeIP = testaddr.Node(f, 2)
			other.put(sp, ep(f, 1, 8080, false))
			other.sync(false, name)
			if e.fake.Dump(f) == other.fake.Dump(f) {
				t.Fatal("the node IP in the source range adds no elements: the test checks nothing")
			}
			e.node.NodeIP = testaddr.Node(f, 2)
			if _, err := e.b.Sync(t.Context(), &proxier.SyncRequest{State: e.state, Node: e.node, NodeChanged: true}); err != nil {
				t.Fatal(err)
			}
			e.del(name)
			e.sync(false, name)

			// The same port deleted under the new node IP all along: the same
			// sets and chains, and none of the old node IP's elements.
			other.del(name)
			other.sync(false, name)
			if got, want := e.fake.Dump(f), other.fake.Dump(f); got != want {
				t.Errorf("after deleting the port:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// TestExternalElementsBounded: a service port whose external addresses would
// each copy a long endpoint list (or VIPs × source ranges) past
// maxExternalElements serves the first of them that fit, in address order, the
// same on every node, and refuses the others; its ClusterIP is served.
func TestExternalElementsBounded(t *testing.T) {
	for _, f := range family.All {
		addrs := func(n int) []netip.Addr {
			var out []netip.Addr
			for i := range n {
				out = append(out, testaddr.Plus(testaddr.Ext(f, 0), i))
			}
			return out
		}
		client := func(dst netip.AddrPort) nft.Packet {
			return nft.Packet{Family: f, Src: ap(testaddr.Client(f, 1), 40000), Dst: dst, Proto: tcp, Origin: nft.OriginInbound, InIface: "eth0"}
		}
		t.Run(f.Name+"/endpoints", func(t *testing.T) {
			e := newEnv(t, f)
			const nExt, nEps = 2500, 50
			exts := addrs(nExt)
			sp := svc(f, "many", 10, 80, tcp)
			sp.ExternalIPs = exts
			var eps []model.Endpoint
			var all []netip.AddrPort
			for i := range nEps {
				// Half of them on this node: the bound counts them all.
				eps = append(eps, ep(f, i+1, 8080, i%2 == 0))
				all = append(all, pod(f, i+1, 8080))
			}
			e.put(sp, eps...)
			e.sync(true)
			els, err := e.fake.ListElements(t.Context(), f, e.b.Table(), fixedSetNames[setEndpoints])
			if err != nil {
				t.Fatal(err)
			}
			served := maxExternalElements / (nEps + 2) // its list, its dispatch element and its @external-frontends element
			if want := (served + 1) * nEps; len(els) != want {
				t.Errorf("@endpoints holds %d elements, want %d (%d external addresses and the ClusterIP, %d endpoints each)", len(els), want, served, nEps)
			}
			e.check(client(cip(f, 10, 80)), dnatTo(true, all...)) // from outside the cluster: masqueraded
			e.check(client(ap(exts[0], 80)), dnatTo(true, all...))
			e.check(client(ap(exts[served-1], 80)), dnatTo(true, all...))
			e.check(client(ap(exts[served], 80)), rejected(true))
			e.check(client(ap(exts[nExt-1], 80)), rejected(true))

			// ETP Local: each address holds the local and the cluster list; the
			// bound counts every endpoint twice, however many are local.
			local := *sp
			local.ExternalPolicyLocal = true
			e.put(&local, eps...)
			e.sync(false, sp.Name)
			var locals []netip.AddrPort
			for i := 0; i < nEps; i += 2 {
				locals = append(locals, pod(f, i+1, 8080))
			}
			served = maxExternalElements / (2*(nEps+1) + 1)
			e.check(client(ap(exts[served-1], 80)), dnatTo(false, locals...))
			e.check(client(ap(exts[served], 80)), rejected(true))
		})
		t.Run(f.Name+"/source-ranges", func(t *testing.T) {
			// VIPs × (source ranges + VIPs, as sources when a range holds
			// the node IP): 400 VIPs wrote 160k allow elements.
			e := newEnv(t, f)
			vips := addrs(400)
			sp := svc(f, "fw", 10, 80, tcp, sourceRange(1, 24))
			sp.LoadBalancerVIPs = vips
			sp.SourceRanges = append(sp.SourceRanges, netip.PrefixFrom(testaddr.Node(f, 1), f.BitLen-8).Masked())
			e.put(sp, ep(f, 1, 8080, false))
			e.sync(true)
			per := 3 + 1 + len(sp.SourceRanges) + len(vips)
			served := maxExternalElements / per
			n := 0
			for _, set := range []string{"fw-allow-32", "fw-allow-24", "fw-allow-128", "fw-allow-120", "fw-allow-112"} {
				els, err := e.fake.ListElements(t.Context(), f, e.b.Table(), set)
				if err == nil {
					n += len(els)
				}
			}
			if n == 0 || n > served*(len(sp.SourceRanges)+len(vips)) {
				t.Errorf("%d source range elements for %d served VIPs, want at most %d", n, served, served*(len(sp.SourceRanges)+len(vips)))
			}
			e.check(client(ap(vips[0], 80)), dnatTo(true, pod(f, 1, 8080)))
			e.check(client(ap(vips[served], 80)), rejected(true))
		})
	}
}

// contribsHint sizes a port's contribution list: it must be exact for the
// common shapes with endpoints (a short hint costs the port a reallocation
// at every sync and rebuild), so a new element kind must be counted there too.
func TestContribsHintExact(t *testing.T) {
	for _, f := range family.All {
		unnamed := ep(f, 3, 8080, false)
		unnamed.NoNodeName = true
		cases := []struct {
			name string
			sp   *model.ServicePort
			eps  []model.Endpoint
		}{
			{"clusterIP", svc(f, "a", 1, 80, tcp), []model.Endpoint{ep(f, 1, 8080, false), ep(f, 2, 8080, false)}},
			{"clusterIP, local endpoint", svc(f, "b", 2, 80, tcp), []model.Endpoint{ep(f, 1, 8080, true), ep(f, 2, 8080, false)}},
			{"clusterIP, unnamed endpoint", svc(f, "c", 3, 80, tcp), []model.Endpoint{ep(f, 1, 8080, false), unnamed}},
			{"nodePort", svc(f, "d", 4, 80, tcp, nodePort(30080)), []model.Endpoint{ep(f, 1, 8080, false)}},
			{"load balancer", svc(f, "e", 5, 80, tcp, nodePort(30081), lbVIP(1), lbVIP(2)), []model.Endpoint{ep(f, 1, 8080, false), ep(f, 2, 8080, false)}},
			{"externalIP", svc(f, "g", 6, 80, udp, externalIP(3)), []model.Endpoint{ep(f, 1, 8080, true)}},
		}
		for _, tc := range cases {
			e := newEnv(t, f)
			e.put(tc.sp)
			e.sync(true) // the cache, with the node config
			ps := &model.PortState{ServicePort: tc.sp, Selection: model.Categorize(tc.sp, tc.eps, model.NodeInfo{Name: thisNode})}
			got := len(e.b.c.portContribs(ps, &portRecord{id: 1}))
			if hint := contribsHint(ps); hint != got {
				t.Errorf("%s: %s: contribsHint %d, contributions %d", f, tc.name, hint, got)
			}
		}
	}
}
