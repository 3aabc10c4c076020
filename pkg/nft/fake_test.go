package nft

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/dsproxy/dsproxy/pkg/family"
)

var ctx = context.Background()

// smallState is a table with a map, a verdict map and chains using both.
func smallState(fam *family.Family) *Tx {
	tx := NewTx(fam)
	tx.AddTable("t")
	tx.AddSet("t", &Set{Name: "m", KeyType: nftables.TypeInetService, DataType: nftables.TypeInteger, IsMap: true})
	tx.AddSet("t", &Set{Name: "vm", KeyType: nftables.TypeInetService, DataType: nftables.TypeVerdict, IsMap: true})
	tx.SetChain("t", &Chain{Name: "target"})
	tx.SetChain("t", &Chain{Name: "in", Hook: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Type: "filter",
		Rules: []Rule{
			rule("port map", thDport(1), &expr.Lookup{SourceRegister: 1, DestRegister: 2, IsDestRegSet: true, SetName: "m"}),
			rule("", thDport(1), &expr.Lookup{SourceRegister: 1, DestRegister: unix.NFT_REG_VERDICT, IsDestRegSet: true, SetName: "vm"}),
		}})
	tx.AddElements("t", "m", []Element{{Key: port2(80), Data: IndexBytes(1)}})
	return tx
}

func port2(p uint16) []byte { return PortBytes(p)[:2] }

func mustApply(t *testing.T, f *Fake, tx *Tx) {
	t.Helper()
	if err := f.Apply(ctx, tx); err != nil {
		t.Fatalf("apply: %v\n%s", err, tx)
	}
}

