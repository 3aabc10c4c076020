package config

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	logsapi "k8s.io/component-base/logs/api/v1"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(c *Config)
		want   string // exact message; "" means valid
	}{
		{"defaults", func(c *Config) {}, ""},
		{"iptables mode", func(c *Config) { c.ProxyMode = ModeIPTables }, ""},
		{"ipvs mode", func(c *Config) { c.ProxyMode = ModeIPVS }, ""},
		{"empty mode", func(c *Config) { c.ProxyMode = "" }, ""},
		{"bad mode", func(c *Config) { c.ProxyMode = "userspace" },
			`mode (--proxy-mode): invalid value "userspace": must be one of "iptables", "ipvs", "nftables" (or empty for the default, nftables)`},
		{"kernelspace is Windows only", func(c *Config) { c.ProxyMode = "kernelspace" },
			`mode (--proxy-mode): invalid value "kernelspace": must be one of "iptables", "ipvs", "nftables" (or empty for the default, nftables)`},
		{"iptables masquerade bit", func(c *Config) { c.IPTables.MasqueradeBit = 32 },
			`iptables.masqueradeBit (--iptables-masquerade-bit): invalid value 32: must be within the range [0, 31]`},
		{"nftables masquerade bit", func(c *Config) { c.ModeDefaulted, c.NFTables.MasqueradeBit = false, -1 },
			`nftables.masqueradeBit: invalid value -1: must be within the range [0, 31]`},
		{"nftables masquerade bit unused by an empty mode", func(c *Config) { c.NFTables.MasqueradeBit = -1 }, ""},
		{"nftables masquerade bit unchecked in iptables mode", func(c *Config) { c.ProxyMode, c.NFTables.MasqueradeBit = ModeIPTables, -1 }, ""},
		{"ipvs tcp timeout", func(c *Config) { c.ProxyMode, c.IPVS.TCPTimeout = ModeIPVS, -time.Second },
			`ipvs.tcpTimeout (--ipvs-tcp-timeout): invalid value -1s: must be greater than or equal to 0`},
		{"ipvs tcpfin timeout", func(c *Config) { c.ProxyMode, c.IPVS.TCPFinTimeout = ModeIPVS, -time.Second },
			`ipvs.tcpFinTimeout (--ipvs-tcpfin-timeout): invalid value -1s: must be greater than or equal to 0`},
		{"ipvs udp timeout", func(c *Config) { c.ProxyMode, c.IPVS.UDPTimeout = ModeIPVS, -time.Second },
			`ipvs.udpTimeout (--ipvs-udp-timeout): invalid value -1s: must be greater than or equal to 0`},
		{"ipvs exclude CIDR", func(c *Config) { c.ProxyMode, c.IPVS.ExcludeCIDRs = ModeIPVS, []string{"10.0.0.0/8", "10.0.0.0"} },
			`ipvs.excludeCIDRs[1] (--ipvs-exclude-cidrs): invalid value "10.0.0.0": must be a valid CIDR`},
		{"ipvs settings unchecked in nftables mode", func(c *Config) { c.IPVS.ExcludeCIDRs, c.IPVS.UDPTimeout = []string{"x"}, -1 }, ""},
		{"conntrack maxPerCore", func(c *Config) { c.Conntrack.MaxPerCore = -1 },
			`conntrack.maxPerCore (--conntrack-max-per-core): invalid value -1: must be greater than or equal to 0`},
		{"conntrack min", func(c *Config) { c.Conntrack.Min = -1 },
			`conntrack.min (--conntrack-min): invalid value -1: must be greater than or equal to 0`},
		{"conntrack established", func(c *Config) { c.Conntrack.TCPEstablishedTimeout = -time.Second },
			`conntrack.tcpEstablishedTimeout (--conntrack-tcp-timeout-established): invalid value -1s: must be greater than or equal to 0`},
		{"conntrack close wait", func(c *Config) { c.Conntrack.TCPCloseWaitTimeout = -time.Second },
			`conntrack.tcpCloseWaitTimeout (--conntrack-tcp-timeout-close-wait): invalid value -1s: must be greater than or equal to 0`},
		{"conntrack udp", func(c *Config) { c.Conntrack.UDPTimeout = -time.Second },
			`conntrack.udpTimeout (--conntrack-udp-timeout): invalid value -1s: must be greater than or equal to 0`},
		{"conntrack udp stream", func(c *Config) { c.Conntrack.UDPStreamTimeout = -time.Second },
			`conntrack.udpStreamTimeout (--conntrack-udp-timeout-stream): invalid value -1s: must be greater than or equal to 0`},
		{"conntrack zeros", func(c *Config) { c.Conntrack = Conntrack{} }, ""},
		{"oom score low", func(c *Config) { c.OOMScoreAdj = -1001 },
			`oomScoreAdj (--oom-score-adj): invalid value -1001: must be within the range [-1000, 1000]`},
		{"oom score high", func(c *Config) { c.OOMScoreAdj = 1001 },
			`oomScoreAdj (--oom-score-adj): invalid value 1001: must be within the range [-1000, 1000]`},
		{"burst", func(c *Config) { c.ClientConnection.Burst = -1 },
			`clientConnection.burst (--kube-api-burst): invalid value -1: must be greater than or equal to 0`},
		{"config sync period", func(c *Config) { c.ConfigSyncPeriod = 0 },
			`configSyncPeriod (--config-sync-period): invalid value 0s: must be greater than 0`},
		{"sync period", func(c *Config) { c.SyncPeriod, c.MinSyncPeriod = 0, 0 },
			`iptables.syncPeriod (--iptables-sync-period): invalid value 0s: must be greater than 0`},
		{"sync period, nftables mode", func(c *Config) { c.ModeDefaulted, c.SyncPeriod, c.MinSyncPeriod = false, 0, 0 },
			`nftables.syncPeriod (--iptables-sync-period): invalid value 0s: must be greater than 0`},
		{"negative min sync period", func(c *Config) { c.ProxyMode, c.MinSyncPeriod = ModeIPTables, -time.Second },
			`iptables.minSyncPeriod (--iptables-min-sync-period): invalid value -1s: must be greater than or equal to 0`},
		{"min sync period above sync period", func(c *Config) { c.ProxyMode, c.MinSyncPeriod = ModeIPVS, time.Minute },
			`ipvs.minSyncPeriod (--ipvs-min-sync-period): invalid value 1m0s: must be less than or equal to ipvs.syncPeriod (30s)`},
		{"min sync period zero", func(c *Config) { c.MinSyncPeriod = 0 }, ""},
		{"bind address", func(c *Config) { c.BindAddress = "node1" },
			`bindAddress (--bind-address): invalid value "node1": must be a valid IP address`},
		{"bind address IPv6", func(c *Config) { c.BindAddress = "fd00::1" }, ""},
		{"healthz not host:port", func(c *Config) { c.HealthzBindAddress = "0.0.0.0" },
			`healthzBindAddress (--healthz-bind-address): invalid value "0.0.0.0": must be IP:port`},
		{"healthz host", func(c *Config) { c.HealthzBindAddress = "localhost:10256" },
			`healthzBindAddress (--healthz-bind-address): invalid value "localhost:10256": host "localhost" must be a valid IP`},
		{"metrics port", func(c *Config) { c.MetricsBindAddress = "[::1]:0" },
			`metricsBindAddress (--metrics-bind-address): invalid value "[::1]:0": port "0" must be a number in [1, 65535]`},
		{"metrics port not a number", func(c *Config) { c.MetricsBindAddress = "127.0.0.1:metrics" },
			`metricsBindAddress (--metrics-bind-address): invalid value "127.0.0.1:metrics": port "metrics" must be a number in [1, 65535]`},
		{"servers disabled", func(c *Config) { c.HealthzBindAddress, c.MetricsBindAddress = "", "" }, ""},
		{"nodePortAddresses primary with CIDR", func(c *Config) { c.NodePortAddresses = []string{"10.0.0.0/8", "primary"} },
			`nodePortAddresses[1] (--nodeport-addresses): invalid value "primary": can't use both "primary" and CIDRs`},
		{"nodePortAddresses bad CIDR", func(c *Config) { c.NodePortAddresses = []string{"10.0.0.1"} },
			`nodePortAddresses[0] (--nodeport-addresses): invalid value "10.0.0.1": must be a valid CIDR or "primary"`},
		{"nodePortAddresses CIDRs", func(c *Config) { c.NodePortAddresses = []string{"10.0.0.0/8", "fd00::/64"} }, ""},
		{"nodePortAddresses empty", func(c *Config) { c.NodePortAddresses = nil }, ""},
		{"hidden metrics version", func(c *Config) { c.ShowHiddenMetricsForVersion = "v1.35" },
			`showHiddenMetricsForVersion (--show-hidden-metrics-for-version): invalid value "v1.35": must be omitted or have the value '1.35'; only the previous minor version is allowed`},
		{"hidden metrics version too old", func(c *Config) { c.ShowHiddenMetricsForVersion = "1.34" },
			`showHiddenMetricsForVersion (--show-hidden-metrics-for-version): invalid value "1.34": must be omitted or have the value '1.35'; only the previous minor version is allowed`},
		{"hidden metrics version ok", func(c *Config) { c.ShowHiddenMetricsForVersion = "1.35" }, ""},
		{"bad detect local mode", func(c *Config) { c.DetectLocalMode = "PodCIDR" },
			`detectLocalMode (--detect-local-mode): invalid value "PodCIDR": must be one of "ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix"`},
		{"bridge interface missing", func(c *Config) { c.DetectLocalMode = LocalModeBridgeInterface },
			`detectLocal.bridgeInterface (--pod-bridge-interface): invalid value "": must not be empty when detectLocalMode is BridgeInterface`},
		{"bridge interface", func(c *Config) { c.DetectLocalMode, c.DetectLocal.BridgeInterface = LocalModeBridgeInterface, "cbr0" }, ""},
		{"interface prefix missing", func(c *Config) { c.DetectLocalMode = LocalModeInterfaceNamePrefix },
			`detectLocal.interfaceNamePrefix (--pod-interface-name-prefix): invalid value "": must not be empty when detectLocalMode is InterfaceNamePrefix`},
		{"interface prefix", func(c *Config) {
			c.DetectLocalMode, c.DetectLocal.InterfaceNamePrefix = LocalModeInterfaceNamePrefix, "veth"
		}, ""},
		{"node CIDR mode", func(c *Config) { c.DetectLocalMode = LocalModeNodeCIDR }, ""},
		{"ClusterCIDR mode without CIDR is valid (warning only)", func(c *Config) { c.ClusterCIDRs = nil }, ""},
		{"cluster CIDR dual-stack", func(c *Config) { c.ClusterCIDRs = []string{"fd00:10:244::/56", "10.244.0.0/16"} }, ""},
		{"cluster CIDR invalid", func(c *Config) { c.ClusterCIDRs = []string{"10.244.0.0/33"} },
			`clusterCIDR (--cluster-cidr): invalid value "10.244.0.0/33": must be a valid CIDR block (e.g. 10.244.0.0/16 or fd00:10:244::/56)`},
		{"cluster CIDR empty element", func(c *Config) { c.ClusterCIDRs = []string{"10.244.0.0/16", ""} },
			`clusterCIDR (--cluster-cidr): invalid value "": must be a valid CIDR block (e.g. 10.244.0.0/16 or fd00:10:244::/56)`},
		{"cluster CIDR two of a family", func(c *Config) { c.ClusterCIDRs = []string{"10.244.0.0/16", "10.245.0.0/16"} },
			`clusterCIDR (--cluster-cidr): invalid value "10.244.0.0/16,10.245.0.0/16": must be a single CIDR or a dual-stack pair of CIDRs (at most one per IP family)`},
		{"cluster CIDR three", func(c *Config) { c.ClusterCIDRs = []string{"10.244.0.0/16", "fd00::/64", "10.245.0.0/16"} },
			`clusterCIDR (--cluster-cidr): invalid value "10.244.0.0/16,fd00::/64,10.245.0.0/16": must be a single CIDR or a dual-stack pair of CIDRs (at most one per IP family)`},
		{"cluster CIDR checked in every mode", func(c *Config) { c.DetectLocalMode, c.ClusterCIDRs = LocalModeNodeCIDR, []string{"x"} },
			`clusterCIDR (--cluster-cidr): invalid value "x": must be a valid CIDR block (e.g. 10.244.0.0/16 or fd00:10:244::/56)`},
		{"logging format", func(c *Config) { c.Logging.Format = "xml" },
			`logging.format: Invalid value: "xml": Unsupported log format`},
		{"logging flush frequency", func(c *Config) { c.Logging.FlushFrequency.Duration.Duration = 0 },
			`logging.flushFrequency: Invalid value: "0s": Must be greater than zero`},
		{"logging alpha option needs gate", func(c *Config) { c.Logging.Options.Text.SplitStream = true },
			`logging.options.text.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled`},
		{"logging alpha option with gate", func(c *Config) {
			c.Logging.Options.Text.SplitStream = true
			c.Logging.Options.Text.InfoBufferSize = resource.QuantityValue{Quantity: resource.MustParse("1Ki")}
			c.FeatureGates = map[string]bool{"LoggingAlphaOptions": true, "AllowServiceExternalIPs": false}
		}, ""},
		// Feature gates as kube-proxy v1.36 refuses them (its errors, verbatim).
		{"unknown feature gate", func(c *Config) { c.FeatureGates = map[string]bool{"AllowServiceExternalIP": false} },
			`featureGates (--feature-gates): unrecognized feature gate: AllowServiceExternalIP`},
		{"locked feature gate", func(c *Config) { c.FeatureGates = map[string]bool{"APIServerTracing": false} },
			`featureGates (--feature-gates): cannot set feature gate APIServerTracing to false, feature is locked to true`},
		{"locked feature gate at its default", func(c *Config) { c.FeatureGates = map[string]bool{"APIServerTracing": true} }, ""},
		{"feature gate dependency", func(c *Config) {
			c.FeatureGates = map[string]bool{"ClusterTrustBundleProjection": true}
		}, `featureGates (--feature-gates): ClusterTrustBundleProjection is enabled, but depends on features that are disabled: [ClusterTrustBundle]`},
		{"feature gate dependency on", func(c *Config) {
			c.FeatureGates = map[string]bool{"ClusterTrustBundleProjection": true, "ClusterTrustBundle": true}
		}, ""},
		{"all alpha and beta gates", func(c *Config) { c.FeatureGates = map[string]bool{"AllAlpha": false, "AllBeta": false} }, ""},
		{"logging vmodule", func(c *Config) { c.Logging.VModule = logsapi.VModuleConfiguration{{FilePattern: "a=b", Verbosity: 1}} },
			`logging.vmodule[0]: Invalid value: "a=b": File pattern must not contain equal sign or comma`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			c.ClusterCIDRs = []string{"10.244.0.0/16"}
			tc.mutate(c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || err.Error() != tc.want):
				t.Fatalf("err = %v\nwant  %s", err, tc.want)
			}
		})
	}
}

