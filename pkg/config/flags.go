package config

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"
	netutils "k8s.io/utils/net"
)

// Options holds the command-line state. Create it with NewOptions, register
// the flags with AddFlags, parse the FlagSet, then call Complete.
type Options struct {
	// LenientDecoding, true by default, is kube-proxy v1.36's fallback for
	// v1alpha1 files: unknown and duplicate fields become Warnings (logged)
	// instead of errors, so an existing kube-proxy ConfigMap with a field this
	// version does not know still loads. It has no flag; false makes them errors.
	LenientDecoding bool

	flags *Config // targets of the flags that map onto the file (defaults, mode "")

	configFile       string
	writeConfigTo    string
	cleanup          bool
	cleanupKubeProxy bool
	initOnly         bool
	version          string
	master           string
	hostnameOverride string
	nodeIP           string
	// bootIDFile and machineIDFile are accepted and unused, as by kube-proxy,
	// whose flag set takes them from a dependency's (cadvisor's) Go flags.
	bootIDFile, machineIDFile string

	healthzPort, metricsPort      int32
	iptablesSync, iptablesMinSync time.Duration
	ipvsSync, ipvsMinSync         time.Duration
	clusterCIDRs                  string
	logging                       logsapi.LoggingConfiguration
	fileMapped                    map[string]bool
}

// NewOptions returns Options whose flag defaults are kube-proxy's.
func NewOptions() *Options {
	o := &Options{
		LenientDecoding: true,
		flags:           fromVersioned(defaultedVersioned()),
		healthzPort:     defaultHealthzPort,
		metricsPort:     defaultMetricsPort,
	}
	o.logging = *o.flags.Logging.DeepCopy()
	return o
}

