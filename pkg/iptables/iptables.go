// Package iptables runs the iptables tools of one family: iptables-restore
// transactions for bulk changes, iptables-save to read what a table holds, and
// github.com/coreos/go-iptables for single rules in the built-in chains. It also
// turns a save into the restore input that removes chains with the rules jumping
// to them: every chain of a prefix (Undo), which dsproxy's cleanup uses for its
// own chains, or the chains another program owns (UndoOwned), for kube-proxy's.
package iptables

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"time"

	goipt "github.com/coreos/go-iptables/iptables"

	"github.com/dsproxy/dsproxy/pkg/family"
)

// Flavor is which iptables binaries a Runner runs.
type Flavor string

// The flavours: the node's "iptables" as it is (Debian's alternatives choose), or
// explicitly the nf_tables-backed or the legacy (x_tables) binaries.
const (
	FlavorDefault Flavor = ""
	FlavorNFT     Flavor = "nft"
	FlavorLegacy  Flavor = "legacy"
)

// Runner runs one family's iptables binaries (iptables* or ip6tables*) of one
// flavour.
type Runner struct {
	f      *family.Family
	flavor Flavor
	// kernel is the flavour the binaries are (Resolve): how RuleCounts reads.
	kernel Flavor
	ipt    *goipt.IPTables
}

// New returns the runner for f. It fails when the family's binary of that flavour
// is missing.
func New(f *family.Family, flavor Flavor) (*Runner, error) {
	r := &Runner{f: f, flavor: flavor}
	proto := goipt.ProtocolIPv4
	if f.BitLen == 128 {
		proto = goipt.ProtocolIPv6
	}
	var ipt *goipt.IPTables
	var err error
	if flavor == FlavorDefault {
		ipt, err = goipt.New(goipt.IPFamily(proto))
	} else {
		var path string
		if path, err = exec.LookPath(r.command("")); err != nil {
			return nil, err
		}
		ipt, err = goipt.New(goipt.IPFamily(proto), goipt.Path(path))
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.command(""), err)
	}
	r.ipt = ipt
	r.kernel = Resolve(context.Background(), f, flavor)
	return r, nil
}

// command names the flavour's binary of the family: "ip6tables-legacy" + suffix.
func (r *Runner) command(suffix string) string {
	c := r.f.IPTablesCommand
	if r.flavor != FlavorDefault {
		c += "-" + string(r.flavor)
	}
	return c + suffix
}

// Family returns the runner's family.
func (r *Runner) Family() *family.Family { return r.f }

// Flavor returns the runner's flavour.
func (r *Runner) Flavor() Flavor { return r.flavor }

// HasRandomFully reports whether MASQUERADE takes --random-fully.
func (r *Runner) HasRandomFully() bool { return r.ipt.HasRandomFully() }

