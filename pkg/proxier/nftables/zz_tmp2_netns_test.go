//go:build netns

package nftables

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/nft"
)

// Temporary: which rules can't nft print?
func TestTmpBisect(t *testing.T) {
	if os.Getenv("DSP_BISECT") == "" {
		t.Skip()
	}
	n := newNFTNetNS(t)
	for _, f := range family.All {
		e := newEnv(t, f)
		representative(e)
		e.b = New(f, n.nl, Options{})
		e.sync(true)
		fam := "ip"
		if f.BitLen == 128 {
			fam = "ip6"
		}
		names := []string{}
		for nm := range e.b.c.chains {
			names = append(names, nm)
		}
		slices.Sort(names)
		for _, nm := range names {
			ch := e.b.c.chains[nm]
			for i, r := range ch.Rules {
				tx := nft.NewTx(f)
				tx.SetChain(e.b.table, &nft.Chain{Name: "probe", Rules: []nft.Rule{r}})
				if err := n.nl.Apply(t.Context(), tx); err != nil {
					t.Fatalf("%s %s[%d]: %v", f, nm, i, err)
				}
				out, err := n.nft("--debug=netlink", "list", "chain", fam, e.b.table, "probe")
				status := "OK  "
				if err != nil {
					status = "FAIL"
				}
				idx := strings.Index(out, "probe ")
				if idx < 0 {
					idx = 0
				}
				fmt.Printf("%s %s %s[%d] %s\n    %s\n", status, f, nm, i, r.Comment, strings.ReplaceAll(nft.FormatRule(r), "\n", "\n    "))
				if os.Getenv("DSP_V") != "" {
					fmt.Println(out[idx:])
				}
			}
		}
		tx := nft.NewTx(f)
		tx.DeleteChain(e.b.table, "probe")
		_ = n.nl.Apply(t.Context(), tx)
	}
}
