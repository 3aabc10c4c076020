//go:build netns

package nftables

import (
	"os"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/nft"
)

// Temporary: programs the representative state into the named netns $DSP_NS.
func TestTmpProgramNamed(t *testing.T) {
	name := os.Getenv("DSP_NS")
	if name == "" {
		t.Skip()
	}
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	nl, err := nft.NewNetlink(nft.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	for _, f := range family.All {
		if os.Getenv("DSP_FAM") != "" && os.Getenv("DSP_FAM") != f.Name {
			continue
		}
		e := newEnv(t, f)
		representative(e)
		e.b = New(f, nl, Options{})
		e.sync(true)
	}
}
