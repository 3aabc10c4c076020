//go:build netns

package iptables

import (
	"context"
	"maps"
	"os"
	"os/exec"
	"runtime"
	"testing"

	vnetns "github.com/vishvananda/netns"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// TestDetectRealKernel: in a fresh network namespace Detect chooses the default
// and creates no legacy table; the kubelet's canary chain in the legacy mangle
// table makes it choose legacy; moved to the nf_tables one, nft.
func TestDetectRealKernel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, bin := range []string{"iptables-legacy", "iptables-nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("no %s", bin)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The thread enters a new network namespace and is never unlocked, so it
		// exits with the goroutine instead of serving others.
		runtime.LockOSThread()
		ns, err := vnetns.New()
		if err != nil {
			t.Errorf("new network namespace: %v", err)
			return
		}
		defer ns.Close()
		run := func(args ...string) bool {
			if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
				t.Errorf("%v: %v %s", args, err, out)
				return false
			}
			return true
		}
		if got, why := Detect(context.Background(), nil); got != FlavorDefault {
			t.Errorf("empty namespace: Detect = %q (%s), want the default", got, why)
		}
		// Detecting must not create legacy tables on a node that has none.
		for _, names := range []string{"ip_tables_names", "ip6_tables_names"} {
			b, err := os.ReadFile("/proc/thread-self/net/" + names)
			if err == nil && len(b) > 0 {
				t.Errorf("after Detect in an empty namespace, %s lists %q", names, b)
			}
		}
		if !run("iptables-legacy", "-t", "mangle", "-N", "KUBE-KUBELET-CANARY") {
			return
		}
		if got, why := Detect(context.Background(), nil); got != FlavorLegacy {
			t.Errorf("canary in legacy: Detect = %q (%s), want legacy", got, why)
		}
		if !run("iptables-legacy", "-t", "mangle", "-X", "KUBE-KUBELET-CANARY") || !run("ip6tables-nft", "-t", "mangle", "-N", "KUBE-KUBELET-CANARY") {
			return
		}
		if got, why := Detect(context.Background(), nil); got != FlavorNFT {
			t.Errorf("canary in nf_tables: Detect = %q (%s), want nft", got, why)
		}
	}()
	<-done
}

// TestRuleCountsRealKernel: in a fresh network namespace, both flavours (and
// the default, whichever it is) and both families count what a restore wrote, a declared empty chain as 0, and
// leave a missing chain out; the nf_tables runner lists chain by chain, the
// legacy one reads a save.
func TestRuleCountsRealKernel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread exits with its namespace
		ns, err := vnetns.New()
		if err != nil {
			t.Errorf("new network namespace: %v", err)
			return
		}
		defer ns.Close()
		in := "*nat\n:DSPROXY-A - [0:0]\n:DSPROXY-B - [0:0]\n" +
			"-A DSPROXY-A -p tcp -m tcp --dport 80 -j DSPROXY-B\n-A DSPROXY-A -p udp -m udp --dport 53 -j DSPROXY-B\n" +
			"-A PREROUTING -j DSPROXY-A\nCOMMIT\n"
		appended := map[string]int{}
		for _, fl := range []Flavor{FlavorNFT, FlavorLegacy, FlavorDefault} {
			for _, f := range family.All {
				r, err := New(f, fl)
				if err != nil {
					t.Errorf("%s %s: %v", f, fl, err)
					continue
				}
				// Which way it reads: listing (nf_tables) or one save (legacy).
				if want := Resolve(context.Background(), f, fl); r.kernel != want || want == FlavorDefault {
					t.Errorf("%s %q: the runner reads as %q; its binaries are %q", f, fl, r.kernel, want)
				}
				if err := r.Restore(context.Background(), []byte(in)); err != nil {
					t.Errorf("%s %s: %v", f, fl, err)
					continue
				}
				// Each restore declares (so flushes) the DSPROXY- chains and
				// appends to PREROUTING.
				appended[f.Name+string(r.kernel)]++
				got, err := r.RuleCounts(context.Background(), "nat", []string{"DSPROXY-A", "DSPROXY-B", "DSPROXY-GONE", "PREROUTING"})
				if want := map[string]int{"DSPROXY-A": 2, "DSPROXY-B": 0, "PREROUTING": appended[f.Name+string(r.kernel)]}; err != nil || !maps.Equal(got, want) {
					t.Errorf("%s %s: RuleCounts = %v, %v; want %v", f, fl, got, err, want)
				}
			}
		}
	}()
	<-done
}
