package app

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/proxier/nftables"
)

// KubeProxyTable is the nftables table kube-proxy's nftables mode owns in the ip and
// ip6 families.
const KubeProxyTable = "kube-proxy"

// Cleanup removes everything dsproxy created in both families, and with kubeProxy
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
