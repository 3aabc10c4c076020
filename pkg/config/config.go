package config

import (
	"time"

	logsapi "k8s.io/component-base/logs/api/v1"
	// The JSON log format (--logging-format=json, logging.format: json), as
	// kube-proxy registers it in its main package; here so that validation and
	// the flags (--log-json-*) know it wherever the configuration is parsed.
	_ "k8s.io/component-base/logs/json/register"
	"k8s.io/kube-proxy/config/v1alpha1"
)

// ProxyMode is the kube-proxy proxy mode (config "mode", flag --proxy-mode).
type ProxyMode string

// Proxy modes accepted on Linux. dsproxy implements nftables first; the
// others are accepted here and the daemon decides what to do with them.
const (
	ModeNFTables ProxyMode = "nftables"
	ModeIPTables ProxyMode = "iptables"
	ModeIPVS     ProxyMode = "ipvs"
)

// DefaultProxyMode is the mode used when none is configured. (kube-proxy
// v1.36 defaults to iptables; dsproxy deliberately defaults to nftables.)
const DefaultProxyMode = ModeNFTables

// LocalMode selects how traffic originating from local pods is detected
// (config "detectLocalMode", flag --detect-local-mode).
type LocalMode string

// Local traffic detection modes, as in kube-proxy.
const (
	LocalModeClusterCIDR         LocalMode = "ClusterCIDR"
	LocalModeNodeCIDR            LocalMode = "NodeCIDR"
	LocalModeBridgeInterface     LocalMode = "BridgeInterface"
	LocalModeInterfaceNamePrefix LocalMode = "InterfaceNamePrefix"
)

// NodePortAddressesPrimary is the special NodePortAddresses value meaning
// "only the node's primary IP of each family".
const NodePortAddressesPrimary = "primary"

// Supported KubeProxyConfiguration file identity.
const (
	GroupName  = "kubeproxy.config.k8s.io"
	APIVersion = GroupName + "/v1alpha1"
	Kind       = "KubeProxyConfiguration"
)