// Restore applies data with iptables-restore --noflush: each table's section is
// one transaction, and chains the input does not declare are left alone.
func (r *Runner) Restore(ctx context.Context, data []byte) error {
	cmd := exec.CommandContext(ctx, r.command("-restore"), "--noflush", "--wait")
	cmd.Stdin = bytes.NewReader(data)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", r.command("-restore"), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// Save returns iptables-save's output for table ("" for every table).
func (r *Runner) Save(ctx context.Context, table string) (string, error) {
	args := []string{}
	if table != "" {
		args = append(args, "-t", table)
	}
	cmd := exec.CommandContext(ctx, r.command("-save"), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: %w: %s", r.command("-save"), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// EnsureRule inserts rule at the head of table's chain unless it is there already,
// and reports whether it inserted it.
func (r *Runner) EnsureRule(table, chain string, rule ...string) (bool, error) {
	ok, err := r.ipt.Exists(table, chain, rule...)
	if err != nil {
		return false, fmt.Errorf("%s -t %s -C %s: %w", r.command(""), table, chain, err)
	}
	if ok {
		return false, nil
	}
	if err := r.ipt.Insert(table, chain, 1, rule...); err != nil {
		return false, fmt.Errorf("%s -t %s -I %s: %w", r.command(""), table, chain, err)
	}
	return true, nil
}

// ChainExists reports whether table has chain.
func (r *Runner) ChainExists(table, chain string) (bool, error) {
	ok, err := r.ipt.ChainExists(table, chain)
	if err != nil {
		return false, fmt.Errorf("%s -t %s: listing chain %s: %w", r.command(""), table, chain, err)
	}
	return ok, nil
}

// RuleCounts returns how many rules each of chains holds in table; a chain
// the table lacks is not in the map. The nf_tables binaries list each chain,
// which reads only that chain from the kernel; the legacy ones read the whole
// table for any listing, so there (and when the flavour is not known) it reads
// one save of the table instead.
func (r *Runner) RuleCounts(ctx context.Context, table string, chains []string) (map[string]int, error) {
	if r.kernel != FlavorNFT {
		return r.countSaved(ctx, table, chains)
	}
	out := make(map[string]int, len(chains))
	for _, ch := range chains {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		lines, err := r.ipt.List(table, ch)
		if missing(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s -t %s -S %s: %w", r.command(""), table, ch, err)
		}
		n := 0
		for _, l := range lines {
			if strings.HasPrefix(l, "-A ") {
				n++
			}
		}
		out[ch] = n
	}
	return out, nil
}

// countSaved counts chains' rules in a save of table read as it streams (a
// legacy nat table at 10k Services saves to about 15 MB).
func (r *Runner) countSaved(ctx context.Context, table string, chains []string) (map[string]int, error) {
	cmd := exec.CommandContext(ctx, r.command("-save"), "-t", table)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", r.command("-save"), err)
	}
	out, rerr := countRules(stdout, table, chains)
	if rerr != nil {
		_, _ = io.Copy(io.Discard, stdout)
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("%s: %w: %s", r.command("-save"), err, strings.TrimSpace(stderr.String()))
	}
	if rerr != nil {
		return nil, fmt.Errorf("%s: %w", r.command("-save"), rerr)
	}
	return out, nil
}

// missing reports whether err is a listing's for a chain that does not exist.
// iptables-nft 1.8.9 calls a missing chain "incompatible" (as it does one nft
// wrote with expressions iptables cannot show, which is not the iptables
// chain it is asked for either).
func missing(err error) bool {
	e := (*goipt.Error)(nil)
	return errors.As(err, &e) && (e.IsNotExist() || strings.Contains(e.Error(), "is incompatible, use 'nft' tool"))
}

// CountRules returns how many rules each of chains holds in table's section of
// a save; a chain the section does not declare is not in the map.
func CountRules(save, table string, chains []string) map[string]int {
	// Only a line past the scanner's 1 MiB would end the read early; a save's
	// longest (a comment is at most 256 characters) is far from it.
	out, _ := countRules(strings.NewReader(save), table, chains)
	return out
}

func countRules(r io.Reader, table string, chains []string) (map[string]int, error) {
	want := make(map[string]bool, len(chains))
	for _, ch := range chains {
		want[ch] = true
	}
	out := make(map[string]int, len(chains))
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	in := ""
	for sc.Scan() {
		line := sc.Bytes()
		switch {
		case bytes.HasPrefix(line, []byte("*")):
			in = string(line[1:])
		case in != table:
		case bytes.HasPrefix(line, []byte(":")):
			if ch, _, _ := bytes.Cut(line[1:], []byte(" ")); want[string(ch)] {
				if _, ok := out[string(ch)]; !ok { // declared: present, perhaps empty
					out[string(ch)] = 0
				}
			}
		case bytes.HasPrefix(line, []byte("-A ")):
			if ch, _, _ := bytes.Cut(line[3:], []byte(" ")); want[string(ch)] {
				out[string(ch)]++
			}
		}
	}
	return out, sc.Err()
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

// hintChains are the chains whose presence in a flavour's mangle table says the
// node's kubelet (or a kube-proxy) uses that flavour: what kube-proxy's image's
// iptables-wrapper looks for.
var hintChains = []string{"KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"}

// Detect chooses the flavour the rest of the node uses, as kube-proxy's image's
// iptables-wrapper does: the one whose mangle table holds the kubelet's hint
// chains, else the one with more rules (dsproxy's own not counted), else the
// default. Like the wrapper it reads each flavour with a whole save and never
// names a table: naming one (-t mangle) makes the legacy kernel module create it
// on a node that does not use legacy iptables. save runs a flavour's save command
// for a family (nil: run it, for at most 5 seconds); a flavour whose binaries are
// missing counts as empty.
func Detect(ctx context.Context, save func(ctx context.Context, cmd string, args ...string) (string, error)) (Flavor, string) {
	if save == nil {
		save = func(ctx context.Context, cmd string, args ...string) (string, error) {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, cmd, args...).Output()
			return string(out), err
		}
	}
	hints, rules := map[Flavor]bool{}, map[Flavor]int{}
	for _, fl := range []Flavor{FlavorLegacy, FlavorNFT} {
		for _, f := range family.All {
			r := &Runner{f: f, flavor: fl}
			out, err := save(ctx, r.command("-save"))
			if err != nil {
				continue
			}
			table := ""
			for line := range strings.SplitSeq(out, "\n") {
				switch {
				case strings.HasPrefix(line, "*"):
					table = line[1:]
				case table == "mangle" && strings.HasPrefix(line, ":") && slices.Contains(hintChains, strings.Fields(line[1:])[0]):
					hints[fl] = true
				case strings.HasPrefix(line, "-A ") && !strings.Contains(line, Prefix):
					rules[fl]++
				}
			}
		}
	}
	switch {
	case hints[FlavorLegacy] && !hints[FlavorNFT]:
		return FlavorLegacy, "the kubelet's hint chains are in the legacy tables"
	case hints[FlavorNFT] && !hints[FlavorLegacy]:
		return FlavorNFT, "the kubelet's hint chains are in the nf_tables tables"
	case rules[FlavorLegacy] > rules[FlavorNFT]:
		return FlavorLegacy, fmt.Sprintf("the legacy tables hold more rules (%d against %d)", rules[FlavorLegacy], rules[FlavorNFT])
	case rules[FlavorNFT] > rules[FlavorLegacy]:
		return FlavorNFT, fmt.Sprintf("the nf_tables tables hold more rules (%d against %d)", rules[FlavorNFT], rules[FlavorLegacy])
	}
	return FlavorDefault, "no hint chains and no rules in either flavour"
}

// Resolve names the flavour f's binaries of flavour fl are: fl itself, or for
// the default the one its --version reports ("(nf_tables)" or "(legacy)");
// FlavorDefault when that cannot be told.
func Resolve(ctx context.Context, f *family.Family, fl Flavor) Flavor {
	if fl != FlavorDefault {
		return fl
	}
	out, err := exec.CommandContext(ctx, f.IPTablesCommand, "--version").Output()
	switch {
	case err != nil:
		return FlavorDefault
	case strings.Contains(string(out), "(nf_tables)"):
		return FlavorNFT
	case strings.Contains(string(out), "(legacy)"):
		return FlavorLegacy
	}
	return FlavorDefault
}

// Prefix is what dsproxy's chains are named with; Detect does not count its rules.
const Prefix = "DSPROXY-"
