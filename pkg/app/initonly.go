package app

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"

	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/config"
	"github.com/dsproxy/dsproxy/pkg/conntrack"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/ipvs"
	"github.com/dsproxy/dsproxy/pkg/nodeport"
	"github.com/dsproxy/dsproxy/pkg/proxier/iptables"
	ipvsbackend "github.com/dsproxy/dsproxy/pkg/proxier/ipvs"
)

// InitOnly is kube-proxy's --init-only: it does the setup that needs full root
// privileges, so that dsproxy can then run with only CAP_NET_ADMIN (an init
// container runs it, the proxy's container runs without privileges). It programs
// no rule and, unlike kube-proxy, does not contact the API server: nothing it
// does depends on the cluster. The setup:
//   - the conntrack sysctls (--conntrack-*); outside the machine's initial
//     network namespace only the per-namespace ones (conntrackSysctls);
//   - iptables mode, when IPv4 NodePorts answer on 127.0.0.1 (the default):
//     net.ipv4.conf.all.route_localnet=1;
//   - IPVS mode: loading IPVS, its sysctls (with --ipvs-strict-arp the ARP
//     ones) and its timeouts (--ipvs-*-timeout).
//
// A running dsproxy logs such failures and serves anyway; InitOnly returns them,
// so an init container that cannot do its one job fails. The IPVS timeouts are
// the exception, logged as kube-proxy's --init-only logs them: the proxy sets
// them again when it starts.
func InitOnly(cfg *config.Config) error {
	var errs []error
	if err := conntrackSysctls(cfg, conntrack.HostSysFS).Apply(conntrack.HostSysFS, conntrack.HostSysFS.NumCPU()); err != nil {
		errs = append(errs, fmt.Errorf("conntrack sysctls: %w", err))
	}
	switch cfg.ProxyMode {
	case config.ModeIPTables:
		on, err := localhostNodePorts(cfg)
		if err != nil {
			errs = append(errs, err)
		} else if on {
			if err := iptables.EnableRouteLocalnet(family.IPv4); err != nil {
				errs = append(errs, fmt.Errorf("localhost NodePorts: %w", err))
			}
		}
	case config.ModeIPVS:
		// One IPVS serves both families, and IPv4's sysctls include IPv6's.
		if k, err := ipvs.Open(family.IPv4, "", true); err != nil { // loads the ip_vs modules
			errs = append(errs, fmt.Errorf("ipvs mode: %w", err))
		} else {
			setIPVSTimeouts(k, cfg)
			k.Close()
			for _, s := range ipvsbackend.Sysctls(family.IPv4, cfg.IPVS.StrictARP) {
				errs = append(errs, ipvs.SetSysctl(s[0], s[1]))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("--init-only: %w", err)
	}
	klog.InfoS("System initialized and --init-only specified", "mode", cfg.ProxyMode)
	return nil
}

// localhostNodePorts reports whether the iptables mode will serve IPv4 NodePorts
// on loopback addresses, from the flags alone. "primary" is taken to exclude
// them: the node's primary IP is not a loopback address (kube-proxy reads it from
// the Node; dsproxy's init does not ask the API server), and setting
// route_localnet when it is not needed is what kube-proxy avoids.
func localhostNodePorts(cfg *config.Config) (bool, error) {
	if !cfg.IPTables.LocalhostNodePorts {
		return false, nil
	}
	specs, err := nodeport.ParseAddresses(cfg.NodePortAddresses)
	if err != nil {
		return false, fmt.Errorf("--nodeport-addresses: %w", err)
	}
	spec := specs[family.IPv4]
	if spec.Primary {
		return false, nil
	}
	a, err := spec.Resolve(nodeport.SystemAddrs{}, netip.Addr{})
	if err != nil {
		return false, err
	}
	return iptables.LocalhostNodePorts(family.IPv4, true, a), nil
}

// WriteConfig is kube-proxy's --write-config-to: it writes the effective
// configuration, defaults filled in, as a KubeProxyConfiguration file that
// --config reads back.
func WriteConfig(cfg *config.Config) error {
	data, err := cfg.EncodeYAML()
	if err != nil {
		return fmt.Errorf("--write-config-to: %w", err)
	}
	if err := os.WriteFile(cfg.WriteConfigTo, data, 0o644); err != nil {
		return fmt.Errorf("--write-config-to: %w", err)
	}
	klog.InfoS("Wrote configuration", "file", cfg.WriteConfigTo)
	return nil
}

// ApplyOOMScoreAdj sets the process's OOM score adjustment (--oom-score-adj,
// kube-proxy's default -999: the proxy is among the last to be killed). As in
// kube-proxy, a failure is logged, not fatal.
func ApplyOOMScoreAdj(v int32) {
	if err := applyOOMScoreAdj("/proc/self/oom_score_adj", v); err != nil {
		klog.V(2).InfoS("Failed to apply the OOM score adjustment", "err", err)
	}
}

func applyOOMScoreAdj(path string, v int32) error {
	if v < -1000 || v > 1000 {
		return fmt.Errorf("oom_score_adj %d outside [-1000, 1000]", v)
	}
	return os.WriteFile(path, []byte(strconv.Itoa(int(v))), 0o644)
}
