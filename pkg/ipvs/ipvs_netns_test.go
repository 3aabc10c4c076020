//go:build netns

package ipvs

import (
	"errors"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/dsproxy/dsproxy/internal/netnstest"
	"github.com/dsproxy/dsproxy/pkg/family"
)

// inNetns runs fn on a thread in a new network namespace.
func inNetns(t *testing.T, fn func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		ns, err := netns.New()
		if err != nil {
			t.Error(err)
			return
		}
		defer ns.Close()
		fn()
	}()
	<-done
}

// TestSets: ipsets and their members round-trip through the kernel, and a
// Kernel without IPVS lists no virtual server. IPVS itself is covered in the
// guest kernel (make test-ipvs).
func TestSets(t *testing.T) {
	inNetns(t, func() {
		for _, f := range family.All {
			k, err := Open(f, "", false)
			if err != nil {
				t.Error(err)
				return
			}
			defer k.Close()
			if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
				if svcs, err := k.Services(); err != nil || svcs != nil {
					t.Errorf("%s: without IPVS, Services() = %v, %v; want none", f, svcs, err)
				}
				if err := k.AddService(Service{}); err == nil {
					t.Errorf("%s: without IPVS, AddService succeeded", f)
				}
			}
			a := netip.MustParseAddr(map[int]string{32: "10.96.0.10", 128: "fd00:96::10"}[f.BitLen])
			name := "T-" + f.Name
			if err := k.EnsureSet(name, "hash:ip,port,net"); err != nil {
				t.Error(err)
				return
			}
			if err := k.EnsureSet(name, "hash:ip,port,net"); err != nil {
				t.Errorf("%s: creating a set twice: %v", f, err)
			}
			net := netip.MustParsePrefix(map[int]string{32: "198.51.100.0/24", 128: "2001:db8:9::/64"}[f.BitLen])
			want := []Entry{{IP: a, Proto: 6, Port: 80, IP2: net.Addr(), CIDR2: uint8(net.Bits())}, {IP: a, Proto: 132, Port: 81, IP2: a}}
			for _, e := range want {
				if err := k.AddEntry(name, e); err != nil {
					t.Error(err)
				}
			}
			got, ok, err := k.Entries(name)
			slices.SortFunc(got, func(x, y Entry) int { return int(x.Port) - int(y.Port) })
			if err != nil || !ok || !slices.Equal(got, want) {
				t.Errorf("%s: members %+v (%v, %v), want %+v", f, got, ok, err, want)
			}
			if err := k.DelEntry(name, want[0]); err != nil {
				t.Error(err)
			}
			if err := k.DelEntry(name, want[0]); err != nil {
				t.Errorf("%s: deleting a missing member: %v", f, err)
			}
			if err := k.DestroySet(name); err != nil {
				t.Error(err)
			}
			if _, ok, err := k.Entries(name); ok || err != nil {
				t.Errorf("%s: destroyed set still listed (%v)", f, err)
			}
		}
	})
}

// TestLink: the dummy link and its addresses, and HostAddrs leaving the link's
// addresses out.
func TestLink(t *testing.T) {
	inNetns(t, func() {
		if err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "other0"}}); errors.Is(err, unix.EOPNOTSUPP) && os.Getenv("DSPROXY_REQUIRE_IPVS") == "" {
			t.Skip("the kernel has no dummy links: make test-ipvs runs this in a guest kernel that has them")
		} else if err != nil {
			t.Error(err)
			return
		}
		for _, f := range family.All {
			k, err := Open(f, "", false)
			if err != nil {
				t.Error(err)
				return
			}
			defer k.Close()
			if _, err := k.EnsureLink(); err != nil {
				t.Error(err)
				return
			}
			a := netip.MustParseAddr(map[int]string{32: "10.96.0.10", 128: "fd00:96::10"}[f.BitLen])
			if err := k.AddAddr(a); err != nil {
				t.Error(err)
			}
			if err := k.AddAddr(a); err != nil {
				t.Errorf("%s: binding an address twice: %v", f, err)
			}
			if as, err := k.Addrs(); err != nil || !slices.Equal(as, []netip.Addr{a}) {
				t.Errorf("%s: link addresses %v, %v; want [%s]", f, as, err, a)
			}
		}
		// A foreign address is a NodePort address; the link's are not.
		other, _ := netlink.LinkByName("other0")
		if err := netlink.AddrAdd(other, &netlink.Addr{IPNet: netlink.NewIPNet(netip.MustParseAddr("192.0.2.1").AsSlice())}); err != nil {
			t.Error(err)
		}
		as, err := HostAddrs{}.InterfaceAddrs()
		if err != nil || !slices.Contains(as, netip.MustParseAddr("192.0.2.1")) || slices.Contains(as, netip.MustParseAddr("10.96.0.10")) {
			t.Errorf("HostAddrs: %v, %v; want 192.0.2.1 and not the link's 10.96.0.10", as, err)
		}
		k, _ := Open(family.IPv4, "", false)
		defer k.Close()
		if err := k.DelAddr(netip.MustParseAddr("10.96.0.10")); err != nil {
			t.Error(err)
		}
		if err := k.DeleteLinkIfEmpty(); err != nil {
			t.Error(err)
		}
		if _, err := netlink.LinkByName(LinkName); err != nil {
			t.Errorf("link deleted while the IPv6 address is on it: %v", err)
		}
		k6, _ := Open(family.IPv6, "", false)
		defer k6.Close()
		if err := k6.DelAddr(netip.MustParseAddr("fd00:96::10")); err != nil {
			t.Error(err)
		}
		if err := k6.DeleteLinkIfEmpty(); err != nil {
			t.Error(err)
		}
		if _, err := netlink.LinkByName(LinkName); err == nil {
			t.Error("link kept with no address on it")
		}
	})
}

// TestCheckScheduler: a scheduler IPVS has passes the check, which leaves no
// virtual server behind; one it lacks fails it, naming the scheduler; an
// existing virtual server with the scheduler passes without a probe.
func TestCheckScheduler(t *testing.T) {
	netnstest.RequireIPVS(t)
	inNetns(t, func() {
		k, err := Open(family.IPv4, "", true)
		if err != nil {
			t.Error(err)
			return
		}
		defer k.Close()
		for _, sched := range []string{"rr", "wlc"} {
			if err := k.CheckScheduler(sched); err != nil {
				t.Errorf("%s: %v", sched, err)
			}
		}
		if svcs, err := k.Services(); err != nil || len(svcs) != 0 {
			t.Errorf("virtual servers after the checks: %v (%v)", svcs, err)
		}
		if err := k.CheckScheduler("no-such-scheduler"); err == nil || !strings.Contains(err.Error(), `"no-such-scheduler" is not available`) {
			t.Errorf("unknown scheduler: %v", err)
		}
		mine := Service{Key: Key{Addr: netip.MustParseAddr("10.96.0.10"), Proto: 6, Port: 80}, Scheduler: "sh"}
		if err := k.AddService(mine); err != nil {
			t.Error(err)
			return
		}
		if err := k.CheckScheduler("sh"); err != nil {
			t.Errorf("scheduler in use: %v", err)
		}
		if svcs, err := k.Services(); err != nil || len(svcs) != 1 {
			t.Errorf("virtual servers after the check: %v (%v)", svcs, err)
		}
		v6, err := Open(family.IPv6, "", true)
		if err != nil {
			t.Error(err)
			return
		}
		defer v6.Close()
		if err := v6.CheckScheduler("rr"); err == nil {
			t.Error("CheckScheduler on the IPv6 Kernel did not refuse")
		}
	})
}
