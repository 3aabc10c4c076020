package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"k8s.io/klog/v2"
)

// kubeProxyChainPrefix names the chains kube-proxy's iptables mode creates.
const kubeProxyChainPrefix = "KUBE-"

// kubeProxyUndo turns iptables-save output into iptables-restore --noflush input
// that removes kube-proxy's iptables-mode state: every rule that jumps to a KUBE-
// chain from another chain is deleted, then every KUBE- chain is flushed and
// removed. Other rules and chains are left as they are. It returns "" when there is
// nothing of kube-proxy's.
func kubeProxyUndo(save string) string {
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
	for _, line := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table, deletes, chains = strings.TrimPrefix(line, "*"), nil, nil
		case line == "COMMIT":
			flush()
			table = ""
		case strings.HasPrefix(line, ":"+kubeProxyChainPrefix):
			chains = append(chains, strings.Fields(line[1:])[0])
		case strings.HasPrefix(line, "-A "):
			rule := strings.TrimPrefix(line, "-A ")
			if !strings.HasPrefix(rule, kubeProxyChainPrefix) && jumpsToKubeChain(rule) {
				deletes = append(deletes, rule)
			}
		}
	}
	return out.String()
}

func jumpsToKubeChain(rule string) bool {
	f := strings.Fields(rule)
	for i := 0; i+1 < len(f); i++ {
		if (f[i] == "-j" || f[i] == "-g" || f[i] == "--jump" || f[i] == "--goto") && strings.HasPrefix(f[i+1], kubeProxyChainPrefix) {
			return true
		}
	}
	return false
}

// command runs an iptables binary; tests wrap it to run inside a network namespace.
var command = exec.CommandContext

// cleanupKubeProxyIPTables removes kube-proxy's iptables-mode chains with every
// iptables flavour present on the node (nft-backed and legacy, both families). A
// node without iptables binaries has nothing to clean; that is logged, not an error.
func cleanupKubeProxyIPTables(ctx context.Context) error {
	var errs []error
	found := false
	for _, bin := range []string{"iptables-nft", "ip6tables-nft", "iptables-legacy", "ip6tables-legacy"} {
		save, err := exec.LookPath(bin + "-save")
		if err != nil {
			continue
		}
		found = true
		out, err := command(ctx, save).Output()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s-save: %w", bin, err))
			continue
		}
		undo := kubeProxyUndo(string(out))
		if undo == "" {
			continue
		}
		restore := command(ctx, bin+"-restore", "--noflush")
		restore.Stdin = strings.NewReader(undo)
		var stderr bytes.Buffer
		restore.Stderr = &stderr
		if err := restore.Run(); err != nil {
			errs = append(errs, fmt.Errorf("%s-restore: %w: %s", bin, err, strings.TrimSpace(stderr.String())))
			continue
		}
		klog.InfoS("Removed kube-proxy's iptables rules", "iptables", bin)
	}
	if !found {
		klog.InfoS("No iptables binaries on this node; no kube-proxy iptables rules to remove")
	}
	return errors.Join(errs...)
}
