package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"

	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/config"
	"github.com/dsproxy/dsproxy/pkg/family"
	ipt "github.com/dsproxy/dsproxy/pkg/iptables"
	"github.com/dsproxy/dsproxy/pkg/ipvs"
	"github.com/dsproxy/dsproxy/pkg/nft"
	"github.com/dsproxy/dsproxy/pkg/proxier/iptables"
	ipvsbackend "github.com/dsproxy/dsproxy/pkg/proxier/ipvs"
	"github.com/dsproxy/dsproxy/pkg/proxier/nftables"
)

// KubeProxyTable is the nftables table kube-proxy's nftables mode owns in the ip and
// ip6 families.
const KubeProxyTable = "kube-proxy"

// Cleanup removes everything dsproxy created in both families and all of its
// modes (its nftables tables, its DSPROXY- iptables chains, its IPVS mode's
// virtual servers, dsproxy-ipvs0, ipsets and DSIPVS- chains), and with kubeProxy
// also kube-proxy's state from any of its modes: its nftables tables, its
// iptables chains (kubeProxyChain) and the rules jumping to them, and its IPVS
// mode's virtual servers (every one outside ipvsExclude, --ipvs-exclude-cidrs,
// which kube-proxy's own cleanup removes too: it flushes IPVS), kube-ipvs0 and
// its ipsets (kubeProxyIPSet).
// Missing state is not an error.
func Cleanup(ctx context.Context, kubeProxy bool, ipvsExclude []string) error {
	exclude := excludeCIDRs(ipvsExclude)
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
		if err := cleanupIPVSMode(ctx, f); err != nil {
			errs = append(errs, err)
		}
		klog.InfoS("Cleaned up", "ipFamily", f.Name)
	}
	if kubeProxy {
		errs = append(errs, cleanupKubeProxy(ctx, k, ipvsScope{exclude: exclude}))
	}
	return errors.Join(errs...)
}

// cleanupKubeProxy removes kube-proxy's state in all of its modes: its nftables
// tables, its iptables chains and the rules jumping to them, and its IPVS mode's
// kube-ipvs0 link, ipsets and the virtual servers scope selects. Only what
// kube-proxy itself creates goes: the kubelet's and other programs' KUBE-
// chains and ipsets stay.
// Missing state is not an error.
func cleanupKubeProxy(ctx context.Context, k nft.Kernel, scope ipvsScope) error {
	var errs []error
	for _, f := range family.All {
		tx := nft.NewTx(f)
		tx.DeleteTable(KubeProxyTable)
		if err := k.Apply(ctx, tx); err != nil {
			errs = append(errs, fmt.Errorf("%s: deleting kube-proxy's table: %w", f, err))
		}
	}
	errs = append(errs, cleanupKubeProxyIPTables(ctx), cleanupKubeProxyIPVS(ctx, scope))
	err := errors.Join(errs...)
	klog.InfoS("Removed kube-proxy's state", "errors", err != nil)
	return err
}

// excludeCIDRs parses --ipvs-exclude-cidrs (ipvs.excludeCIDRs). The
// configuration is validated only in IPVS mode, as kube-proxy validates it; in
// the other modes, where only --cleanup-kube-proxy reads it, an entry that is no
// CIDR is logged and left out, as kube-proxy ignores the field there.
func excludeCIDRs(cidrs []string) []netip.Prefix {
	var out []netip.Prefix
	for _, c := range cidrs {
		p, err := config.ParseCIDR(c)
		if err != nil {
			klog.ErrorS(err, "Ignoring an --ipvs-exclude-cidrs entry that is not a CIDR", "entry", c)
			continue
		}
		out = append(out, p)
	}
	return out
}

// cleanupIPTablesMode removes the DSPROXY- chains of f's iptables mode from the
// tables of the given flavours (none given: the nf_tables-backed and the legacy
// ones, or those of the plain iptables binaries where neither is installed by
// name). A flavour without binaries has none; that is not an error.
func cleanupIPTablesMode(ctx context.Context, f *family.Family, flavors ...ipt.Flavor) error {
	return forFlavors(f, flavors, func(r *ipt.Runner) error {
		b, err := iptables.New(f, r, iptables.Options{})
		if err != nil {
			return err
		}
		return b.Cleanup(ctx)
	})
}

// cleanupIPVSChains removes only the DSIPVS- chains of f's IPVS mode from the
// given flavours' tables (as cleanupIPTablesMode), leaving IPVS itself alone.
func cleanupIPVSChains(ctx context.Context, f *family.Family, flavors ...ipt.Flavor) error {
	return forFlavors(f, flavors, func(r *ipt.Runner) error {
		save, err := r.Save(ctx, "")
		if err != nil {
			return err
		}
		if undo := ipt.Undo(save, ipvsbackend.Prefix); undo != "" {
			return r.Restore(ctx, []byte(undo))
		}
		return nil
	})
}

