//go:build netns

package app

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dsproxy/dsproxy/pkg/config"
	"github.com/dsproxy/dsproxy/pkg/family"
	ipt "github.com/dsproxy/dsproxy/pkg/iptables"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/proxier"
	"github.com/dsproxy/dsproxy/pkg/proxier/iptables"
	"github.com/dsproxy/dsproxy/pkg/proxier/nftables"
	vnetns "github.com/vishvananda/netns"
)

// oneServiceSync is a full sync of one ClusterIP Service with one endpoint in f.
func oneServiceSync(f *family.Family) *proxier.SyncRequest {
	vip, ep := netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("10.64.0.5")
	if f == family.IPv6 {
		vip, ep = netip.MustParseAddr("fd00:96::10"), netip.MustParseAddr("fd00:64::5")
	}
	name := model.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "svc"}, Port: "http", Protocol: v1.ProtocolTCP}
	st := model.NewState()
	st.Ports[name] = &model.PortState{
		ServicePort: &model.ServicePort{Name: name, ClusterIP: vip, Port: 80, Protocol: v1.ProtocolTCP},
		Selection:   model.Selection{Cluster: []model.Endpoint{{Addr: ep, Port: 8080, Ready: true, Serving: true}}, HasAny: true},
	}
	return &proxier.SyncRequest{Full: true, State: st, Changed: []model.ServicePortName{name}, Node: &proxier.NodeConfig{Family: f}, NodeChanged: true}
}

// TestCleanupOtherMode programs one Service with both backends (the iptables one
// in both flavours) in a fresh network namespace and checks that starting in one
// mode removes the other mode's rules, and in iptables mode the other flavour's,
// and only those.
func TestCleanupOtherMode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, f := range family.All {
		for _, fl := range []string{"nft", "legacy"} {
			if _, err := exec.LookPath(f.IPTablesCommand + "-" + fl + "-restore"); err != nil {
				t.Skipf("no %s-%s-restore", f.IPTablesCommand, fl)
			}
		}
	}
	errc := make(chan error, 1)
	go func() {
		// The thread enters a new network namespace and is never unlocked, so it
		// exits with the goroutine instead of serving others.
		runtime.LockOSThread()
		ns, err := vnetns.New()
		if err != nil {
			errc <- err
			return
		}
		defer ns.Close()
		errc <- nil
		testCleanupOtherMode(t, ns)
		errc <- nil
	}()
	if err := <-errc; err != nil {
		t.Fatalf("new network namespace: %v", err)
	}
	<-errc
}

func testCleanupOtherMode(t *testing.T, ns vnetns.NsHandle) {
	ctx := context.Background()
	k, err := nft.NewNetlink(nft.WithNetNSFd(int(ns)))
	if err != nil {
		t.Error(err)
		return
	}
	defer k.Close()
	program := func(mode config.ProxyMode, fl ipt.Flavor) bool {
		for _, f := range family.All {
			var b proxier.Backend = nftables.New(f, k, nftables.Options{})
			if mode == config.ModeIPTables {
				r, err := ipt.New(f, fl)
				if err != nil {
					t.Error(err)
					return false
				}
				if b, err = iptables.New(f, r, iptables.Options{MasqueradeBit: 14}); err != nil {
					t.Error(err)
					return false
				}
			}
			if _, err := b.Sync(ctx, oneServiceSync(f)); err != nil {
				t.Errorf("%s %s sync: %v", mode, f, err)
				return false
			}
		}
		return true
	}
	nftTables := func() int {
		n := 0
		for _, f := range family.All {
			names, err := k.ListTables(ctx, f)
			if err != nil {
				t.Errorf("%s: list tables: %v", f, err)
			}
			for _, name := range names {
				if slices.Contains(nftables.TableNames, name) {
					n++
				}
			}
		}
		return n
	}
	// iptChains counts the DSPROXY- chains of a flavour's tables.
	iptChains := func(flavor string) int {
		n := 0
		for _, f := range family.All {
			out, err := exec.Command(f.IPTablesCommand + "-" + flavor + "-save").Output()
			if err != nil {
				t.Errorf("%s-%s-save: %v", f.IPTablesCommand, flavor, err)
			}
			n += strings.Count(string(out), ":"+iptables.Prefix)
		}
		return n
	}
	iptAll := func() int { return iptChains("nft") + iptChains("legacy") }
	// Both modes, and iptables mode in both flavours (an earlier start detected
	// the other one).
	if !program(config.ModeNFTables, "") || !program(config.ModeIPTables, ipt.FlavorNFT) || !program(config.ModeIPTables, ipt.FlavorLegacy) {
		return
	}
	if n, c, l := nftTables(), iptChains("nft"), iptChains("legacy"); n != 2 || c == 0 || l == 0 {
		t.Errorf("after programming both modes: %d dsproxy nftables tables (want 2), %d and %d DSPROXY- chains in nft and legacy (want some)", n, c, l)
		return
	}
	if err := cleanupOtherMode(ctx, config.ModeIPTables, ipt.FlavorNFT, k); err != nil {
		t.Errorf("cleanup for iptables mode: %v", err)
	}
	if n, c, l := nftTables(), iptChains("nft"), iptChains("legacy"); n != 0 || c == 0 || l != 0 {
		t.Errorf("iptables mode (nft)'s cleanup left %d nftables tables (want 0), %d DSPROXY- chains in nft (want them kept), %d in legacy (want 0)", n, c, l)
	}
	if !program(config.ModeNFTables, "") {
		return
	}
	if err := cleanupOtherMode(ctx, config.ModeNFTables, ipt.FlavorDefault, k); err != nil {
		t.Errorf("cleanup for nftables mode: %v", err)
	}
	if n, c := nftTables(), iptAll(); n != 2 || c != 0 {
		t.Errorf("nftables mode's cleanup left %d nftables tables (want 2 kept) and %d DSPROXY- chains (want 0)", n, c)
	}
}
