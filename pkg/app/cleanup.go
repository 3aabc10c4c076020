package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/config"
	"github.com/dsproxy/dsproxy/pkg/family"
	ipt "github.com/dsproxy/dsproxy/pkg/iptables"
	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/proxier/iptables"
	"github.com/dsproxy/dsproxy/pkg/proxier/nftables"
)

// KubeProxyTable is the nftables table kube-proxy's nftables mode owns in the ip and
// ip6 families.
const KubeProxyTable = "kube-proxy"

// Cleanup removes everything dsproxy created in both families and both of its
// modes (its nftables tables, its DSPROXY- iptables chains), and with kubeProxy
// also kube-proxy's state from either of its modes: its nftables tables and its
// iptables KUBE- chains and the rules jumping to them. Missing state is not an
// error.
func Cleanup(ctx context.Context, kubeProxy bool) error {
	k, err := nft.NewNetlink()
	if err != nil {
		return fmt.Errorf("cleanup: opening netlink: %w", err)
	}
	defer k.Close()
	var errs []error
	for _, f := range family.All {
		if err := nftables.New(f, k, nftables.Options{}).Cleanup(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f, err))
		}
		if err := cleanupIPTablesMode(ctx, f); err != nil {
			errs = append(errs, err)
		}
		if kubeProxy {
			tx := nft.NewTx(f)
			tx.DeleteTable(KubeProxyTable)
			if err := k.Apply(ctx, tx); err != nil {
				errs = append(errs, fmt.Errorf("%s: deleting kube-proxy's table: %w", f, err))
			}
		}
		klog.InfoS("Cleaned up", "ipFamily", f.Name, "kubeProxy", kubeProxy)
	}
	if kubeProxy {
		if err := cleanupKubeProxyIPTables(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cleanupIPTablesMode removes the DSPROXY- chains of f's iptables mode from the
// tables of the given flavours (none given: the nf_tables-backed and the legacy
// ones, or those of the plain iptables binaries where neither is installed by
// name). A flavour without binaries has none; that is not an error.
func cleanupIPTablesMode(ctx context.Context, f *family.Family, flavors ...ipt.Flavor) error {
	all := len(flavors) == 0
	if all {
		flavors = []ipt.Flavor{ipt.FlavorNFT, ipt.FlavorLegacy, ipt.FlavorDefault}
	}
	var errs []error
	found := false
	for _, fl := range flavors {
		if all && fl == ipt.FlavorDefault && found {
			break
		}
		r, err := ipt.New(f, fl)
		if err != nil {
			klog.V(2).InfoS("No iptables of this flavour; nothing of it to remove", "ipFamily", f.Name, "flavour", fl, "err", err)
			continue
		}
		found = true
		b, err := iptables.New(f, r, iptables.Options{})
		if err != nil {
			return err
		}
		if err := b.Cleanup(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: iptables mode (%s): %w", f, cmp.Or(string(fl), "default"), err))
		}
	}
	return errors.Join(errs...)
}

// cleanupOtherMode removes, in every family, what dsproxy's other mode left in the
// kernel: the DSPROXY- iptables chains when mode is nftables; in iptables mode
// the dsproxy nftables tables, and the DSPROXY- chains of the iptables flavour
// not in use (inUse, resolved to nft or legacy; nothing when it is unknown), which
// a restart that detected the other flavour leaves hooked. kube-proxy's
// platformCleanup does the same for its own modes as it starts; the daemon does
// it once every family it proxies has been programmed, so that the old rules
// serve new connections until the new ones do. Connections they translated keep
// their conntrack entries. k is the nftables connection to use.
func cleanupOtherMode(ctx context.Context, mode config.ProxyMode, inUse ipt.Flavor, k nft.Kernel) error {
	var errs []error
	switch mode {
	case config.ModeIPTables:
		for _, f := range family.All {
			if err := nftables.New(f, k, nftables.Options{}).Cleanup(ctx); err != nil {
				errs = append(errs, fmt.Errorf("%s: nftables mode: %w", f, err))
			}
			switch inUse {
			case ipt.FlavorNFT:
				errs = append(errs, cleanupIPTablesMode(ctx, f, ipt.FlavorLegacy))
			case ipt.FlavorLegacy:
				errs = append(errs, cleanupIPTablesMode(ctx, f, ipt.FlavorNFT))
			}
		}
	case config.ModeNFTables:
		for _, f := range family.All {
			errs = append(errs, cleanupIPTablesMode(ctx, f))
		}
	}
	return errors.Join(errs...)
}
