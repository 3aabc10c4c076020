//go:build netns

package nft

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/dsproxy/dsproxy/internal/netnstest"
	"github.com/dsproxy/dsproxy/pkg/family"
)

func newTestNetlink(t *testing.T) *Netlink {
	ns := netnstest.New(t)
	nl, err := NewNetlink(WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nl.Close() })
	return nl
}

// kernelText renders what a Kernel holds for fam through the Kernel interface
// only, with the Fake's set names (the interface does not list sets).
func kernelText(t *testing.T, k Kernel, fam *family.Family, sets map[string][]string) string {
	t.Helper()
	tables, err := k.ListTables(ctx, fam)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, tn := range tables {
		fmt.Fprintf(&b, "table %s\n", tn)
		chains, err := k.ListChains(ctx, fam, tn)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range chains {
			fmt.Fprintf(&b, "  chain %s\n", chainHeader(c))
			for i, r := range c.Rules {
				fmt.Fprintf(&b, "    %d: %s\n", i, FormatRule(r))
			}
		}
		for _, sn := range sets[tn] {
			els, err := k.ListElements(ctx, fam, tn, sn)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "  set %s\n", sn)
			for _, e := range els {
				fmt.Fprintf(&b, "    %s\n", FormatElement(nil, e))
			}
		}
	}
	return b.String()
}

func fakeSetNames(f *Fake, fam *family.Family) map[string][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][]string{}
	for id, t := range f.tables {
		if id.proto == fam.NFProto {
			out[id.name] = slices.Sorted(maps.Keys(t.sets))
		}
	}
	return out
}

// differ applies every transaction to the kernel and the Fake and checks that both
// agree on success or errno and then hold the same state.
type differ struct {
	t   *testing.T
	nl  *Netlink
	fk  *Fake
	fam *family.Family
}

func (d *differ) apply(name string, tx *Tx, want error) {
	d.t.Helper()
	kerr, ferr := d.nl.Apply(ctx, tx), d.fk.Apply(ctx, tx)
	switch {
	case want == nil && (kerr != nil || ferr != nil):
		d.t.Fatalf("%s: kernel %v, fake %v\n%s", name, kerr, ferr, tx)
	case want != nil && (!errors.Is(kerr, want) || !errors.Is(ferr, want)):
		d.t.Fatalf("%s: want %v; kernel %v, fake %v\n%s", name, want, kerr, ferr, tx)
	}
	sets := fakeSetNames(d.fk, d.fam)
	if kt, ft := kernelText(d.t, d.nl, d.fam, sets), kernelText(d.t, d.fk, d.fam, sets); kt != ft {
		d.t.Fatalf("%s: kernel and fake differ\nkernel:\n%s\nfake:\n%s", name, kt, ft)
	}
}

func TestNetlinkDifferential(t *testing.T) {
	for _, fam := range family.All {
		for _, mode := range []string{"batch", "flush"} {
			t.Run(fam.Name+"/"+mode, func(t *testing.T) { testNetlinkDifferential(t, fam, mode == "flush") })
		}
	}
}

