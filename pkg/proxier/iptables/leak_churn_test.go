package iptables

import (
	"fmt"
	"testing"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// TestLeakChurnIPTablesWritten: rounds of ports added, changed and deleted leave
// the backend's record of written chains, rules and dispatch counts as before.
func TestLeakChurnIPTablesWritten(t *testing.T) {
	for _, f := range family.All {
		b, _ := newBackend(t, f)
		st := model.NewState()
		n := node(f)
		sync(t, b, &proxier.SyncRequest{Full: true, State: st, Node: n, NodeChanged: true})
		base := fmt.Sprintf("chains=%d rules=%d sum=%d dispatch=%d count=%d", len(b.p.chains), len(b.p.rules), b.p.ruleSum, len(b.p.dispatch), countRules(b.p.count))
		for round := 0; round < 3; round++ {
			var names []model.ServicePortName
			for i := 0; i < 30; i++ {
				ps := port(f, fmt.Sprintf("s%d-%d", round, i), 10+i, 1+i%7, 2+i%7)
				ps.NodePort = uint16(30000 + i)
				ps.AffinitySeconds = uint32(i % 2 * 100)
				st.Ports[ps.Name] = ps
				names = append(names, ps.Name)
			}
			sync(t, b, &proxier.SyncRequest{State: st, Node: n, Changed: names})
			for i, nm := range names {
				st.Ports[nm] = port(f, nm.Name, 10+i, 3+i%5)
			}
			sync(t, b, &proxier.SyncRequest{State: st, Node: n, Changed: names})
			for _, nm := range names {
				delete(st.Ports, nm)
			}
			sync(t, b, &proxier.SyncRequest{State: st, Node: n, Changed: names})
			got := fmt.Sprintf("chains=%d rules=%d sum=%d dispatch=%d count=%d", len(b.p.chains), len(b.p.rules), b.p.ruleSum, len(b.p.dispatch), countRules(b.p.count))
			if got != base {
				t.Errorf("%s round %d: %s, baseline %s", f, round, got, base)
			}
		}
	}
}

func countRules(c map[string]map[string]int) int {
	n := 0
	for _, m := range c {
		n += len(m)
	}
	return n
}