// AddFlags registers kube-proxy v1.36's Linux flags (same names, types,
// defaults and meanings) plus dsproxy's --node-ip and --cleanup-kube-proxy on
// fs. It also installs kube-proxy's flag-name normalization, so that
// --hostname_override is accepted as --hostname-override. The --config
// precedence rule is described in the package documentation. Call it once
// per Options; like any pflag registration it panics if fs already defines
// one of these names.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.SetNormalizeFunc(wordSepNormalize)
	c := o.flags
	// fileMapped records the flags that have a configuration-file equivalent
	// (ignored when --config is set).
	o.fileMapped = map[string]bool{}
	trackFileMapped := func(register func()) {
		before := map[string]bool{}
		fs.VisitAll(func(f *pflag.Flag) { before[f.Name] = true })
		register()
		fs.VisitAll(func(f *pflag.Flag) {
			if !before[f.Name] {
				o.fileMapped[f.Name] = true
			}
		})
	}

	// Flags that apply with or without --config.
	{
		fs.StringVar(&o.configFile, "config", "", "The path to the configuration file (KubeProxyConfiguration, kubeproxy.config.k8s.io/v1alpha1, YAML or JSON). When set, flags that have a configuration-file equivalent are ignored, except --hostname-override and explicitly set logging flags (-v, --vmodule, --logging-format, --log-*), which override the file.")
		fs.StringVar(&o.writeConfigTo, "write-config-to", "", "If set, write the default configuration values to this file and exit.")
		fs.BoolVar(&o.cleanup, "cleanup", false, "If true cleanup dsproxy's rules and exit.")
		fs.BoolVar(&o.initOnly, "init-only", false, "If true, perform any initialization steps that must be done with full root privileges, and then exit.")
		fs.StringVar(&o.master, "master", "", "The address of the Kubernetes API server (overrides any value in kubeconfig)")
		fs.StringVar(&o.hostnameOverride, "hostname-override", "", "If non-empty, will be used as the name of the Node that dsproxy is running on. If unset, the node name is assumed to be the same as the node's hostname. Overrides the configuration file.")
		fs.StringVar(&o.version, "version", "", "--version, --version=raw prints version information and quits; --version=vX.Y.Z... sets the reported version")
		fs.Lookup("version").NoOptDefVal = "true"
		fs.StringVar(&o.nodeIP, "node-ip", "", "[dsproxy] The node IP(s) to use, in kubelet --node-ip syntax (KEP-3705): an IP, a dual-stack pair, or 'IPv4'/'IPv6'. Applies with or without --config.")
		fs.StringVar(&o.bootIDFile, "boot-id-file", "/proc/sys/kernel/random/boot_id", "Comma-separated list of files to check for boot-id. Use the first one that exists. (Accepted, as by kube-proxy, and unused.)")
		fs.StringVar(&o.machineIDFile, "machine-id-file", "/etc/machine-id,/var/lib/dbus/machine-id", "Comma-separated list of files to check for machine-id. Use the first one that exists. (Accepted, as by kube-proxy, and unused.)")
		fs.BoolVar(&o.cleanupKubeProxy, "cleanup-kube-proxy", false, "[dsproxy] If true, remove what kube-proxy left (nftables tables, iptables chains, IPVS state) once dsproxy has programmed both families, so that no connection sees a gap; with --cleanup, remove it with dsproxy's own state and exit. Applies with or without --config.")
	}

	trackFileMapped(func() {
		fs.Var(&mapStringBool{m: &c.FeatureGates}, "feature-gates", "A set of key=value pairs that describe feature gates for alpha/experimental features. "+
			"Options are:\n"+strings.Join(knownFeatures(), "\n")+"\n"+
			"This parameter is ignored if a config file is specified by --config.")
		fs.StringVar(&c.ClientConnection.Kubeconfig, "kubeconfig", c.ClientConnection.Kubeconfig, "Path to kubeconfig file with authorization information (the master location can be overridden by the master flag). This parameter is ignored if a config file is specified by --config.")
		fs.StringVar(&c.ClientConnection.ContentType, "kube-api-content-type", c.ClientConnection.ContentType, "Content type of requests sent to apiserver.")
		fs.Int32Var(&c.ClientConnection.Burst, "kube-api-burst", c.ClientConnection.Burst, "Burst to use while talking with kubernetes apiserver")
		fs.Float32Var(&c.ClientConnection.QPS, "kube-api-qps", c.ClientConnection.QPS, "QPS to use while talking with kubernetes apiserver")

		fs.Var(&ipVar{&c.BindAddress}, "bind-address", "Overrides dsproxy's idea of what its node's primary IP is. Note that the name is a historical artifact; no sockets are bound to this IP. This parameter is ignored if a config file is specified by --config.")
		fs.Var(&ipPortVar{&c.HealthzBindAddress}, "healthz-bind-address", "The IP address and port for the health check server to serve on, defaulting to \"0.0.0.0:10256\". This parameter is ignored if a config file is specified by --config.")
		fs.Var(&ipPortVar{&c.MetricsBindAddress}, "metrics-bind-address", "The IP address and port for the metrics server to serve on, defaulting to \"127.0.0.1:10249\". (Set to \"0.0.0.0:10249\" / \"[::]:10249\" to bind on all interfaces.) This parameter is ignored if a config file is specified by --config.")
		fs.BoolVar(&c.BindAddressHardFail, "bind-address-hard-fail", c.BindAddressHardFail, "If true dsproxy will treat failure to bind to a port as fatal and exit")
		fs.BoolVar(&c.EnableProfiling, "profiling", c.EnableProfiling, "If true enables profiling via web interface on /debug/pprof handler. This parameter is ignored if a config file is specified by --config.")
		fs.StringVar(&c.ShowHiddenMetricsForVersion, "show-hidden-metrics-for-version", c.ShowHiddenMetricsForVersion, "The previous version for which you want to show hidden metrics. Only the previous minor version (1.35) is meaningful, other values will not be allowed. This parameter is ignored if a config file is specified by --config.")
		fs.Var(&stringValue[ProxyMode]{&c.ProxyMode}, "proxy-mode", "Which proxy mode to use: 'nftables' (default), 'iptables' or 'ipvs'. This parameter is ignored if a config file is specified by --config.")

		fs.Int32Var(&c.IPTables.MasqueradeBit, "iptables-masquerade-bit", c.IPTables.MasqueradeBit, "If using the iptables or ipvs proxy mode (or no --proxy-mode: dsproxy's nftables mode then uses it), the bit of the fwmark space to mark packets requiring SNAT with.  Must be within the range [0, 31].")
		fs.BoolVar(&c.MasqueradeAll, "masquerade-all", c.MasqueradeAll, "SNAT all traffic sent via Service cluster IPs. This may be required with some CNI plugins.")
		fs.BoolVar(&c.IPTables.LocalhostNodePorts, "iptables-localhost-nodeports", c.IPTables.LocalhostNodePorts, "If false, disable the legacy behavior of allowing NodePort services to be accessed via localhost. (Applies only to iptables mode and IPv4.)")
		fs.DurationVar(&o.iptablesSync, "iptables-sync-period", c.SyncPeriod, "An interval (e.g. '5s', '1m', '2h22m') indicating how frequently various re-synchronizing and cleanup operations are performed. Must be greater than 0. Applies in every mode except ipvs.")
		fs.DurationVar(&o.iptablesMinSync, "iptables-min-sync-period", c.MinSyncPeriod, "The minimum period between rule resyncs (e.g. '5s', '1m', '2h22m'). A value of 0 (dsproxy's default; kube-proxy's is 1s) means every Service or EndpointSlice change will result in an immediate resync. Applies in every mode except ipvs.")
		fs.DurationVar(&o.ipvsSync, "ipvs-sync-period", c.SyncPeriod, "An interval (e.g. '5s', '1m', '2h22m') indicating how frequently various re-synchronizing and cleanup operations are performed. Must be greater than 0. Applies in ipvs mode.")
		fs.DurationVar(&o.ipvsMinSync, "ipvs-min-sync-period", c.MinSyncPeriod, "The minimum period between IPVS rule resyncs (e.g. '5s', '1m', '2h22m'). Applies in ipvs mode.")
		fs.StringVar(&c.IPVS.Scheduler, "ipvs-scheduler", c.IPVS.Scheduler, "The ipvs scheduler type when proxy mode is ipvs")
		fs.StringSliceVar(&c.IPVS.ExcludeCIDRs, "ipvs-exclude-cidrs", c.IPVS.ExcludeCIDRs, "A comma-separated list of CIDRs which the ipvs proxier should not touch when cleaning up IPVS rules.")
		fs.BoolVar(&c.IPVS.StrictARP, "ipvs-strict-arp", c.IPVS.StrictARP, "Enable strict ARP by setting arp_ignore to 1 and arp_announce to 2")
		fs.DurationVar(&c.IPVS.TCPTimeout, "ipvs-tcp-timeout", c.IPVS.TCPTimeout, "The timeout for idle IPVS TCP connections, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').")
		fs.DurationVar(&c.IPVS.TCPFinTimeout, "ipvs-tcpfin-timeout", c.IPVS.TCPFinTimeout, "The timeout for IPVS TCP connections after receiving a FIN packet, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').")
		fs.DurationVar(&c.IPVS.UDPTimeout, "ipvs-udp-timeout", c.IPVS.UDPTimeout, "The timeout for IPVS UDP packets, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').")

		fs.Var(&stringValue[LocalMode]{&c.DetectLocalMode}, "detect-local-mode", "Mode to use to detect local traffic: ClusterCIDR (default), NodeCIDR, BridgeInterface or InterfaceNamePrefix. This parameter is ignored if a config file is specified by --config.")
		fs.StringVar(&c.DetectLocal.BridgeInterface, "pod-bridge-interface", c.DetectLocal.BridgeInterface, "A bridge interface name. When --detect-local-mode is set to BridgeInterface, traffic is local if it originates from this bridge.")
		fs.StringVar(&c.DetectLocal.InterfaceNamePrefix, "pod-interface-name-prefix", c.DetectLocal.InterfaceNamePrefix, "An interface name prefix. When --detect-local-mode is set to InterfaceNamePrefix, traffic is local if it originates from any interface whose name begins with this prefix.")
		fs.StringVar(&o.clusterCIDRs, "cluster-cidr", "", "The CIDR range of the pods in the cluster. (For dual-stack clusters, a comma-separated dual-stack pair of CIDR ranges.) When --detect-local-mode is set to ClusterCIDR, traffic is local if its source IP is in this range. This parameter is ignored if a config file is specified by --config.")
		fs.StringSliceVar(&c.NodePortAddresses, "nodeport-addresses", c.NodePortAddresses, "A list of CIDR ranges that contain valid node IPs, or alternatively, the single string 'primary'. If unset, NodePort connections are accepted on all local IPs ('primary' in nftables mode). This parameter is ignored if a config file is specified by --config.")

		fs.Int32Var(&c.OOMScoreAdj, "oom-score-adj", c.OOMScoreAdj, "The oom-score-adj value for the dsproxy process. Values must be within the range [-1000, 1000]. This parameter is ignored if a config file is specified by --config.")
		fs.Int32Var(&c.Conntrack.MaxPerCore, "conntrack-max-per-core", c.Conntrack.MaxPerCore, "Maximum number of NAT connections to track per CPU core (0 to leave the limit as-is and ignore conntrack-min).")
		fs.Int32Var(&c.Conntrack.Min, "conntrack-min", c.Conntrack.Min, "Minimum number of conntrack entries to allocate, regardless of conntrack-max-per-core (set conntrack-max-per-core=0 to leave the limit as-is).")
		fs.DurationVar(&c.Conntrack.TCPEstablishedTimeout, "conntrack-tcp-timeout-established", c.Conntrack.TCPEstablishedTimeout, "Idle timeout for established TCP connections (0 to leave as-is)")
		fs.DurationVar(&c.Conntrack.TCPCloseWaitTimeout, "conntrack-tcp-timeout-close-wait", c.Conntrack.TCPCloseWaitTimeout, "NAT timeout for TCP connections in the CLOSE_WAIT state")
		fs.BoolVar(&c.Conntrack.TCPBeLiberal, "conntrack-tcp-be-liberal", c.Conntrack.TCPBeLiberal, "Enable liberal mode for tracking TCP packets by setting nf_conntrack_tcp_be_liberal to 1")
		fs.DurationVar(&c.Conntrack.UDPTimeout, "conntrack-udp-timeout", c.Conntrack.UDPTimeout, "Idle timeout for UNREPLIED UDP connections (0 to leave as-is)")
		fs.DurationVar(&c.Conntrack.UDPStreamTimeout, "conntrack-udp-timeout-stream", c.Conntrack.UDPStreamTimeout, "Idle timeout for ASSURED UDP connections (0 to leave as-is)")
		fs.DurationVar(&c.ConfigSyncPeriod, "config-sync-period", c.ConfigSyncPeriod, "How often configuration from the apiserver is refreshed.  Must be greater than 0.")

		fs.Int32Var(&o.healthzPort, "healthz-port", o.healthzPort, "The port to bind the health check server. Use 0 to disable.")
		_ = fs.MarkDeprecated("healthz-port", "This flag is deprecated and will be removed in a future release. Please use --healthz-bind-address instead.")
		fs.Int32Var(&o.metricsPort, "metrics-port", o.metricsPort, "The port to bind the metrics server. Use 0 to disable.")
		_ = fs.MarkDeprecated("metrics-port", "This flag is deprecated and will be removed in a future release. Please use --metrics-bind-address instead.")
	})

	// Logging flags: with --config, only the explicitly set ones apply.
	logsapi.AddFlags(&o.logging, fs)
}

