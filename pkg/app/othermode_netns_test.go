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

	"github.com/dsproxy/dsproxy/internal/netnstest"
	"github.com/dsproxy/dsproxy/pkg/config"
	"github.com/dsproxy/dsproxy/pkg/family"
	ipt "github.com/dsproxy/dsproxy/pkg/iptables"
	"github.com/dsproxy/dsproxy/pkg/ipvs"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/proxier"
	"github.com/dsproxy/dsproxy/pkg/proxier/iptables"
	ipvsbackend "github.com/dsproxy/dsproxy/pkg/proxier/ipvs"
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

// programMode programs oneServiceSync in both families with mode's backend (of
// iptables flavour fl in the iptables and ipvs modes) in the calling thread's
// network namespace, and reports whether it succeeded.
func programMode(t *testing.T, k nft.Kernel, mode config.ProxyMode, fl ipt.Flavor) bool {
	ctx := context.Background()
	for _, f := range family.All {
		var b proxier.Backend = nftables.New(f, k, nftables.Options{})
		if mode != config.ModeNFTables {
			r, err := ipt.New(f, fl)
			if err != nil {
				t.Error(err)
				return false
			}
			switch mode {
			case config.ModeIPTables:
				if b, err = iptables.New(f, r, iptables.Options{MasqueradeBit: 14}); err != nil {
					t.Error(err)
					return false
				}
			case config.ModeIPVS:
				kv, err := ipvs.Open(f, "", true)
				if err != nil {
					t.Error(err)
					return false
				}
				defer kv.Close()
				b = ipvsbackend.New(f, kv, r, ipvsbackend.Options{MasqueradeBit: 14})
			}
		}
		if _, err := b.Sync(ctx, oneServiceSync(f)); err != nil {
			t.Errorf("%s %s sync: %v", mode, f, err)
			return false
		}
	}
	return true
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
	inNewNetns(t, testCleanupOtherMode)
}

// inNewNetns runs fn on a thread in a new network namespace.
func inNewNetns(t *testing.T, fn func(t *testing.T, ns vnetns.NsHandle)) {
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
		fn(t, ns)
		errc <- nil
	}()
	if err := <-errc; err != nil {
		t.Fatalf("new network namespace: %v", err)
	}
	<-errc
}

// openNetlink opens an nftables connection into ns, closed when the test ends,
// and returns it with programMode over it; nil when it cannot (reported).
func openNetlink(t *testing.T, ns vnetns.NsHandle) (*nft.Netlink, func(config.ProxyMode, ipt.Flavor) bool) {
	k, err := nft.NewNetlink(nft.WithNetNSFd(int(ns)))
	if err != nil {
		t.Error(err)
		return nil, nil
	}
	t.Cleanup(func() { _ = k.Close() })
	return k, func(mode config.ProxyMode, fl ipt.Flavor) bool { return programMode(t, k, mode, fl) }
}

