package config

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	logsapi "k8s.io/component-base/logs/api/v1"
	netutils "k8s.io/utils/net"
)

// ValidProxyModes lists the accepted proxy modes (an empty mode is defaulted
// to DefaultProxyMode before validation).
var ValidProxyModes = []ProxyMode{ModeIPTables, ModeIPVS, ModeNFTables}

// ValidLocalModes lists the accepted detect-local modes.
var ValidLocalModes = []LocalMode{LocalModeClusterCIDR, LocalModeNodeCIDR, LocalModeBridgeInterface, LocalModeInterfaceNamePrefix}

// Validate checks c with kube-proxy v1.36's rules (plus the deviations listed
// in the package doc) and returns all problems joined with errors.Join, or
// nil. Each problem reads "<file field> (<flag>): <value>: <reason>".
func (c *Config) Validate() error {
	var v validator

	if c.ProxyMode != "" && !slices.Contains(ValidProxyModes, c.ProxyMode) {
		v.add("mode", "--proxy-mode", c.ProxyMode, "must be one of %s (or empty for the default, %s)", quoteAll(ValidProxyModes), DefaultProxyMode)
	}
	v.bit("iptables.masqueradeBit", "--iptables-masquerade-bit", c.IPTables.MasqueradeBit)
	switch {
	case c.ProxyMode == ModeNFTables && !c.ModeDefaulted:
		// As kube-proxy: only an explicit nftables mode uses (and checks) it.
		v.bit("nftables.masqueradeBit", "", c.NFTables.MasqueradeBit)
	case c.ProxyMode == ModeIPVS:
		v.nonNegative("ipvs.tcpTimeout", "--ipvs-tcp-timeout", c.IPVS.TCPTimeout)
		v.nonNegative("ipvs.tcpFinTimeout", "--ipvs-tcpfin-timeout", c.IPVS.TCPFinTimeout)
		v.nonNegative("ipvs.udpTimeout", "--ipvs-udp-timeout", c.IPVS.UDPTimeout)
		for i, s := range c.IPVS.ExcludeCIDRs {
			if !validCIDR(s) {
				v.add(fmt.Sprintf("ipvs.excludeCIDRs[%d]", i), "--ipvs-exclude-cidrs", s, "must be a valid CIDR")
			}
		}
	}

	if c.Conntrack.MaxPerCore < 0 {
		v.add("conntrack.maxPerCore", "--conntrack-max-per-core", c.Conntrack.MaxPerCore, "must be greater than or equal to 0")
	}
	if c.Conntrack.Min < 0 {
		v.add("conntrack.min", "--conntrack-min", c.Conntrack.Min, "must be greater than or equal to 0")
	}
	v.nonNegative("conntrack.tcpEstablishedTimeout", "--conntrack-tcp-timeout-established", c.Conntrack.TCPEstablishedTimeout)
	v.nonNegative("conntrack.tcpCloseWaitTimeout", "--conntrack-tcp-timeout-close-wait", c.Conntrack.TCPCloseWaitTimeout)
	v.nonNegative("conntrack.udpTimeout", "--conntrack-udp-timeout", c.Conntrack.UDPTimeout)
	v.nonNegative("conntrack.udpStreamTimeout", "--conntrack-udp-timeout-stream", c.Conntrack.UDPStreamTimeout)
	if c.OOMScoreAdj < -1000 || c.OOMScoreAdj > 1000 {
		v.add("oomScoreAdj", "--oom-score-adj", c.OOMScoreAdj, "must be within the range [-1000, 1000]")
	}
	if c.ClientConnection.Burst < 0 {
		v.add("clientConnection.burst", "--kube-api-burst", c.ClientConnection.Burst, "must be greater than or equal to 0")
	}

	if c.ConfigSyncPeriod <= 0 {
		v.add("configSyncPeriod", "--config-sync-period", c.ConfigSyncPeriod, "must be greater than 0")
	}
	syncField, minField, syncFlag, minFlag := c.syncPeriodNames()
	if c.SyncPeriod <= 0 {
		v.add(syncField, syncFlag, c.SyncPeriod, "must be greater than 0")
	}
	v.nonNegative(minField, minFlag, c.MinSyncPeriod)
	if c.MinSyncPeriod > c.SyncPeriod {
		v.add(minField, minFlag, c.MinSyncPeriod, "must be less than or equal to %s (%s)", syncField, c.SyncPeriod)
	}

	if netutils.ParseIPSloppy(c.BindAddress) == nil {
		v.add("bindAddress", "--bind-address", c.BindAddress, "must be a valid IP address")
	}
	v.hostPort("healthzBindAddress", "--healthz-bind-address", c.HealthzBindAddress)
	v.hostPort("metricsBindAddress", "--metrics-bind-address", c.MetricsBindAddress)

	for i, s := range c.NodePortAddresses {
		if s == NodePortAddressesPrimary {
			if len(c.NodePortAddresses) != 1 {
				v.add(fmt.Sprintf("nodePortAddresses[%d]", i), "--nodeport-addresses", s, "can't use both %q and CIDRs", NodePortAddressesPrimary)
			}
			continue
		}
		if !validCIDR(s) {
			v.add(fmt.Sprintf("nodePortAddresses[%d]", i), "--nodeport-addresses", s, "must be a valid CIDR or %q", NodePortAddressesPrimary)
		}
	}

	// As kube-proxy v1.36 (component-base's check against its own version):
	// only the previous minor version.
	if s := c.ShowHiddenMetricsForVersion; s != "" && s != hiddenMetricsVersion {
		v.add("showHiddenMetricsForVersion", "--show-hidden-metrics-for-version", s,
			"must be omitted or have the value '%s'; only the previous minor version is allowed", hiddenMetricsVersion)
	}

	switch c.DetectLocalMode {
	case "", LocalModeClusterCIDR, LocalModeNodeCIDR:
	case LocalModeBridgeInterface:
		if c.DetectLocal.BridgeInterface == "" {
			v.add("detectLocal.bridgeInterface", "--pod-bridge-interface", "", "must not be empty when detectLocalMode is %s", LocalModeBridgeInterface)
		}
	case LocalModeInterfaceNamePrefix:
		if c.DetectLocal.InterfaceNamePrefix == "" {
			v.add("detectLocal.interfaceNamePrefix", "--pod-interface-name-prefix", "", "must not be empty when detectLocalMode is %s", LocalModeInterfaceNamePrefix)
		}
	default:
		v.add("detectLocalMode", "--detect-local-mode", c.DetectLocalMode, "must be one of %s", quoteAll(ValidLocalModes))
	}
	v.clusterCIDRs(c.ClusterCIDRs)

	fg, err := c.FeatureGate()
	if err != nil {
		v.errs = append(v.errs, fmt.Errorf("featureGates (--feature-gates): %w", err))
	}
	for _, e := range logsapi.Validate(&c.Logging, fg, field.NewPath("logging")) {
		v.errs = append(v.errs, e)
	}
	return errors.Join(v.errs...)
}