// cleanupIPVSMode removes everything of f's IPVS mode: its virtual servers,
// its addresses on dsproxy-ipvs0 (and the link once no family has any), its
// ipsets, and its DSIPVS- chains in every flavour's tables. It loads neither
// IPVS nor ipset where they are not loaded (then nothing of them can be left).
func cleanupIPVSMode(ctx context.Context, f *family.Family) error {
	k, err := ipvs.Open(f, "", false)
	if err != nil {
		return fmt.Errorf("%s: ipvs mode: %w", f, err)
	}
	defer k.Close()
	ran := false
	err = forFlavors(f, nil, func(r *ipt.Runner) error {
		ran = true
		return ipvsbackend.New(f, k, r, ipvsbackend.Options{}).Cleanup(ctx)
	})
	if !ran {
		err = ipvsbackend.New(f, k, noIPTables{}, ipvsbackend.Options{}).Cleanup(ctx)
	}
	return err
}

// noIPTables is the iptables of a node that has none: nothing to save or restore.
type noIPTables struct{}

func (noIPTables) Restore(context.Context, []byte) error        { return errors.New("no iptables binaries") }
func (noIPTables) Save(context.Context, string) (string, error) { return "", nil }
func (noIPTables) EnsureRule(string, string, ...string) (bool, error) {
	return false, errors.New("no iptables binaries")
}
func (noIPTables) ChainExists(string, string) (bool, error) { return false, nil }
func (noIPTables) HasRandomFully() bool                     { return false }

// forFlavors runs fn with f's runner of each flavour in flavors (none: the
// nf_tables-backed and the legacy ones, or the plain iptables binaries where
// neither is installed by name), skipping flavours without binaries.
func forFlavors(f *family.Family, flavors []ipt.Flavor, fn func(r *ipt.Runner) error) error {
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
		if err := fn(r); err != nil {
			errs = append(errs, fmt.Errorf("%s: iptables (%s): %w", f, cmp.Or(string(fl), "default"), err))
		}
	}
	return errors.Join(errs...)
}

// cleanupOtherMode removes, in every family, what dsproxy's other modes left in
// the kernel: in nftables mode the DSPROXY- iptables chains and everything of
// the IPVS mode; in iptables mode the dsproxy nftables tables, the IPVS mode's
// state, and the DSPROXY- chains of the iptables flavour not in use (inUse,
// resolved to nft or legacy; nothing when it is unknown), which a restart that
// detected the other flavour leaves hooked; in IPVS mode the nftables tables,
// the iptables mode's chains, and the DSIPVS- chains of the other flavour.
// kube-proxy's platformCleanup does the same for its own modes as it starts; the
// daemon does it once every family it proxies has been programmed, so that the
// old rules serve new connections until the new ones do. Connections they
// translated keep their conntrack entries. k is the nftables connection to use.
func cleanupOtherMode(ctx context.Context, mode config.ProxyMode, inUse ipt.Flavor, k nft.Kernel) error {
	var errs []error
	other := ipt.Flavor("")
	switch inUse {
	case ipt.FlavorNFT:
		other = ipt.FlavorLegacy
	case ipt.FlavorLegacy:
		other = ipt.FlavorNFT
	}
	// Leaving IPVS mode, its Service addresses go first, in both families (see
	// ipvsbackend.UnbindAddrs), then the rest of its state.
	if mode != config.ModeIPVS {
		for _, f := range family.All {
			k, err := ipvs.Open(f, "", false)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: ipvs mode: %w", f, err))
				continue
			}
			_, err = ipvsbackend.UnbindAddrs(k)
			k.Close()
			errs = append(errs, err)
		}
		for _, f := range family.All {
			errs = append(errs, cleanupIPVSMode(ctx, f))
		}
	}
	for _, f := range family.All {
		if mode != config.ModeNFTables {
			if err := nftables.New(f, k, nftables.Options{}).Cleanup(ctx); err != nil {
				errs = append(errs, fmt.Errorf("%s: nftables mode: %w", f, err))
			}
		}
		switch mode {
		case config.ModeIPTables:
			if other != "" {
				errs = append(errs, cleanupIPTablesMode(ctx, f, other))
			}
		case config.ModeNFTables:
			errs = append(errs, cleanupIPTablesMode(ctx, f))
		case config.ModeIPVS:
			errs = append(errs, cleanupIPTablesMode(ctx, f))
			if other != "" {
				errs = append(errs, cleanupIPVSChains(ctx, f, other))
			}
		}
	}
	return errors.Join(errs...)
}
