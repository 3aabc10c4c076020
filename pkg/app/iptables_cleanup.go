package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"

	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/iptables"
)

// kubeProxyChains are the chains kube-proxy v1.36's own cleanup removes, for
// its iptables and IPVS modes, by table. Other KUBE- chains are not
// kube-proxy's and stay: the kubelet's KUBE-FIREWALL (which kube-proxy's
// iptables mode also creates, and leaves), KUBE-KUBELET-CANARY and
// KUBE-IPTABLES-HINT (which dsproxy's and kube-proxy's flavour detection read),
// and other programs' such as kube-router's KUBE-ROUTER-* and KUBE-NWPLCY-*.
var kubeProxyChains = map[string][]string{
	"nat": {"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ", "KUBE-PROXY-CANARY",
		"KUBE-NODE-PORT", "KUBE-LOAD-BALANCER"},
	"filter": {"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL", "KUBE-PROXY-CANARY",
		"KUBE-NODE-PORT", "KUBE-SOURCE-RANGES-FIREWALL", "KUBE-IPVS-FILTER", "KUBE-IPVS-OUT-FILTER"},
	"mangle": {"KUBE-PROXY-CANARY"},
}

// kubeProxyNATChainPrefixes name kube-proxy's per-Service and per-endpoint nat
// chains; KUBE-XLB- is from kube-proxy before v1.25, whose leftovers v1.36's
// cleanup no longer knows.
var kubeProxyNATChainPrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-", "KUBE-XLB-"}

// kubeProxyChain reports whether chain in table is kube-proxy's.
func kubeProxyChain(table, chain string) bool {
	if slices.Contains(kubeProxyChains[table], chain) {
		return true
	}
	return table == "nat" && slices.ContainsFunc(kubeProxyNATChainPrefixes, func(p string) bool { return strings.HasPrefix(chain, p) })
}

// command runs an iptables binary; tests wrap it to run inside a network namespace.
var command = exec.CommandContext

// kubeProxyIPTablesBinaries are the iptables binaries cleanupKubeProxyIPTables
// uses, per family: the nft-backed and the legacy ones where installed by name,
// else the plain ones (iptables before 1.8, minimal builds), which kube-proxy's
// own cleanup uses.
func kubeProxyIPTablesBinaries() []string {
	var out []string
	for _, base := range []string{"iptables", "ip6tables"} {
		var named []string
		for _, bin := range []string{base + "-nft", base + "-legacy"} {
			if _, err := exec.LookPath(bin + "-save"); err == nil {
				named = append(named, bin)
			}
		}
		if len(named) == 0 {
			if _, err := exec.LookPath(base + "-save"); err == nil {
				named = []string{base}
			}
		}
		out = append(out, named...)
	}
	return out
}

// cleanupKubeProxyIPTables removes kube-proxy's chains (kubeProxyChain) and the
// rules jumping to them with every iptables flavour present on the node
// (kubeProxyIPTablesBinaries, both families). A chain of kube-proxy's that
// another program's chain jumps to stays, logged. A node without iptables
// binaries has nothing to clean; that is logged, not an error.
func cleanupKubeProxyIPTables(ctx context.Context) error {
	var errs []error
	found := false
	for _, bin := range kubeProxyIPTablesBinaries() {
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
		undo, kept := iptables.UndoOwned(string(out), kubeProxyChain)
		if len(kept) > 0 {
			klog.InfoS("Left kube-proxy's iptables chains that another program's rules jump to", "iptables", bin, "chains", kept)
		}
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