// syncPeriodNames names the file fields and flags SyncPeriod and
// MinSyncPeriod come from in c's mode.
func (c *Config) syncPeriodNames() (syncField, minField, syncFlag, minFlag string) {
	section, flagPrefix := "iptables", "--iptables"
	switch {
	case c.ProxyMode == ModeNFTables && !c.ModeDefaulted:
		section = "nftables"
	case c.ProxyMode == ModeIPVS:
		section, flagPrefix = "ipvs", "--ipvs"
	}
	return section + ".syncPeriod", section + ".minSyncPeriod", flagPrefix + "-sync-period", flagPrefix + "-min-sync-period"
}

// hiddenMetricsVersion is the one showHiddenMetricsForVersion kube-proxy v1.36
// accepts: the minor version before its own.
const hiddenMetricsVersion = "1.35"

type validator struct{ errs []error }

func (v *validator) add(fieldName, flag string, value any, format string, args ...any) {
	name := fieldName
	if flag != "" {
		name += " (" + flag + ")"
	}
	var val string
	switch x := value.(type) {
	case string, ProxyMode, LocalMode:
		val = fmt.Sprintf("%q", x)
	default:
		val = fmt.Sprint(x)
	}
	v.errs = append(v.errs, fmt.Errorf("%s: invalid value %s: %s", name, val, fmt.Sprintf(format, args...)))
}

func (v *validator) nonNegative(fieldName, flag string, d time.Duration) {
	if d < 0 {
		v.add(fieldName, flag, d, "must be greater than or equal to 0")
	}
}

func (v *validator) bit(fieldName, flag string, b int32) {
	if b < 0 || b > 31 {
		v.add(fieldName, flag, b, "must be within the range [0, 31]")
	}
}

// hostPort accepts "" (server disabled) or IP:port with port in [1, 65535].
func (v *validator) hostPort(fieldName, flag, s string) {
	if s == "" {
		return
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		v.add(fieldName, flag, s, "must be IP:port")
		return
	}
	if netutils.ParseIPSloppy(host) == nil {
		v.add(fieldName, flag, s, "host %q must be a valid IP", host)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		v.add(fieldName, flag, s, "port %q must be a number in [1, 65535]", port)
	}
}

// clusterCIDRs: at most two valid CIDRs, at most one per IP family.
func (v *validator) clusterCIDRs(cidrs []string) {
	const fieldName, flag = "clusterCIDR", "--cluster-cidr"
	joined := strings.Join(cidrs, ",")
	ok := true
	for _, s := range cidrs {
		if !validCIDR(s) {
			v.add(fieldName, flag, s, "must be a valid CIDR block (e.g. 10.244.0.0/16 or fd00:10:244::/56)")
			ok = false
		}
	}
	if !ok {
		return
	}
	if len(cidrs) > 2 {
		v.add(fieldName, flag, joined, "must be a single CIDR or a dual-stack pair of CIDRs (at most one per IP family)")
	} else if len(cidrs) == 2 {
		if dual, err := netutils.IsDualStackCIDRStrings(cidrs); err == nil && !dual {
			v.add(fieldName, flag, joined, "must be a single CIDR or a dual-stack pair of CIDRs (at most one per IP family)")
		}
	}
}

func validCIDR(s string) bool {
	_, err := ParseCIDR(s)
	return err == nil
}

func quoteAll[T ~string](list []T) string {
	q := make([]string, len(list))
	for i, s := range list {
		q[i] = strconv.Quote(string(s))
	}
	return strings.Join(q, ", ")
}