func TestFakeErrors(t *testing.T) {
	fam := family.IPv4
	el := func(p uint16, v uint32) []Element { return []Element{{Key: port2(p), Data: IndexBytes(v)}} }
	cases := []struct {
		name  string
		build func(tx *Tx)
		want  error
	}{
		{"identical re-add", func(tx *Tx) { tx.AddElements("t", "m", el(80, 1)) }, nil},
		{"re-add table, set and chain", func(tx *Tx) {
			tx.AddTable("t")
			tx.AddSet("t", &Set{Name: "m", KeyType: nftables.TypeInetService, DataType: nftables.TypeInteger, IsMap: true})
			tx.SetChain("t", &Chain{Name: "target"})
		}, nil},
		{"delete then re-add with new data", func(tx *Tx) {
			tx.DeleteElements("t", "m", el(80, 0))
			tx.AddElements("t", "m", el(80, 2))
		}, nil},
		{"add with other data", func(tx *Tx) { tx.AddElements("t", "m", el(80, 2)) }, syscall.EEXIST},
		{"set redefined", func(tx *Tx) {
			tx.AddSet("t", &Set{Name: "m", KeyType: nftables.TypeInetService})
		}, syscall.EEXIST},
		{"base chain hook changed", func(tx *Tx) {
			tx.SetChain("t", &Chain{Name: "in", Hook: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Type: "filter"})
		}, syscall.EEXIST},
		{"delete missing element", func(tx *Tx) { tx.DeleteElements("t", "m", el(81, 0)) }, syscall.ENOENT},
		{"missing table", func(tx *Tx) { tx.AddSet("nope", &Set{Name: "s", KeyType: nftables.TypeInetService}) }, syscall.ENOENT},
		{"missing set", func(tx *Tx) { tx.AddElements("t", "nope", el(1, 1)) }, syscall.ENOENT},
		{"flush missing set", func(tx *Tx) { tx.FlushSet("t", "nope") }, syscall.ENOENT},
		{"delete missing chain", func(tx *Tx) { tx.DeleteChain("t", "nope") }, syscall.ENOENT},
		{"lookup of missing set", func(tx *Tx) {
			tx.SetChain("t", &Chain{Name: "c", Rules: []Rule{rule("", thDport(1), &expr.Lookup{SourceRegister: 1, SetName: "nope"})}})
		}, syscall.ENOENT},
		{"dynset of missing set", func(tx *Tx) {
			tx.SetChain("t", &Chain{Name: "c", Rules: []Rule{rule("", thDport(1), &expr.Dynset{SrcRegKey: 1, SetName: "nope"})}})
		}, syscall.ENOENT},
		{"jump to missing chain", func(tx *Tx) { tx.SetChain("t", &Chain{Name: "c", Rules: []Rule{rule("", jumpV("nope"))}}) }, syscall.ENOENT},
		{"vmap element to missing chain", func(tx *Tx) {
			tx.AddElements("t", "vm", []Element{{Key: port2(1), Verdict: &expr.Verdict{Kind: expr.VerdictGoto, Chain: "nope"}}})
		}, syscall.ENOENT},
		{"delete referenced set", func(tx *Tx) { tx.DeleteSet("t", "m") }, syscall.EBUSY},
		{"delete chain referenced by a rule", func(tx *Tx) {
			tx.SetChain("t", &Chain{Name: "c", Rules: []Rule{rule("", jumpV("target"))}})
			tx.DeleteChain("t", "target")
		}, syscall.EBUSY},
		{"delete chain referenced by a vmap element", func(tx *Tx) {
			tx.AddElements("t", "vm", []Element{{Key: port2(1), Verdict: &expr.Verdict{Kind: expr.VerdictGoto, Chain: "target"}}})
			tx.DeleteChain("t", "target")
		}, syscall.EBUSY},
		{"delete set after its rules", func(tx *Tx) {
			tx.SetChain("t", &Chain{Name: "in"})
			tx.DeleteSet("t", "m")
		}, nil},
		{"key too short", func(tx *Tx) { tx.AddElements("t", "m", []Element{{Key: PortBytes(1), Data: IndexBytes(1)}}) }, syscall.EINVAL},
		{"data too long", func(tx *Tx) { tx.AddElements("t", "m", []Element{{Key: port2(1), Data: make([]byte, 8)}}) }, syscall.EINVAL},
		{"map element without data", func(tx *Tx) { tx.AddElements("t", "m", []Element{{Key: port2(1)}}) }, syscall.EINVAL},
		{"register read before write", func(tx *Tx) {
			tx.SetChain("t", &Chain{Name: "c", Rules: []Rule{rule("", &expr.Cmp{Op: expr.CmpOpEq, Register: 9, Data: []byte{1}})}})
		}, syscall.ENODATA},
		{"register out of range", func(tx *Tx) {
			tx.SetChain("t", &Chain{Name: "c", Rules: []Rule{rule("", &expr.Payload{DestRegister: unix.NFT_REG32_15, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16})}})
		}, syscall.ERANGE},
		{"jump loop", func(tx *Tx) {
			tx.SetChain("t", &Chain{Name: "a"})
			tx.SetChain("t", &Chain{Name: "b", Rules: []Rule{rule("", jumpV("a"))}})
			tx.SetChain("t", &Chain{Name: "a", Rules: []Rule{rule("", jumpV("b"))}})
			tx.SetChain("t", &Chain{Name: "in", Hook: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Type: "filter",
				Rules: []Rule{rule("", jumpV("a"))}})
		}, syscall.ELOOP},
		{"dnat in a filter chain", func(tx *Tx) {
			tx.SetChain("t", &Chain{Name: "in", Rules: []Rule{rule("", &expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4})}})
		}, syscall.EOPNOTSUPP},
		{"dynset on a non-dynamic set", func(tx *Tx) {
			tx.SetChain("t", &Chain{Name: "c", Rules: []Rule{rule("", thDport(1), imm(2, IndexBytes(0)),
				&expr.Dynset{SrcRegKey: 1, SrcRegData: 2, SetName: "m", Operation: unix.NFT_DYNSET_OP_ADD})}})
		}, syscall.EOPNOTSUPP},
		{"jump to a base chain", func(tx *Tx) { tx.SetChain("t", &Chain{Name: "c", Rules: []Rule{rule("", jumpV("in"))}}) }, syscall.EOPNOTSUPP},
		{"delete absent table", func(tx *Tx) { tx.DeleteTable("absent") }, nil},
		{"add then delete table", func(tx *Tx) {
			tx.AddTable("fresh")
			tx.DeleteTable("fresh")
		}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFake()
			mustApply(t, f, smallState(fam))
			before, n := f.Dump(fam), f.Transactions()
			tx := NewTx(fam)
			// A valid first operation proves that failures roll everything back.
			tx.AddElements("t", "m", el(7, 7))
			tc.build(tx)
			err := f.Apply(ctx, tx)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if got := f.Dump(fam); got != before || f.Transactions() != n {
				t.Errorf("failed transaction changed the state:\n%s\nwas:\n%s", got, before)
			}
		})
	}
}