// Config is dsproxy's fully resolved configuration: kube-proxy v1.36 defaults,
// then either the --config file or the flags (see the package doc for the
// precedence rule), then platform defaults. File keys and flags are named on
// each field.
type Config struct {
	// ConfigFile is the --config path the configuration was loaded from ("" if none).
	ConfigFile string
	// WriteConfigTo (--write-config-to): if set, the daemon should write the
	// configuration (see KubeProxyConfiguration) to this path and exit.
	WriteConfigTo string
	// Cleanup (--cleanup): remove dsproxy's own rules and exit.
	Cleanup bool
	// CleanupKubeProxy (--cleanup-kube-proxy, dsproxy only): remove what
	// kube-proxy left (its nftables tables, iptables chains, IPVS state) once
	// dsproxy has programmed every family, so no connection sees a gap; with
	// Cleanup, remove it with dsproxy's own state and exit.
	CleanupKubeProxy bool
	// InitOnly (--init-only): perform privileged initialization and exit.
	InitOnly bool
	// Version (--version[=raw|=vX.Y.Z]) is the raw flag value; "" or "false"
	// means not requested.
	Version string

	// ProxyMode ("mode", --proxy-mode). Never empty once resolved.
	ProxyMode ProxyMode
	// ModeDefaulted: the mode was left empty, kube-proxy's iptables mode,
	// and resolved to dsproxy's default. As in kube-proxy, the mode-generic
	// settings (SyncPeriod, MinSyncPeriod, MasqueradeAll) then come from the
	// iptables section and flags, and so does the masquerade bit
	// (MasqueradeBit).
	ModeDefaulted bool
	// HostnameOverride ("hostnameOverride", --hostname-override), trimmed and
	// lower-cased; "" means use the OS hostname.
	HostnameOverride string
	// NodeIP (--node-ip, dsproxy only) is the raw KEP-3705 node IP
	// specification, parsed by package nodeip.
	NodeIP string
	// BindAddress ("bindAddress", --bind-address) overrides the node's primary
	// IP; 0.0.0.0 / :: mean "not set" (kube-proxy semantics).
	BindAddress string
	// BindAddressHardFail ("bindAddressHardFail", --bind-address-hard-fail):
	// failing to bind the healthz/metrics servers is fatal.
	BindAddressHardFail bool
	// HealthzBindAddress ("healthzBindAddress", --healthz-bind-address,
	// deprecated --healthz-port) is IP:port; "" disables the server.
	HealthzBindAddress string
	// MetricsBindAddress ("metricsBindAddress", --metrics-bind-address,
	// deprecated --metrics-port) is IP:port; "" disables the server.
	MetricsBindAddress string
	// EnableProfiling ("enableProfiling", --profiling) serves /debug/pprof on
	// the metrics server.
	EnableProfiling bool
	// ShowHiddenMetricsForVersion ("showHiddenMetricsForVersion",
	// --show-hidden-metrics-for-version), "" or the previous minor version,
	// "1.35" (dsproxy has no hidden metrics to show).
	ShowHiddenMetricsForVersion string

	// ClusterCIDRs ("clusterCIDR" comma-separated, --cluster-cidr): at most
	// one CIDR per IP family.
	ClusterCIDRs []string
	// DetectLocalMode ("detectLocalMode", --detect-local-mode). Never empty
	// once resolved (defaults to ClusterCIDR).
	DetectLocalMode LocalMode
	// DetectLocal ("detectLocal") holds the companions of DetectLocalMode.
	DetectLocal DetectLocal
	// NodePortAddresses ("nodePortAddresses", --nodeport-addresses): CIDRs, or
	// exactly ["primary"]; empty means all local IPs. Defaults to ["primary"]
	// in nftables mode.
	NodePortAddresses []string
	// MasqueradeAll (mode section "masqueradeAll", --masquerade-all) SNATs
	// all traffic sent to cluster IPs.
	MasqueradeAll bool

	// SyncPeriod / MinSyncPeriod come from the section of the active mode
	// ("nftables", "iptables" (also for mode ""), "ipvs") or from
	// --iptables-[min-]sync-period (any mode but ipvs) and
	// --ipvs-[min-]sync-period (ipvs mode).
	SyncPeriod    time.Duration
	MinSyncPeriod time.Duration
	// ConfigSyncPeriod ("configSyncPeriod", --config-sync-period) is the
	// informer resync period.
	ConfigSyncPeriod time.Duration

	IPTables  IPTables
	NFTables  NFTables
	IPVS      IPVS
	Conntrack Conntrack

	// ClientConnection ("clientConnection", --kubeconfig, --kube-api-*).
	ClientConnection ClientConnection
	// Master (--master) overrides the API server URL of the kubeconfig.
	Master string

	// OOMScoreAdj ("oomScoreAdj", --oom-score-adj), in [-1000, 1000].
	OOMScoreAdj int32
	// PortRange ("portRange") is accepted for compatibility and ignored.
	PortRange string
	// FeatureGates ("featureGates", --feature-gates), kube-proxy's gates, never
	// nil; Validate (FeatureGate) refuses what kube-proxy refuses.
	FeatureGates map[string]bool
	// Logging ("logging", -v, --vmodule, --logging-format, ...); apply it with
	// logsapi.ValidateAndApply. Logging.Verbosity is the -v level.
	Logging logsapi.LoggingConfiguration

	// Flags are the command line's flags as Parse read them, every flag with
	// its value (defaults included), for the metrics server's /flagz.
	Flags map[string]string

	// Warnings are non-fatal findings of Complete/LoadFile (ignored flags,
	// ignored fields, degraded local detection, lenient decoding). The caller
	// should log them.
	Warnings []string
}

// DetectLocal holds the "detectLocal" settings.
type DetectLocal struct {
	// BridgeInterface ("bridgeInterface", --pod-bridge-interface), required in
	// BridgeInterface mode.
	BridgeInterface string
	// InterfaceNamePrefix ("interfaceNamePrefix", --pod-interface-name-prefix),
	// required in InterfaceNamePrefix mode.
	InterfaceNamePrefix string
}

// IPTables holds the iptables-section settings that are not mode-generic.
type IPTables struct {
	// MasqueradeBit ("iptables.masqueradeBit", --iptables-masquerade-bit),
	// used by the iptables and ipvs modes and an empty mode, in [0, 31]
	// (see Config.MasqueradeBit).
	MasqueradeBit int32
	// LocalhostNodePorts ("iptables.localhostNodePorts",
	// --iptables-localhost-nodeports), iptables mode and IPv4 only.
	LocalhostNodePorts bool
}