// testNetlinkDifferential; flush: through google/nftables' Flush (the fallback
// when its queue is unreachable) instead of Netlink's own batches.
func testNetlinkDifferential(t *testing.T, fam *family.Family, flush bool) {
	d := &differ{t: t, nl: newTestNetlink(t), fk: NewFake(), fam: fam}
	if flush {
		d.nl.batchConn.Close()
		d.nl.batchConn = nil
	}
	rs := newTestRuleset(fam)
	ad := addrsFor(fam)

	tx := NewTx(fam)
	loadTestServices(tx, rs, ad)
	tx.AddTable("aux")
	tx.DeleteTable("never-existed")
	d.apply("initial load", tx, nil)

	// A verdict map with a goto element, in its own table.
	tx = NewTx(fam)
	tx.AddSet("aux", &Set{Name: "vm", KeyType: rs.svcType(), DataType: nftables.TypeVerdict, IsMap: true, Concat: true})
	tx.SetChain("aux", &Chain{Name: "lb", Rules: []Rule{rule("lb", &expr.Counter{}, dropV())}})
	tx.SetChain("aux", &Chain{Name: "pre", Hook: nftables.ChainHookPrerouting, Priority: prio(-50), Type: "filter",
		Rules: []Rule{rule("", append(rs.svcKey(), &expr.Lookup{SourceRegister: r8, DestRegister: unix.NFT_REG_VERDICT, IsDestRegSet: true, SetName: "vm"})...)}})
	tx.AddElements("aux", "vm", []Element{{Key: rs.svcKeyBytes(ad.svc, unix.IPPROTO_TCP, 80), Verdict: &expr.Verdict{Kind: expr.VerdictGoto, Chain: "lb"}}})
	d.apply("verdict map", tx, nil)

	// Element churn: replace an endpoint, move a service, flush a set.
	key0 := Concat(rs.svcKeyBytes(ad.svc, unix.IPPROTO_TCP, 80), IndexBytes(0))
	tx = NewTx(fam)
	tx.DeleteElements(testTable, "endpoints", []Element{{Key: key0}})
	tx.AddElements(testTable, "endpoints", []Element{{Key: key0, Data: rs.epBytes(ad.epA1)}})
	tx.DeleteElements(testTable, "svc-2", []Element{{Key: rs.svcKeyBytes(ad.svc, unix.IPPROTO_TCP, 80)}})
	tx.AddElements(testTable, "aff-2", []Element{{Key: rs.svcKeyBytes(ad.svc, unix.IPPROTO_TCP, 80)}})
	tx.FlushSet(testTable, "no-endpoints")
	tx.SetChain(testTable, filterChain("filter-output", hookOut()))
	d.apply("churn", tx, nil)

	// Appending keeps the chain's rules.
	tx = NewTx(fam)
	tx.AppendRules(testTable, "services", []Rule{rule("appended", append(rs.svcKey(), &expr.Lookup{SourceRegister: r8, SetName: "no-endpoints"}, dropV())...)})
	d.apply("append rules", tx, nil)

	bad := func(name string, want error, build func(tx *Tx)) {
		tx := NewTx(fam)
		tx.AddElements(testTable, "no-endpoints", []Element{{Key: rs.svcKeyBytes(ad.remote, 17, 1)}})
		build(tx)
		d.apply(name, tx, want)
	}
	bad("changed data", syscall.EEXIST, func(tx *Tx) {
		tx.AddElements(testTable, "endpoints", []Element{{Key: key0, Data: rs.epBytes(ad.ep1)}})
	})
	bad("missing element", syscall.ENOENT, func(tx *Tx) {
		tx.DeleteElements(testTable, "svc-2", []Element{{Key: rs.svcKeyBytes(ad.svc, unix.IPPROTO_UDP, 1)}})
	})
	bad("referenced set", syscall.EBUSY, func(tx *Tx) { tx.DeleteSet(testTable, "endpoints") })
	bad("chain referenced by a vmap", syscall.EBUSY, func(tx *Tx) { tx.DeleteChain("aux", "lb") })
	bad("missing set in lookup", syscall.ENOENT, func(tx *Tx) {
		tx.SetChain(testTable, &Chain{Name: "x", Rules: []Rule{rule("", append(rs.svcKey(), &expr.Lookup{SourceRegister: r8, SetName: "nope"})...)}})
	})
	bad("append to missing chain", syscall.ENOENT, func(tx *Tx) {
		tx.AppendRules(testTable, "nope", []Rule{rule("", dropV())})
	})
	bad("jump to missing chain", syscall.ENOENT, func(tx *Tx) {
		tx.SetChain(testTable, &Chain{Name: "x", Rules: []Rule{rule("", jumpV("nope"))}})
	})
	bad("unwritten register", syscall.ENODATA, func(tx *Tx) {
		tx.SetChain(testTable, &Chain{Name: "x", Rules: []Rule{rule("", &expr.Cmp{Op: expr.CmpOpEq, Register: 9, Data: []byte{1}})}})
	})
	bad("short key", syscall.EINVAL, func(tx *Tx) {
		tx.AddElements(testTable, "svc-2", []Element{{Key: AddrBytes(ad.svc)}})
	})

	// A chain with rules can be deleted once nothing jumps to it.
	tx = NewTx(fam)
	tx.DeleteElements("aux", "vm", []Element{{Key: rs.svcKeyBytes(ad.svc, unix.IPPROTO_TCP, 80)}})
	tx.DeleteChain("aux", "lb")
	d.apply("delete chain with rules", tx, nil)

	tx = NewTx(fam)
	tx.DeleteTable("aux")
	tx.DeleteTable(testTable)
	d.apply("delete all", tx, nil)
	for _, k := range []Kernel{d.nl, d.fk} {
		if _, err := k.ListChains(ctx, fam, testTable); !IsNotFound(err) {
			t.Errorf("%T.ListChains of a deleted table: %v, want ENOENT", k, err)
		}
		if _, err := k.ListElements(ctx, fam, testTable, "svc-2"); !IsNotFound(err) {
			t.Errorf("%T.ListElements of a deleted table: %v, want ENOENT", k, err)
		}
	}
}

