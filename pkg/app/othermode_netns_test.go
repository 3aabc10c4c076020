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

// TestCleanupOtherMode programs one Service with both backends in a fresh network
// namespace and checks that starting in one mode removes the other mode's rules,
// and only those.
func TestCleanupOtherMode(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, f := range family.All {
		if _, err := exec.LookPath(f.IPTablesCommand + "-restore"); err != nil {
			t.Skipf("no %s-restore", f.IPTablesCommand)
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
	program := func(mode config.ProxyMode) bool {
		for _, f := range family.All {
			var b proxier.Backend = nftables.New(f, k, nftables.Options{})
			if mode == config.ModeIPTables {
				r, err := ipt.New(f, ipt.FlavorDefault)
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
	iptChains := func() int {
		n := 0
		for _, f := range family.All {
			out, err := exec.Command(f.IPTablesCommand + "-save").Output()
			if err != nil {
				t.Errorf("%s-save: %v", f.IPTablesCommand, err)
			}
			n += strings.Count(string(out), ":"+iptables.Prefix)
		}
		return n
	}
	if !program(config.ModeNFTables) || !program(config.ModeIPTables) {
		return
	}
	if n, c := nftTables(), iptChains(); n != 2 || c == 0 {
		t.Errorf("after programming both modes: %d dsproxy nftables tables (want 2), %d DSPROXY- chains (want some)", n, c)
		return
	}
	if err := cleanupOtherMode(ctx, config.ModeIPTables, k); err != nil {
		t.Errorf("cleanup for iptables mode: %v", err)
	}
	if n, c := nftTables(), iptChains(); n != 0 || c == 0 {
		t.Errorf("iptables mode's cleanup left %d nftables tables (want 0) and %d DSPROXY- chains (want them kept)", n, c)
	}
	if !program(config.ModeNFTables) {
		return
	}
	if err := cleanupOtherMode(ctx, config.ModeNFTables, k); err != nil {
		t.Errorf("cleanup for nftables mode: %v", err)
	}
	if n, c := nftTables(), iptChains(); n != 2 || c != 0 {
		t.Errorf("nftables mode's cleanup left %d nftables tables (want 2 kept) and %d DSPROXY- chains (want 0)", n, c)
	}
}