func TestFakeErrorNamesObject(t *testing.T) {
	f := NewFake()
	mustApply(t, f, smallState(family.IPv6))
	tx := NewTx(family.IPv6)
	tx.DeleteElements("t", "m", []Element{{Key: port2(99)}})
	err := f.Apply(ctx, tx)
	if !IsNotFound(err) || !strings.Contains(err.Error(), "set t/m") || !strings.Contains(err.Error(), "IPv6") {
		t.Errorf("error %q should be ENOENT and name family and set", err)
	}
}

func TestFakeDeleteTableAndFamilies(t *testing.T) {
	f := NewFake()
	mustApply(t, f, smallState(family.IPv4))
	mustApply(t, f, smallState(family.IPv6))
	tx := NewTx(family.IPv4)
	tx.DeleteTable("t")
	mustApply(t, f, tx)
	if got := f.Dump(family.IPv4); got != "" {
		t.Errorf("v4 not empty:\n%s", got)
	}
	if names, _ := f.ListTables(ctx, family.IPv6); len(names) != 1 || names[0] != "t" {
		t.Errorf("v6 tables %v", names)
	}
	if _, err := f.ListChains(ctx, family.IPv4, "t"); !errors.Is(err, ErrNotFound) {
		t.Errorf("ListChains of deleted table: %v", err)
	}
}

func TestFakeFailNextAndCounters(t *testing.T) {
	f := NewFake()
	f.FailNext(syscall.ENOBUFS)
	if err := f.Apply(ctx, smallState(family.IPv4)); !errors.Is(err, syscall.ENOBUFS) {
		t.Fatalf("injected failure: %v", err)
	}
	if f.Dump(family.IPv4) != "" || f.Transactions() != 0 {
		t.Fatal("injected failure changed state")
	}
	tx := smallState(family.IPv4)
	mustApply(t, f, tx)
	if f.Transactions() != 1 || f.LastElementOps() != 1 || tx.ElementOps() != 1 {
		t.Errorf("transactions %d, element ops %d", f.Transactions(), f.LastElementOps())
	}
}

func TestFakeFlushSetAndList(t *testing.T) {
	f := NewFake()
	mustApply(t, f, smallState(family.IPv4))
	tx := NewTx(family.IPv4)
	tx.AddElements("t", "m", []Element{{Key: port2(443), Data: IndexBytes(2)}, {Key: port2(22), Data: IndexBytes(3)}})
	mustApply(t, f, tx)
	els, err := f.ListElements(ctx, family.IPv4, "t", "m")
	if err != nil || len(els) != 3 || string(els[0].Key) != string(port2(22)) {
		t.Fatalf("elements %v, %v", els, err)
	}
	tx = NewTx(family.IPv4)
	tx.FlushSet("t", "m")
	mustApply(t, f, tx)
	if els, _ := f.ListElements(ctx, family.IPv4, "t", "m"); len(els) != 0 {
		t.Fatalf("after flush: %v", els)
	}
}