func TestValidateJoinsAllProblems(t *testing.T) {
	c := Default()
	c.ProxyMode = "bogus"
	c.SyncPeriod = 0
	c.MinSyncPeriod = time.Second
	c.BindAddress = ""
	c.ClusterCIDRs = []string{"nope"}
	err := c.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 5 { // mode, syncPeriod, minSyncPeriod > syncPeriod, bindAddress, clusterCIDR
		t.Errorf("got %d problems:\n%v", len(lines), err)
	}
	for _, want := range []string{"mode (--proxy-mode)", "iptables.syncPeriod", "iptables.minSyncPeriod", "bindAddress", "clusterCIDR"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}
}

// TestValidateAfterParse checks validation end to end through flags.
func TestValidateAfterParse(t *testing.T) {
	c, err := Parse([]string{"--proxy-mode=ipvs", "--ipvs-sync-period=1s", "--ipvs-min-sync-period=2s", "--cluster-cidr=10.0.0.0/8,10.1.0.0/16"})
	if err != nil {
		t.Fatal(err)
	}
	want := "ipvs.minSyncPeriod (--ipvs-min-sync-period): invalid value 2s: must be less than or equal to ipvs.syncPeriod (1s)\n" +
		`clusterCIDR (--cluster-cidr): invalid value "10.0.0.0/8,10.1.0.0/16": must be a single CIDR or a dual-stack pair of CIDRs (at most one per IP family)`
	if err := c.Validate(); err == nil || err.Error() != want {
		t.Errorf("err = %v\nwant  %s", err, want)
	}
}

// CIDRs are read as kube-proxy reads them (family.ParseCIDR: leading zeros are
// decimal), the same way by the validation and by the daemon; unlike in API
// objects an IPv4-mapped one is refused with a clear error.
func TestParseCIDR(t *testing.T) {
	if p, err := ParseCIDR(" 010.244.1.7/16 "); err != nil || p.String() != "10.244.0.0/16" {
		t.Errorf("ParseCIDR(010.244.1.7/16) = %v, %v; want 10.244.0.0/16", p, err)
	}
	if p, err := ParseCIDR("::ffff:10.244.0.0/112"); err == nil || !strings.Contains(err.Error(), "IPv4-mapped") {
		t.Errorf("ParseCIDR(::ffff:10.244.0.0/112) = %v, %v; want an IPv4-mapped error", p, err)
	}
	cfg := Default()
	cfg.ClusterCIDRs = []string{"::ffff:10.244.0.0/112"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "clusterCIDR") {
		t.Errorf("--cluster-cidr IPv4-mapped: Validate = %v, want a clusterCIDR error", err)
	}
}
