//go:build netns

package nfacct

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dsproxy/dsproxy/internal/netnstest"
	nstest "github.com/dsproxy/dsproxy/test/netns"
)

// TestNetlink creates, reads and deletes objects in a namespace of its own and
// counts real packets into one with an iptables rule.
func TestNetlink(t *testing.T) {
	c := nstest.New(t)
	cl := NewAt(c.Node.Handle())
	const name = "dsproxy_test_pkts"
	if _, err := cl.Get(name); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of a missing object: %v, want ErrNotFound", err)
	}
	for range 2 {
		if err := cl.Ensure(name); err != nil {
			t.Fatal(err)
		}
	}
	if ctr, err := cl.Get(name); err != nil || ctr != (Counter{Name: name}) {
		t.Fatalf("new object: %+v, %v", ctr, err)
	}
	rule := []string{"OUTPUT", "-d", "127.0.0.2", "-p", "udp", "--dport", "9", "-m", "nfacct", "--nfacct-name", name}
	iptables := func(op string) {
		t.Helper()
		if out, err := nstest.Exec(c.Node, "iptables", append([]string{"-w", op}, rule...)...); err != nil {
			t.Fatalf("iptables %s: %v: %s", op, err, out)
		}
	}
	iptables("-A")
	for range 3 {
		if out, err := nstest.Exec(c.Node, "bash", "-c", "echo hello > /dev/udp/127.0.0.2/9"); err != nil {
			t.Fatalf("sending: %v: %s", err, out)
		}
	}
	ctr, err := cl.Get(name)
	if err != nil || ctr.Packets != 3 || ctr.Bytes < 3*(20+8+6) {
		t.Fatalf("after 3 datagrams: %+v, %v", ctr, err)
	}
	if err := cl.Ensure(name); err != nil {
		t.Fatal(err)
	}
	if again, err := cl.Get(name); err != nil || again != ctr {
		t.Fatalf("Ensure of an existing object changed it: %+v -> %+v (%v)", ctr, again, err)
	}
	if other, err := NewAt(netnstest.New(t)).Get(name); !errors.Is(err, ErrNotFound) {
		t.Fatalf("object visible in another namespace: %+v, %v", other, err)
	}
	if err := cl.Delete(name); !errors.Is(err, unix.EBUSY) {
		t.Fatalf("Delete of an object a rule names: %v, want EBUSY", err)
	}
	iptables("-D")
	if err := cl.Delete(name); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Get(name); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after Delete: %v", err)
	}
	for _, bad := range []string{"", strings.Repeat("x", MaxNameLen+1), "a\x00b"} {
		if err := cl.Ensure(bad); err == nil || !strings.Contains(err.Error(), "invalid object name") {
			t.Errorf("Ensure(%q): %v", bad, err)
		}
	}
}