// TestDumpCanonical checks that the dump does not depend on operation order and
// pins its format.
func TestDumpCanonical(t *testing.T) {
	fam := family.IPv4
	build := func(reverse bool) *Fake {
		f := NewFake()
		tx := NewTx(fam)
		tx.AddTable("z")
		tx.AddTable("a")
		sets := []*Set{
			{Name: "svc", KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService), Concat: true},
			{Name: "eps", KeyType: nftables.TypeIPAddr, DataType: nftables.TypeInetService, IsMap: true},
		}
		elems := []Element{
			{Key: Concat(AddrBytes(netip.MustParseAddr("10.0.0.9")), ProtoBytes(unix.IPPROTO_UDP), PortBytes(53))},
			{Key: Concat(AddrBytes(netip.MustParseAddr("10.0.0.10")), ProtoBytes(unix.IPPROTO_TCP), PortBytes(80))},
		}
		if reverse {
			sets[0], sets[1] = sets[1], sets[0]
			elems[0], elems[1] = elems[1], elems[0]
		}
		for _, s := range sets {
			tx.AddSet("a", s)
		}
		tx.AddElements("a", "svc", elems[:1])
		tx.AddElements("a", "svc", elems[1:])
		tx.AddElements("a", "eps", []Element{{Key: AddrBytes(netip.MustParseAddr("10.1.0.1")), Data: PortBytes(8080)[:2]}})
		tx.SetChain("a", &Chain{Name: "out", Hook: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest, Type: "nat",
			Rules: []Rule{rule("hi", dropV())}})
		mustApply(t, f, tx)
		return f
	}
	got := build(false).Dump(fam)
	if other := build(true).Dump(fam); got != other {
		t.Fatalf("dump depends on order:\n%s\nvs\n%s", got, other)
	}
	want := `table ip a
  chain out { type nat hook output priority -100; }
    0: [drop] comment "hi"
  map eps { type ipv4_addr : inet_service; }
    10.1.0.1 : 8080
  set svc { type ipv4_addr . inet_proto . inet_service; flags concat; }
    10.0.0.9 . udp . 53
    10.0.0.10 . tcp . 80
table ip z
`
	if got != want {
		t.Errorf("dump:\n%s\nwant:\n%s", got, want)
	}
}

func TestTxStringAndHelpers(t *testing.T) {
	tx := smallState(family.IPv6)
	tx.DeleteElements("t", "m", []Element{{Key: port2(80)}})
	tx.FlushSet("t", "m")
	tx.DeleteChain("t", "target")
	tx.DeleteSet("t", "vm")
	tx.DeleteTable("t")
	s := tx.String()
	for _, want := range []string{
		"add table ip6 t\n",
		"add map ip6 t m { type inet_service : integer; }\n",
		"add chain ip6 t in { type filter hook input priority 0; }\n",
		`add rule ip6 t in [payload th dport => r1] [lookup r1 @m => r2] comment "port map"`,
		"add element ip6 t m { 80 : 1 }\n",
		"delete element ip6 t m { 80 }\n",
		"flush set ip6 t m\n", "delete chain ip6 t target\n", "delete set ip6 t vm\n", "delete table ip6 t\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("Tx.String lacks %q:\n%s", want, s)
		}
	}
	if tx.ElementOps() != 3 {
		t.Errorf("ElementOps %d, want 3", tx.ElementOps())
	}
	if got := AddrBytes(netip.MustParseAddr("::ffff:10.0.0.1")); len(got) != 4 {
		t.Errorf("AddrBytes does not unmap: %x", got)
	}
	if got := PortBytes(0x1234); string(got) != "\x12\x34\x00\x00" {
		t.Errorf("PortBytes %x", got)
	}
	if got := ProtoBytes(6); string(got) != "\x06\x00\x00\x00" {
		t.Errorf("ProtoBytes %x", got)
	}
}

func TestFakeConcurrent(t *testing.T) {
	f, ad := newTracedFake(t, family.IPv4)
	rs := newTestRuleset(family.IPv4)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 20 {
				tx := NewTx(family.IPv4)
				ip := netip.AddrFrom4([4]byte{10, 97, byte(i), byte(j)})
				rs.service(tx, ip, 80, false, ad.ep0, ad.ep1)
				if err := f.Apply(ctx, tx); err != nil {
					t.Error(err)
				}
				if _, err := f.TraceAll(Node{}, Packet{Family: family.IPv4, Src: netip.AddrPortFrom(ad.client, 1),
					Dst: netip.AddrPortFrom(ip, 80), Proto: unix.IPPROTO_TCP, Origin: OriginInbound}); err != nil {
					t.Error(err)
				}
				_ = f.Dump(family.IPv4)
			}
		}()
	}
	wg.Wait()
	if f.Transactions() != 1+8*20 {
		t.Errorf("transactions %d", f.Transactions())
	}
}
