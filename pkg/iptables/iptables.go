// Package iptables runs the iptables tools of one family: iptables-restore
// transactions for bulk changes, iptables-save to read what a table holds, and
// github.com/coreos/go-iptables for single rules in the built-in chains. It also
// turns a save into the restore input that removes every chain of a prefix with
// the rules jumping to them (Undo), which dsproxy's cleanup uses for its own
// chains and for kube-proxy's.
package iptables

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"

	goipt "github.com/coreos/go-iptables/iptables"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// Runner runs one family's iptables binaries (iptables* or ip6tables*, in the flavour
// the node's iptables command is: nft-backed or legacy).
type Runner struct {
	f   *family.Family
	ipt *goipt.IPTables
}

// New returns the runner for f. It fails when the family's iptables binary is missing.
func New(f *family.Family) (*Runner, error) {
	proto := goipt.ProtocolIPv4
	if f.BitLen == 128 {
		proto = goipt.ProtocolIPv6
	}
	ipt, err := goipt.New(goipt.IPFamily(proto))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.IPTablesCommand, err)
	}
	return &Runner{f: f, ipt: ipt}, nil
}

// Family returns the runner's family.
func (r *Runner) Family() *family.Family { return r.f }

// HasRandomFully reports whether MASQUERADE takes --random-fully.
func (r *Runner) HasRandomFully() bool { return r.ipt.HasRandomFully() }

// Restore applies data with iptables-restore --noflush: each table's section is
// one transaction, and chains the input does not declare are left alone.
func (r *Runner) Restore(ctx context.Context, data []byte) error {
	cmd := exec.CommandContext(ctx, r.f.IPTablesCommand+"-restore", "--noflush", "--wait")
	cmd.Stdin = bytes.NewReader(data)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s-restore: %w: %s", r.f.IPTablesCommand, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// Save returns iptables-save's output for table ("" for every table).
func (r *Runner) Save(ctx context.Context, table string) (string, error) {
	args := []string{}
	if table != "" {
		args = append(args, "-t", table)
	}
	cmd := exec.CommandContext(ctx, r.f.IPTablesCommand+"-save", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s-save: %w: %s", r.f.IPTablesCommand, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// EnsureRule inserts rule at the head of table's chain unless it is there already,
// and reports whether it inserted it.
func (r *Runner) EnsureRule(table, chain string, rule ...string) (bool, error) {
	ok, err := r.ipt.Exists(table, chain, rule...)
	if err != nil {
		return false, fmt.Errorf("%s -t %s -C %s: %w", r.f.IPTablesCommand, table, chain, err)
	}
	if ok {
		return false, nil
	}
	if err := r.ipt.Insert(table, chain, 1, rule...); err != nil {
		return false, fmt.Errorf("%s -t %s -I %s: %w", r.f.IPTablesCommand, table, chain, err)
	}
	return true, nil
}

// ChainExists reports whether table has chain.
func (r *Runner) ChainExists(table, chain string) (bool, error) {
	ok, err := r.ipt.ChainExists(table, chain)
	if err != nil {
		return false, fmt.Errorf("%s -t %s: listing chain %s: %w", r.f.IPTablesCommand, table, chain, err)
	}
	return ok, nil
}

// Chains returns, per table of a save, the chains whose names start with prefix.
func Chains(save, prefix string) map[string][]string {
	out := map[string][]string{}
	table := ""
	for line := range strings.SplitSeq(save, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table = strings.TrimPrefix(line, "*")
		case strings.HasPrefix(line, ":"+prefix):
			out[table] = append(out[table], strings.Fields(line[1:])[0])
		}
	}
	return out
}

// Undo turns iptables-save output into iptables-restore --noflush input that
// removes the chains whose names start with prefix: every rule that jumps to one
// from another chain is deleted, then every such chain is flushed and removed.
// Other rules and chains are left as they are. It returns "" when no chain has the
// prefix.
func Undo(save, prefix string) string {
	var out strings.Builder
	var table string
	var deletes, chains []string
	flush := func() {
		if table == "" || len(deletes)+len(chains) == 0 {
			return
		}
		fmt.Fprintf(&out, "*%s\n", table)
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
	for line := range strings.SplitSeq(save, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table, deletes, chains = strings.TrimPrefix(line, "*"), nil, nil
		case line == "COMMIT":
			flush()
			table = ""
		case strings.HasPrefix(line, ":"+prefix):
			chains = append(chains, strings.Fields(line[1:])[0])
		case strings.HasPrefix(line, "-A "):
			rule := strings.TrimPrefix(line, "-A ")
			if !strings.HasPrefix(rule, prefix) && jumpsTo(rule, prefix) {
				deletes = append(deletes, rule)
			}
		}
	}
	return out.String()
}

// jumpsTo reports whether a rule's target is a chain starting with prefix.
func jumpsTo(rule, prefix string) bool {
	f := strings.Fields(rule)
	for i := 0; i+1 < len(f); i++ {
		if (f[i] == "-j" || f[i] == "-g" || f[i] == "--jump" || f[i] == "--goto") && strings.HasPrefix(f[i+1], prefix) {
			return true
		}
	}
	return false
}