// Complete resolves the configuration from the parsed fs (the FlagSet given
// to AddFlags), following kube-proxy v1.36's precedence rule (package doc):
// it loads --config if set, otherwise applies the flags; then applies
// platform defaults (mode nftables, nodePortAddresses "primary" in nftables
// mode, detectLocalMode ClusterCIDR) and --hostname-override. The result is
// not validated; call Validate.
func (o *Options) Complete(fs *pflag.FlagSet) (*Config, error) {
	var c *Config
	if o.configFile != "" {
		var err error
		if c, err = loadFile(o.configFile, o.LenientDecoding, o.hostnameOverride != ""); err != nil {
			return nil, err
		}
		if err := copyLogsFromFlags(fs, &o.logging, &c.Logging); err != nil {
			return nil, err
		}
		var ignored []string
		fs.Visit(func(f *pflag.Flag) {
			if o.fileMapped[f.Name] {
				ignored = append(ignored, "--"+f.Name)
			}
		})
		if len(ignored) > 0 {
			c.Warnings = append(c.Warnings, fmt.Sprintf("flags %s are ignored because --config is set (kube-proxy behaviour); set them in the configuration file", strings.Join(ignored, ", ")))
		}
	} else {
		c = o.flags.clone()
		c.Logging = *o.logging.DeepCopy()
		if o.writeConfigTo == "" {
			c.HealthzBindAddress = addressFromDeprecatedFlags(c.HealthzBindAddress, o.healthzPort)
			c.MetricsBindAddress = addressFromDeprecatedFlags(c.MetricsBindAddress, o.metricsPort)
		}
		if c.ProxyMode != ModeIPVS {
			if fs.Changed("iptables-sync-period") {
				c.SyncPeriod = o.iptablesSync
			}
			if fs.Changed("iptables-min-sync-period") {
				c.MinSyncPeriod = o.iptablesMinSync
			}
		} else {
			if fs.Changed("ipvs-sync-period") {
				c.SyncPeriod = o.ipvsSync
			}
			if fs.Changed("ipvs-min-sync-period") {
				c.MinSyncPeriod = o.ipvsMinSync
			}
		}
		if fs.Changed("cluster-cidr") && o.clusterCIDRs != "" {
			c.ClusterCIDRs = strings.Split(o.clusterCIDRs, ",")
		}
		// kube-proxy's flags point into the configuration it then defaults,
		// so its /flagz shows those defaults (not with --config: the file's
		// configuration replaces the one the flags point into).
		o.flags.applyPlatformDefaults()
	}
	c.applyPlatformDefaults()

	if o.hostnameOverride != "" {
		h := normalizeHostname(o.hostnameOverride)
		if h == "" {
			return nil, errors.New("empty hostname-override is invalid")
		}
		c.HostnameOverride = h
	}
	c.ConfigFile = o.configFile
	c.WriteConfigTo = o.writeConfigTo
	c.Cleanup = o.cleanup
	c.CleanupKubeProxy = o.cleanupKubeProxy
	c.InitOnly = o.initOnly
	c.Version = o.version
	c.Master = o.master
	c.NodeIP = o.nodeIP
	if c.DetectLocalMode == LocalModeClusterCIDR && len(c.ClusterCIDRs) == 0 {
		c.Warnings = append(c.Warnings, "detectLocalMode is ClusterCIDR but no cluster CIDR is set (clusterCIDR / --cluster-cidr); local traffic will not be detected")
	}
	return c, nil
}