func testCleanupOtherMode(t *testing.T, ns vnetns.NsHandle) {
	ctx := context.Background()
	k, program := openNetlink(t, ns)
	if k == nil {
		return
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

// TestCleanupOtherModeIPVS: nftables mode's start removes everything of the
// IPVS mode; IPVS mode's removes the nftables and iptables modes' rules and its
// own chains of the other iptables flavour, and keeps its virtual servers.
func TestCleanupOtherModeIPVS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	netnstest.RequireIPVS(t)
	inNewNetns(t, testCleanupOtherModeIPVS)
}

func testCleanupOtherModeIPVS(t *testing.T, ns vnetns.NsHandle) {
	ctx := context.Background()
	k, program := openNetlink(t, ns)
	if k == nil {
		return
	}
	// count is what is left of a mode: nftables tables, DSPROXY- chains (both
	// flavours), the IPVS mode's virtual servers and its DSIPVS- chains per flavour.
	type left struct{ tables, iptChains, vs, ipvsNFT, ipvsLegacy int }
	count := func() left {
		var l left
		for _, f := range family.All {
			names, err := k.ListTables(ctx, f)
			if err != nil {
				t.Errorf("%s: list tables: %v", f, err)
			}
			for _, name := range names {
				if slices.Contains(nftables.TableNames, name) {
					l.tables++
				}
			}
			for _, fl := range []string{"nft", "legacy"} {
				out, err := exec.Command(f.IPTablesCommand + "-" + fl + "-save").Output()
				if err != nil {
					t.Errorf("%s-%s-save: %v", f.IPTablesCommand, fl, err)
				}
				l.iptChains += strings.Count(string(out), ":"+iptables.Prefix)
				n := strings.Count(string(out), ":"+ipvsbackend.Prefix)
				if fl == "nft" {
					l.ipvsNFT += n
				} else {
					l.ipvsLegacy += n
				}
			}
			kv, err := ipvs.Open(f, "", true)
			if err != nil {
				t.Error(err)
				continue
			}
			svcs, err := kv.Services()
			kv.Close()
			if err != nil {
				t.Error(err)
			}
			l.vs += len(svcs)
		}
		return l
	}
	if !program(config.ModeIPVS, ipt.FlavorNFT) {
		return
	}
	if l := count(); l.vs != 2 || l.ipvsNFT == 0 {
		t.Errorf("after programming the IPVS mode: %+v, want 2 virtual servers and DSIPVS- chains in nft", l)
		return
	}
	if err := cleanupOtherMode(ctx, config.ModeNFTables, ipt.FlavorDefault, k); err != nil {
		t.Errorf("cleanup for nftables mode: %v", err)
	}
	if l := count(); l.vs != 0 || l.ipvsNFT != 0 {
		t.Errorf("nftables mode's cleanup left %+v, want no virtual server and no DSIPVS- chain", l)
	}
	if !program(config.ModeNFTables, "") || !program(config.ModeIPTables, ipt.FlavorNFT) ||
		!program(config.ModeIPVS, ipt.FlavorLegacy) || !program(config.ModeIPVS, ipt.FlavorNFT) {
		return
	}
	if err := cleanupOtherMode(ctx, config.ModeIPVS, ipt.FlavorNFT, k); err != nil {
		t.Errorf("cleanup for ipvs mode: %v", err)
	}
	if l := count(); l.tables != 0 || l.iptChains != 0 || l.vs != 2 || l.ipvsNFT == 0 || l.ipvsLegacy != 0 {
		t.Errorf("ipvs mode (nft)'s cleanup left %+v, want only its 2 virtual servers and its nft chains", l)
	}
}

// TestCleanupKubeProxyIPVS leaves what kube-proxy's IPVS mode leaves (virtual
// servers, kube-ipvs0, its IPv4 and IPv6 ipsets) beside someone else's ipsets
// (one named KUBE- like kube-router's) and virtual server, and checks what --cleanup-kube-proxy removes: with --cleanup, every
// virtual server outside --ipvs-exclude-cidrs, as kube-proxy's own cleanup;
// while dsproxy keeps running, only kube-proxy's (on kube-ipvs0's addresses or
// at a NodePort), or none in dsproxy's IPVS mode. The link and kube-proxy's
// ipsets go in every case, the others never.
func TestCleanupKubeProxyIPVS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	netnstest.RequireIPVS(t)
	vip := map[*family.Family]ipvs.Key{
		family.IPv4: {Addr: netip.MustParseAddr("10.96.0.10"), Proto: 6, Port: 80},
		family.IPv6: {Addr: netip.MustParseAddr("fd00:96::10"), Proto: 6, Port: 80},
	}
	nodePort := ipvs.Key{Addr: netip.MustParseAddr("192.0.2.1"), Proto: 6, Port: 30080}
	other := ipvs.Key{Addr: netip.MustParseAddr("172.16.0.5"), Proto: 6, Port: 443} // someone else's
	all := []ipvs.Key{vip[family.IPv4], vip[family.IPv6], nodePort, other}
	for _, c := range []struct {
		name  string
		scope ipvsScope
		left  []ipvs.Key
	}{
		{"cleanup, other in --ipvs-exclude-cidrs", ipvsScope{exclude: []netip.Prefix{netip.MustParsePrefix("172.16.0.0/12")}}, []ipvs.Key{other}},
		{"cleanup", ipvsScope{}, nil},
		{"running", ipvsScope{kubeProxyOnly: true, nodePorts: map[ipvs.Key]bool{{Proto: 6, Port: 30080}: true}}, []ipvs.Key{other}},
		{"running in ipvs mode", ipvsScope{none: true, kubeProxyOnly: true}, all},
	} {
		t.Run(c.name, func(t *testing.T) {
			inNewNetns(t, func(t *testing.T, _ vnetns.NsHandle) {
				for _, cmd := range [][]string{
					{"ip", "link", "add", kubeProxyIPVSLink, "type", "dummy"},
					{"ip", "addr", "add", "10.96.0.10/32", "dev", kubeProxyIPVSLink},
					{"ip", "addr", "add", "fd00:96::10/128", "dev", kubeProxyIPVSLink},
					{"ipset", "create", "KUBE-CLUSTER-IP", "hash:ip,port"},
					{"ipset", "add", "KUBE-CLUSTER-IP", "10.96.0.10,tcp:80"},
					{"ipset", "create", "KUBE-6-CLUSTER-IP", "hash:ip,port", "family", "inet6"},
					{"ipset", "create", "KUBE-6-LOAD-BALANCER-SOURCE-CID", "hash:ip,port,net", "family", "inet6"},
					{"ipset", "create", "someone-else", "hash:ip"},
					{"ipset", "create", "KUBE-SRC-ABCDEF", "hash:ip"}, // kube-router's
				} {
					if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
						t.Errorf("%v: %v %s", cmd, err, out)
						return
					}
				}
				for _, key := range all {
					k, err := ipvs.Open(family.Of(key.Addr), "", true)
					if err != nil {
						t.Error(err)
						return
					}
					err = k.AddService(ipvs.Service{Key: key, Scheduler: "rr"})
					k.Close()
					if err != nil {
						t.Error(err)
						return
					}
				}
				if err := cleanupKubeProxyIPVS(context.Background(), c.scope); err != nil {
					t.Errorf("cleanup: %v", err)
				}
				var left []ipvs.Key
				for _, f := range family.All {
					k, err := ipvs.Open(f, "", true)
					if err != nil {
						t.Error(err)
						return
					}
					svcs, err := k.Services()
					k.Close()
					if err != nil {
						t.Error(err)
					}
					for _, s := range svcs {
						left = append(left, s.Key)
					}
				}
				for _, key := range all {
					if slices.Contains(left, key) != slices.Contains(c.left, key) {
						t.Errorf("virtual servers left %v, want %v", left, c.left)
						break
					}
				}
				if out, err := exec.Command("ip", "link", "show", kubeProxyIPVSLink).CombinedOutput(); err == nil {
					t.Errorf("%s left:\n%s", kubeProxyIPVSLink, out)
				}
				out, err := exec.Command("ipset", "list", "-n").CombinedOutput()
				sets := strings.Fields(string(out))
				slices.Sort(sets)
				if want := []string{"KUBE-SRC-ABCDEF", "someone-else"}; err != nil || !slices.Equal(sets, want) {
					t.Errorf("ipsets after cleanup: %v %v, want %v\n%s", sets, err, want, out)
				}
			})
		})
	}
}