// TestNetlinkChunking loads 20k elements in one transaction (well over the 64 KiB a
// single message attribute can carry) and reads every one back intact.
func TestNetlinkChunking(t *testing.T) {
	for _, cs := range []int{chunkSize, 4096} {
		for _, fam := range family.All {
			t.Run(fmt.Sprintf("%s/chunks-of-%d", fam.Name, cs), func(t *testing.T) {
				defer func(old int) { chunkSize = old }(chunkSize)
				chunkSize = cs
				testNetlinkChunking(t, fam)
			})
		}
	}
}

func testNetlinkChunking(t *testing.T, fam *family.Family) {
	nl := newTestNetlink(t)
	rs := newTestRuleset(fam)
	tx := NewTx(fam)
	rs.base(tx)
	var want []Element
	base := addrsFor(fam).svc.As16()
	for i := range 20000 {
		b := base
		b[13], b[14], b[15] = byte(i>>16), byte(i>>8), byte(i)
		ip := netip.AddrFrom16(b)
		if fam == family.IPv4 {
			ip = netip.AddrFrom4([4]byte{10, 96 + byte(i>>16), byte(i >> 8), byte(i)})
		}
		want = append(want, Element{
			Key:  Concat(rs.svcKeyBytes(ip, unix.IPPROTO_TCP, 80), IndexBytes(uint32(i%7))),
			Data: rs.epBytes(netip.AddrPortFrom(ip, uint16(i))),
		})
	}
	tx.AddElements(testTable, "endpoints", want)
	if err := nl.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
	// The kernel lists a hash set in no particular order, and a listing taken
	// while the set's hash table is still being resized in the background
	// (right after a big insert, later on a loaded machine) may repeat or
	// skip elements; so compare sorted, and list again on a mismatch. The
	// delete of every element below proves they are all there.
	byKey := func(a, b Element) int { return bytes.Compare(a.Key, b.Key) }
	slices.SortFunc(want, byKey)
	var mismatch string
	for try := 0; try < 10; try++ {
		got, err := nl.ListElements(ctx, fam, testTable, "endpoints")
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(got, byKey)
		if mismatch = elementsDiff(got, want); mismatch == "" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if mismatch != "" {
		t.Fatal(mismatch)
	}
	// Every element is really there: deleting them all succeeds.
	tx = NewTx(fam)
	tx.DeleteElements(testTable, "endpoints", want)
	if err := nl.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
}

// TestNetlinkBatch: transactions go out as Netlink's own batches (the library's
// queue is reachable), a failure names the failing operations and wraps the
// kernel's errno, applies nothing, and leaves the Netlink usable.
func TestNetlinkBatch(t *testing.T) {
	if !batchable {
		t.Fatal("google/nftables' Conn.messages or Conn.err is unreachable: transactions fall back to Conn.Flush")
	}
	fam := family.IPv4
	nl := newTestNetlink(t)
	if nl.batchConn == nil {
		t.Fatal("Netlink has no batch socket")
	}
	rs := newTestRuleset(fam)
	ad := addrsFor(fam)
	tx := NewTx(fam)
	rs.base(tx)
	rs.service(tx, ad.svc, 80, false, ad.ep0)
	if err := nl.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
	before := kernelText(t, nl, fam, map[string][]string{testTable: {"endpoints", "no-endpoints"}})

	tx = NewTx(fam)
	tx.AddElements(testTable, "no-endpoints", []Element{{Key: rs.svcKeyBytes(ad.remote, 17, 1)}})
	tx.AddTable("other")
	tx.DeleteElements(testTable, "svc-2", []Element{{Key: rs.svcKeyBytes(ad.svc, unix.IPPROTO_UDP, 1)}}) // op 2: absent
	tx.AppendRules(testTable, "nope", []Rule{rule("", dropV())})                                         // op 3: no such chain
	err := nl.Apply(ctx, tx)
	if !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("Apply: %v, want ENOENT", err)
	}
	t.Logf("error: %v", err)
	for _, want := range []string{"op 2 (delete elements", "op 3 (append rules"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %q: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "op 0 ") || strings.Contains(err.Error(), "op 1 ") {
		t.Errorf("error names operations that did not fail: %v", err)
	}
	if after := kernelText(t, nl, fam, map[string][]string{testTable: {"endpoints", "no-endpoints"}}); after != before {
		t.Fatalf("a failed transaction changed the kernel:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if tables, _ := nl.ListTables(ctx, fam); slices.Contains(tables, "other") {
		t.Fatal("a failed transaction created a table")
	}

	// Usable afterwards; a transaction without messages is a no-op.
	tx = NewTx(fam)
	tx.AddElements(testTable, "no-endpoints", nil)
	if err := nl.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
	tx = NewTx(fam)
	tx.AddTable("other")
	if err := nl.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if tables, _ := nl.ListTables(ctx, fam); !slices.Contains(tables, "other") {
		t.Fatalf("table other missing after a successful transaction: %v", tables)
	}
}

// elementsDiff describes the first difference between two sorted element lists.
func elementsDiff(got, want []Element) string {
	if len(got) != len(want) {
		return fmt.Sprintf("read back %d elements, want %d", len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i].Key, want[i].Key) || !bytes.Equal(got[i].Data, want[i].Data) {
			return fmt.Sprintf("element %d: got %x : %x, want %x : %x", i, got[i].Key, got[i].Data, want[i].Key, want[i].Data)
		}
	}
	return ""
}