// Parse is a convenience for the daemon and tests: it registers the flags on
// a fresh FlagSet, parses args and calls Complete. Deprecated-flag notices
// are returned in Config.Warnings instead of being printed. It returns
// pflag.ErrHelp for -h/--help. The result is not validated.
func Parse(args []string) (*Config, error) {
	o := NewOptions()
	fs := pflag.NewFlagSet("dsproxy", pflag.ContinueOnError)
	var out bytes.Buffer
	fs.SetOutput(&out)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	// As kube-proxy's: empty arguments (a templated args list's blank item) are
	// ignored; any other is an error.
	for _, a := range fs.Args() {
		if a != "" {
			return nil, fmt.Errorf("no positional arguments are accepted, got %q", fs.Args())
		}
	}
	// As kube-proxy's, --version=true or raw is answered before the
	// configuration file is read: the caller prints and exits.
	if on, err := strconv.ParseBool(o.version); o.version == "raw" || (err == nil && on) {
		return &Config{Version: o.version}, nil
	}
	c, err := o.Complete(fs)
	if err != nil {
		return nil, err
	}
	c.Flags = map[string]string{}
	fs.VisitAll(func(f *pflag.Flag) { c.Flags[f.Name] = f.Value.String() })
	for line := range strings.Lines(out.String()) {
		if line = strings.TrimSpace(line); line != "" {
			c.Warnings = append(c.Warnings, line)
		}
	}
	return c, nil
}

