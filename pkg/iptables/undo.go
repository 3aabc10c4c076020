package iptables

import (
	"fmt"
	"strings"
)

// Undo turns iptables-save output into iptables-restore --noflush input that
// removes the chains whose names start with prefix: every rule that jumps to one
// from another chain is deleted, then every such chain is flushed and removed.
// Other rules and chains are left as they are. It returns "" when no chain has the
// prefix. dsproxy uses it for its own chains, which no one else may use.
func Undo(save, prefix string) string {
	out, _ := undo(save, func(_, chain string) bool { return strings.HasPrefix(chain, prefix) }, false)
	return out
}

// UndoOwned is Undo for chains another program owns, which owned names by table
// ("nat", "filter", ...). Rules in built-in chains that jump to an owned chain
// are deleted and the owned chains flushed and removed, except where a third
// program's own chain jumps to an owned one: deleting that jump would change its
// rules, so that owned chain stays, with every owned chain it reaches, and kept
// names them ("table/chain"). Built-in chains are never owned. It returns ""
// when there is nothing to remove.
func UndoOwned(save string, owned func(table, chain string) bool) (out string, kept []string) {
	return undo(save, owned, true)
}

// saveTable is one table of an iptables-save output.
type saveTable struct {
	name    string
	chains  []string        // in save order
	builtin map[string]bool // chains with a policy
	rules   []saveRule
}

type saveRule struct {
	chain, spec, target string // spec: the rule without "-A "
}

// parseSave reads an iptables-save output's tables, chains and rules.
func parseSave(save string) []*saveTable {
	var tables []*saveTable
	var t *saveTable
	for line := range strings.SplitSeq(save, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			t = &saveTable{name: strings.TrimPrefix(line, "*"), builtin: map[string]bool{}}
			tables = append(tables, t)
		case t == nil:
		case line == "COMMIT":
			t = nil
		case strings.HasPrefix(line, ":"):
			f := strings.Fields(line[1:])
			if len(f) == 0 {
				continue
			}
			t.chains = append(t.chains, f[0])
			t.builtin[f[0]] = len(f) > 1 && f[1] != "-"
		case strings.HasPrefix(line, "-A "):
			spec := strings.TrimPrefix(line, "-A ")
			chain, _, _ := strings.Cut(spec, " ")
			t.rules = append(t.rules, saveRule{chain: chain, spec: spec, target: target(spec)})
		}
	}
	return tables
}

// target is the chain or target a rule jumps or goes to, "" if none.
func target(rule string) string {
	f := strings.Fields(rule)
	for i := 0; i+1 < len(f); i++ {
		switch f[i] {
		case "-j", "-g", "--jump", "--goto":
			return f[i+1]
		}
	}
	return ""
}

func undo(save string, owned func(table, chain string) bool, keepReferenced bool) (string, []string) {
	var out strings.Builder
	var kept []string
	for _, t := range parseSave(save) {
		remove := map[string]bool{}
		for _, c := range t.chains {
			if !t.builtin[c] && owned(t.name, c) {
				remove[c] = true
			}
		}
		if keepReferenced {
			// Owned chains a foreign user-defined chain reaches stay, with
			// everything they reach in turn, until nothing changes.
			keep := map[string]bool{}
			for changed := true; changed; {
				changed = false
				for _, r := range t.rules {
					foreign := !t.builtin[r.chain] && !remove[r.chain]
					if (foreign || keep[r.chain]) && remove[r.target] {
						delete(remove, r.target)
						keep[r.target] = true
						changed = true
					}
				}
			}
			for _, c := range t.chains {
				if keep[c] {
					kept = append(kept, t.name+"/"+c)
				}
			}
		}
		var deletes, chains []string
		for _, r := range t.rules {
			if !remove[r.chain] && remove[r.target] {
				deletes = append(deletes, r.spec)
			}
		}
		for _, c := range t.chains {
			if remove[c] {
				chains = append(chains, c)
			}
		}
		if len(deletes)+len(chains) == 0 {
			continue
		}
		fmt.Fprintf(&out, "*%s\n", t.name)
		for _, d := range deletes {
			fmt.Fprintf(&out, "-D %s\n", d)
		}
		for _, c := range chains {
			fmt.Fprintf(&out, "-F %s\n", c)
		}
		for _, c := range chains {
			fmt.Fprintf(&out, "-X %s\n", c)
		}
		out.WriteString("COMMIT\n")
	}
	return out.String(), kept
}
