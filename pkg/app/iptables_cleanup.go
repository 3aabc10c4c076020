package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/iptables"
)

// kubeProxyChainPrefix names the chains kube-proxy's iptables mode creates.
const kubeProxyChainPrefix = "KUBE-"

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
		undo := iptables.Undo(string(out), kubeProxyChainPrefix)
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