// FlagUsages returns the help text of the flags registered by AddFlags, for
// printing after Parse returns pflag.ErrHelp.
func FlagUsages() string {
	fs := pflag.NewFlagSet("dsproxy", pflag.ContinueOnError)
	NewOptions().AddFlags(fs)
	return fs.FlagUsages()
}

// copyLogsFromFlags mirrors kube-proxy's function of the same name: logging
// flags explicitly set in from override to; vmodule entries from the flags
// come first.
func copyLogsFromFlags(from *pflag.FlagSet, flagCfg, to *logsapi.LoggingConfiguration) error {
	var clone pflag.FlagSet
	clone.SetOutput(&bytes.Buffer{})
	logsapi.AddFlags(to, &clone)
	vmodule := to.VModule
	to.VModule = nil
	var err error
	clone.VisitAll(func(f *pflag.Flag) {
		ff := from.Lookup(f.Name)
		if err != nil || ff == nil || !ff.Changed {
			return
		}
		if f.Name == "vmodule" {
			to.VModule = append(to.VModule, flagCfg.VModule...)
			return
		}
		if serr := f.Value.Set(ff.Value.String()); serr != nil {
			err = fmt.Errorf("copying flag --%s: %w", f.Name, serr)
		}
	})
	to.VModule = append(to.VModule, vmodule...)
	return err
}

