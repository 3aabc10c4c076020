//go:build netns

package nftables

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/dsproxy/dsproxy/internal/netnstest"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/nft"
)

// nftNetNS is a fresh network namespace with a Netlink kernel in it, and the means
// to run the nft CLI there (through nsenter on our handle, so no thread of this
// process ever enters it).
type nftNetNS struct {
	t  *testing.T
	ns netns.NsHandle
	nl *nft.Netlink
}

func newNFTNetNS(t *testing.T) *nftNetNS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, bin := range []string{"nft", "nsenter"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("needs %s: %v", bin, err)
		}
	}
	ns := netnstest.New(t)
	nl, err := nft.NewNetlink(nft.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nl.Close() })
	return &nftNetNS{t: t, ns: ns, nl: nl}
}

// nft runs the nft CLI in the namespace and returns its combined output.
func (n *nftNetNS) nft(args ...string) (string, error) {
	path := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(n.ns))
	cmd := exec.Command("nsenter", append([]string{"--net=" + path, "--", "nft"}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// representative puts one service port of every kind into e: ClusterIP, NodePort,
// ExternalIP, LoadBalancer VIP with source ranges, ETP Local (with and without local
// endpoints), ITP Local, affinity (ClusterIP and external), UDP and SCTP, and
// services without endpoints.
func representative(e *env) {
	f := e.f
	e.put(svc(f, "web", 10, 80, tcp, nodePort(30080), externalIP(1), lbVIP(2), sourceRange(1, 24), sourceRange(7, 16)),
		ep(f, 1, 8080, false), ep(f, 2, 8080, false))
	e.put(svc(f, "local", 11, 80, tcp, nodePort(30081), externalIP(3), lbVIP(4), etpLocal()),
		ep(f, 3, 8080, true), ep(f, 4, 8080, false), ep(f, 5, 8080, false))
	e.put(svc(f, "remote-only", 12, 80, tcp, nodePort(30082), lbVIP(5), etpLocal()),
		ep(f, 6, 8080, false))
	e.put(svc(f, "itp", 13, 80, tcp, itpLocal(), nodePort(30083)), ep(f, 7, 8080, true), ep(f, 8, 8080, false))
	e.put(svc(f, "sticky", 14, 80, tcp, affinity(10800), nodePort(30084), externalIP(6)),
		ep(f, 9, 8080, false), ep(f, 10, 8080, false))
	e.put(svc(f, "sticky-local", 15, 80, tcp, affinity(60), nodePort(30085), lbVIP(7), etpLocal()),
		ep(f, 11, 8080, true), ep(f, 12, 8080, false))
	e.put(svc(f, "dns", 16, 53, udp, nodePort(30053)), ep(f, 13, 5353, false))
	e.put(svc(f, "sig", 17, 3868, sctp), ep(f, 14, 3868, false))
	e.put(svc(f, "empty", 18, 80, tcp, nodePort(30099), externalIP(8)))
	e.put(svc(f, "empty-udp", 19, 53, udp))
	e.put(svc(f, "self", 20, 80, tcp), ep(f, 1, 8080, true))
}

// TestNFTCLI programs the representative state for both families into one fresh
// namespace and checks that the nft CLI can list it: a ruleset nft cannot parse
// makes every nft listing on the node abort, breaking other tools.
func TestNFTCLI(t *testing.T) {
	n := newNFTNetNS(t)
	for _, f := range family.All {
		e := newEnv(t, f)
		representative(e)
		e.b = New(f, n.nl, Options{})
		e.sync(true)
		// An incremental sync and a rebuild (the other table name) as well.
		e.put(svc(f, "late", 21, 80, tcp, nodePort(30021)), ep(f, 15, 8080, false), ep(f, 16, 8080, false), ep(f, 17, 8080, false))
		e.sync(false, svc(f, "late", 21, 80, tcp).Name)
		if res := e.sync(true); res.Repairs != 0 {
			t.Errorf("%s: full sync found %d repairs", f, res.Repairs)
		}
	}
	for _, args := range [][]string{{"list", "tables"}, {"list", "ruleset"}, {"-j", "list", "ruleset"}, {"-a", "list", "ruleset"}} {
		out, err := n.nft(args...)
		if err != nil {
			t.Errorf("nft %s: %v\n%s", strings.Join(args, " "), err, out)
			continue
		}
		if args[1] == "ruleset" && args[0] == "list" {
			t.Logf("nft list ruleset:\n%s", out)
		}
	}
}