// TestNetlinkElementTimeouts: elements added with a timeout to a map with
// timeouts (an affinity map carried into a rebuilt table) live that long: the
// kernel lists them with their timeout and the life they have left.
func TestNetlinkElementTimeouts(t *testing.T) {
	for _, fam := range family.All {
		t.Run(fam.Name, func(t *testing.T) {
			nl := newTestNetlink(t)
			tx := NewTx(fam)
			tx.AddTable(testTable)
			key := nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService)
			if fam == family.IPv6 {
				key = nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetService)
			}
			tx.AddSet(testTable, &Set{Name: "aff", IsMap: true, Concat: true, KeyType: key, DataType: nftables.TypeMark,
				Timeout: true, Dynamic: true, Size: 65535})
			addr := netip.MustParseAddr("10.0.0.9")
			if fam == family.IPv6 {
				addr = netip.MustParseAddr("fd00::9")
			}
			want := []Element{
				{Key: Concat(AddrBytes(addr), PortBytes(80)), Data: IndexBytes(2), Timeout: 90 * time.Minute},
				{Key: Concat(AddrBytes(addr), PortBytes(81)), Data: IndexBytes(0), Timeout: 1500 * time.Millisecond},
			}
			tx.AddElements(testTable, "aff", want)
			if err := nl.Apply(ctx, tx); err != nil {
				t.Fatal(err)
			}
			got, err := nl.ListElements(ctx, fam, testTable, "aff")
			if err != nil {
				t.Fatal(err)
			}
			slices.SortFunc(got, func(a, b Element) int { return bytes.Compare(a.Key, b.Key) })
			if len(got) != 2 {
				t.Fatalf("listed %d elements, want 2", len(got))
			}
			for i, e := range got {
				if !bytes.Equal(e.Key, want[i].Key) || !bytes.Equal(e.Data, want[i].Data) || e.Timeout != want[i].Timeout ||
					e.Expires <= 0 || e.Expires > want[i].Timeout {
					t.Errorf("element %d: %x : %x timeout %v expires %v, want %x : %x timeout %v, expiring within it",
						i, e.Key, e.Data, e.Timeout, e.Expires, want[i].Key, want[i].Data, want[i].Timeout)
				}
			}
			// The short one expires.
			time.Sleep(2 * time.Second)
			if got, err = nl.ListElements(ctx, fam, testTable, "aff"); err != nil || len(got) != 1 || !bytes.Equal(got[0].Key, want[0].Key) {
				t.Errorf("after 2 s: %d elements (%v), want only the 90-minute one", len(got), err)
			}
		})
	}
}