// addressFromDeprecatedFlags mirrors kube-proxy: port 0 disables the server,
// otherwise the port is appended to a bare IP.
func addressFromDeprecatedFlags(addr string, port int32) string {
	if port == 0 {
		return ""
	}
	return appendPortIfNeeded(addr, port)
}

func (c *Config) clone() *Config {
	n := *c
	n.ClusterCIDRs = cloneStrings(c.ClusterCIDRs)
	n.NodePortAddresses = cloneStrings(c.NodePortAddresses)
	n.IPVS.ExcludeCIDRs = cloneStrings(c.IPVS.ExcludeCIDRs)
	n.FeatureGates = maps.Clone(c.FeatureGates)
	if n.FeatureGates == nil {
		n.FeatureGates = map[string]bool{}
	}
	n.Logging = *c.Logging.DeepCopy()
	n.Warnings = slices.Clone(c.Warnings)
	return &n
}

// wordSepNormalize is kube's cliflag.WordSepNormalizeFunc: "_" becomes "-".
func wordSepNormalize(_ *pflag.FlagSet, name string) pflag.NormalizedName {
	return pflag.NormalizedName(strings.ReplaceAll(name, "_", "-"))
}

// stringValue is a pflag.Value for string-kinded types, accepting any value
// (validated later, as kube-proxy does for --proxy-mode and
// --detect-local-mode).
type stringValue[T ~string] struct{ p *T }

func (v *stringValue[T]) Set(s string) error { *v.p = T(s); return nil }
func (v *stringValue[T]) String() string     { return string(*v.p) }
func (v *stringValue[T]) Type() string       { return "string" }

// ipVar mirrors kube's utilflag.IPVar: an IP address; "" leaves the value
// unchanged.
type ipVar struct{ p *string }

func (v *ipVar) Set(s string) error {
	if s == "" {
		return nil
	}
	if netutils.ParseIPSloppy(s) == nil {
		return fmt.Errorf("%q is not a valid IP address", s)
	}
	*v.p = s
	return nil
}
func (v *ipVar) String() string { return *v.p }
func (v *ipVar) Type() string   { return "ip" }

// ipPortVar mirrors kube's utilflag.IPPortVar: an IP or IP:port; ""
// leaves the value unchanged.
type ipPortVar struct{ p *string }

func (v *ipPortVar) Set(s string) error {
	if s == "" {
		return nil
	}
	if netutils.ParseIPSloppy(s) != nil {
		*v.p = s
		return nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is not in a valid format (ip or ip:port): %v", s, err)
	}
	if netutils.ParseIPSloppy(host) == nil {
		return fmt.Errorf("%q is not a valid IP address", host)
	}
	if _, err := netutils.ParsePort(port, true); err != nil {
		return fmt.Errorf("%q is not a valid number", port)
	}
	*v.p = s
	return nil
}
func (v *ipPortVar) String() string { return *v.p }
func (v *ipPortVar) Type() string   { return "ipport" }

// mapStringBool mirrors kube's cliflag.MapStringBool ("a=true,b=false"); the
// first Set replaces the default map, later Sets add to it.
type mapStringBool struct {
	m       *map[string]bool
	started bool
}

func (v *mapStringBool) Set(s string) error {
	if !v.started {
		*v.m = map[string]bool{}
		v.started = true
	}
	for _, kv := range strings.Split(s, ",") {
		if strings.TrimSpace(kv) == "" {
			continue
		}
		k, val, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("missing bool value for %s", kv)
		}
		b, err := strconv.ParseBool(strings.TrimSpace(val))
		if err != nil {
			return fmt.Errorf("invalid value of %s: %s, err: %v", strings.TrimSpace(k), val, err)
		}
		(*v.m)[strings.TrimSpace(k)] = b
	}
	return nil
}

func (v *mapStringBool) String() string {
	pairs := make([]string, 0, len(*v.m))
	for _, k := range slices.Sorted(maps.Keys(*v.m)) {
		pairs = append(pairs, fmt.Sprintf("%s=%t", k, (*v.m)[k]))
	}
	return strings.Join(pairs, ",")
}

func (v *mapStringBool) Type() string { return "mapStringBool" }
