// Package netnstest gives root-only tests a fresh, anonymous network namespace, so
// no test touches the host's namespace.
package netnstest

import (
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
)

// New creates a fresh network namespace and returns a handle to it, without leaving
// any thread in it: the creating thread returns to its original namespace before it
// is unlocked. It skips the test when not root. The namespace goes away with the
// handle at test cleanup.
func New(t testing.TB) netns.NsHandle {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New() // also switches this thread into it
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	if err := netns.Set(orig); err != nil {
		// Never unlock a thread stuck in the wrong namespace: it dies with the goroutine.
		ns.Close()
		t.Fatalf("cannot return to the original netns: %v", err)
	}
	runtime.UnlockOSThread()
	t.Cleanup(func() { ns.Close() })
	return ns
}

// RequireIPVS skips the test when the kernel has no IPVS, unless
// DSPROXY_REQUIRE_IPVS is set (make test-ipvs, in a guest kernel that has it),
// when it fails instead.
func RequireIPVS(t testing.TB) {
	t.Helper()
	if _, err := os.Stat("/proc/net/ip_vs"); err == nil {
		return
	}
	if os.Getenv("DSPROXY_REQUIRE_IPVS") != "" {
		t.Fatal("DSPROXY_REQUIRE_IPVS is set and the kernel has no IPVS (/proc/net/ip_vs)")
	}
	t.Skip("the kernel has no IPVS: make test-ipvs runs this in a guest kernel that has it")
}