// MasqueradeBit is the packet mark bit the proxy mode marks packets that need
// SNAT with: nftables.masqueradeBit in an explicit nftables mode, else
// iptables.masqueradeBit (--iptables-masquerade-bit), as kube-proxy's modes.
func (c *Config) MasqueradeBit() int32 {
	if c.ProxyMode == ModeNFTables && !c.ModeDefaulted {
		return c.NFTables.MasqueradeBit
	}
	return c.IPTables.MasqueradeBit
}

// NFTables holds the nftables-section settings that are not mode-generic.
type NFTables struct {
	// MasqueradeBit ("nftables.masqueradeBit", file only), used by an
	// explicit nftables mode, in [0, 31].
	MasqueradeBit int32
}

// IPVS holds the ipvs-section settings (used only in ipvs mode).
type IPVS struct {
	Scheduler     string        // "ipvs.scheduler", --ipvs-scheduler
	ExcludeCIDRs  []string      // "ipvs.excludeCIDRs", --ipvs-exclude-cidrs
	StrictARP     bool          // "ipvs.strictARP", --ipvs-strict-arp
	TCPTimeout    time.Duration // "ipvs.tcpTimeout", --ipvs-tcp-timeout; 0 leaves the kernel value
	TCPFinTimeout time.Duration // "ipvs.tcpFinTimeout", --ipvs-tcpfin-timeout; 0 leaves the kernel value
	UDPTimeout    time.Duration // "ipvs.udpTimeout", --ipvs-udp-timeout; 0 leaves the kernel value
}

// Conntrack holds the "conntrack" sysctl settings. A zero value means "leave
// the kernel setting as is" (MaxPerCore 0 also ignores Min).
type Conntrack struct {
	MaxPerCore            int32         // "maxPerCore", --conntrack-max-per-core
	Min                   int32         // "min", --conntrack-min
	TCPEstablishedTimeout time.Duration // "tcpEstablishedTimeout", --conntrack-tcp-timeout-established
	TCPCloseWaitTimeout   time.Duration // "tcpCloseWaitTimeout", --conntrack-tcp-timeout-close-wait
	TCPBeLiberal          bool          // "tcpBeLiberal", --conntrack-tcp-be-liberal
	UDPTimeout            time.Duration // "udpTimeout", --conntrack-udp-timeout
	UDPStreamTimeout      time.Duration // "udpStreamTimeout", --conntrack-udp-timeout-stream
}

// ClientConnection holds the API client settings ("clientConnection").
type ClientConnection struct {
	Kubeconfig         string  // "kubeconfig", --kubeconfig; "" means in-cluster
	AcceptContentTypes string  // "acceptContentTypes" (file only)
	ContentType        string  // "contentType", --kube-api-content-type
	QPS                float32 // "qps", --kube-api-qps
	Burst              int32   // "burst", --kube-api-burst
}

// Default returns the configuration dsproxy uses when given no flags and no
// file: kube-proxy v1.36's v1alpha1 defaults plus platform defaults, with the
// proxy mode defaulted to nftables.
func Default() *Config {
	c := fromVersioned(defaultedVersioned())
	c.applyPlatformDefaults()
	return c
}

// defaultedVersioned returns an empty v1alpha1 object with kube-proxy's
// defaulting applied.
func defaultedVersioned() *v1alpha1.KubeProxyConfiguration {
	obj := &v1alpha1.KubeProxyConfiguration{}
	setDefaults(obj)
	return obj
}

// applyPlatformDefaults mirrors kube-proxy's Linux platformApplyDefaults,
// with dsproxy's default mode.
func (c *Config) applyPlatformDefaults() {
	if c.ProxyMode == "" {
		c.ProxyMode, c.ModeDefaulted = DefaultProxyMode, true
	}
	if c.ProxyMode == ModeNFTables && len(c.NodePortAddresses) == 0 {
		c.NodePortAddresses = []string{NodePortAddressesPrimary}
	}
	if c.DetectLocalMode == "" {
		c.DetectLocalMode = LocalModeClusterCIDR
	}
}
