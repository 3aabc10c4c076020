package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// kubeProxyFlags is every flag kube-proxy v1.36 registers on Linux
// (cmd/kube-proxy/app/options.go AddFlags, logsapi.AddFlags, verflag).
// The JSON logging flags exist because package config registers the json log
// format, as kube-proxy's main package does. --boot-id-file and
// --machine-id-file come to kube-proxy's flag set from the Go flag set of a
// dependency (cadvisor); it never reads them, and neither does dsproxy.
var kubeProxyFlags = []string{
	"config", "write-config-to", "cleanup", "feature-gates", "kubeconfig", "master",
	"kube-api-content-type", "kube-api-burst", "kube-api-qps", "hostname-override",
	"bind-address", "healthz-bind-address", "metrics-bind-address", "bind-address-hard-fail",
	"profiling", "show-hidden-metrics-for-version", "init-only", "proxy-mode",
	"iptables-masquerade-bit", "masquerade-all", "iptables-localhost-nodeports",
	"iptables-sync-period", "iptables-min-sync-period", "ipvs-sync-period", "ipvs-min-sync-period",
	"ipvs-scheduler", "ipvs-exclude-cidrs", "ipvs-strict-arp", "ipvs-tcp-timeout",
	"ipvs-tcpfin-timeout", "ipvs-udp-timeout", "detect-local-mode", "pod-bridge-interface",
	"pod-interface-name-prefix", "cluster-cidr", "nodeport-addresses", "oom-score-adj",
	"conntrack-max-per-core", "conntrack-min", "conntrack-tcp-timeout-established",
	"conntrack-tcp-timeout-close-wait", "conntrack-tcp-be-liberal", "conntrack-udp-timeout",
	"conntrack-udp-timeout-stream", "config-sync-period", "healthz-port", "metrics-port",
	"logging-format", "log-flush-frequency", "v", "vmodule", "log-text-split-stream",
	"log-text-info-buffer-size", "log-json-split-stream", "log-json-info-buffer-size", "version",
	"boot-id-file", "machine-id-file",
}

func TestAllKubeProxyFlagsRegistered(t *testing.T) {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	NewOptions().AddFlags(fs)
	for _, name := range append(kubeProxyFlags, "node-ip", "cleanup-kube-proxy") {
		if fs.Lookup(name) == nil {
			t.Errorf("flag --%s not registered", name)
		}
	}
	if f := fs.ShorthandLookup("v"); f == nil || f.Name != "v" {
		t.Error("-v shorthand not registered")
	}
}

func TestFlagsOnly(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want func(c *Config)
	}{
		{"no flags", nil, func(c *Config) {}},
		{"typical DaemonSet", []string{
			"--kubeconfig=/var/lib/kube-proxy/kubeconfig", "--proxy-mode=nftables",
			"--cluster-cidr=10.244.0.0/16,fd00:10:244::/56", "--hostname-override=Node-A",
			"--conntrack-max-per-core=0", "--metrics-bind-address=0.0.0.0:10249", "--v=2",
		}, func(c *Config) {
			c.ClientConnection.Kubeconfig = "/var/lib/kube-proxy/kubeconfig"
			c.ClusterCIDRs = []string{"10.244.0.0/16", "fd00:10:244::/56"}
			c.HostnameOverride = "node-a"
			c.Conntrack.MaxPerCore = 0
			c.MetricsBindAddress = "0.0.0.0:10249"
			c.Logging.Verbosity = 2
		}},
		{"empty arguments ignored, as kube-proxy", []string{"", "--masquerade-all", ""}, func(c *Config) {
			c.MasqueradeAll = true
		}},
		{"iptables mode, nodePortAddresses not defaulted", []string{"--proxy-mode", "iptables"}, func(c *Config) {
			c.ProxyMode, c.NodePortAddresses = ModeIPTables, nil
		}},
		{"iptables sync flags apply in nftables mode, ipvs ones do not", []string{
			"--iptables-sync-period=36s", "--iptables-min-sync-period=3s", "--ipvs-sync-period=16s", "--ipvs-min-sync-period=7s",
		}, func(c *Config) { c.SyncPeriod, c.MinSyncPeriod = 36*time.Second, 3*time.Second }},
		{"ipvs sync flags apply in ipvs mode only", []string{
			"--proxy-mode=ipvs", "--iptables-sync-period=36s", "--iptables-min-sync-period=3s", "--ipvs-sync-period=16s", "--ipvs-min-sync-period=7s",
		}, func(c *Config) {
			c.ProxyMode, c.NodePortAddresses = ModeIPVS, nil
			c.SyncPeriod, c.MinSyncPeriod = 16*time.Second, 7*time.Second
		}},
		{"ipvs mode keeps generic defaults without ipvs flags", []string{"--proxy-mode=ipvs"}, func(c *Config) {
			c.ProxyMode, c.NodePortAddresses = ModeIPVS, nil
		}},
		{"deprecated ports: 0 disables, bare IP gets port", []string{
			"--healthz-port=0", "--metrics-bind-address=10.0.0.1", "--metrics-port=9999",
		}, func(c *Config) {
			c.HealthzBindAddress, c.MetricsBindAddress = "", "10.0.0.1:9999"
			c.Warnings = append(c.Warnings,
				"Flag --healthz-port has been deprecated, This flag is deprecated and will be removed in a future release. Please use --healthz-bind-address instead.",
				"Flag --metrics-port has been deprecated, This flag is deprecated and will be removed in a future release. Please use --metrics-bind-address instead.")
		}},
		{"bare healthz IP gets default port", []string{"--healthz-bind-address=::1"}, func(c *Config) { c.HealthzBindAddress = "[::1]:10256" }},
		{"write-config-to skips port folding", []string{"--write-config-to=/tmp/x", "--healthz-bind-address=10.0.0.1"}, func(c *Config) {
			c.WriteConfigTo, c.HealthzBindAddress = "/tmp/x", "10.0.0.1"
		}},
		{"empty values are no-ops", []string{"--bind-address=", "--healthz-bind-address=", "--cluster-cidr="}, func(c *Config) {}},
		{"underscores normalized", []string{"--hostname_override=n1", "--masquerade_all"}, func(c *Config) {
			c.HostnameOverride, c.MasqueradeAll = "n1", true
		}},
		{"everything else", []string{
			"--bind-address=10.0.0.5", "--bind-address-hard-fail", "--profiling", "--show-hidden-metrics-for-version=1.35",
			"--kube-api-content-type=application/json", "--kube-api-qps=50", "--kube-api-burst=100", "--master=https://api:6443",
			"--iptables-masquerade-bit=15", "--iptables-localhost-nodeports=false", "--ipvs-scheduler=rr", "--ipvs-exclude-cidrs=10.1.0.0/16,10.2.0.0/16",
			"--ipvs-strict-arp", "--ipvs-tcp-timeout=1m", "--ipvs-tcpfin-timeout=2m", "--ipvs-udp-timeout=3m",
			"--detect-local-mode=BridgeInterface", "--pod-bridge-interface=cbr0", "--pod-interface-name-prefix=veth",
			"--nodeport-addresses=10.0.0.0/8,fd00::/64", "--oom-score-adj=-500", "--conntrack-min=1", "--conntrack-tcp-timeout-established=2h",
			"--conntrack-tcp-timeout-close-wait=30m", "--conntrack-tcp-be-liberal", "--conntrack-udp-timeout=30s", "--conntrack-udp-timeout-stream=2m",
			"--config-sync-period=1m", "--feature-gates=A=true,B=false", "--feature-gates=C=true", "-v=5", "--vmodule=proxier=6",
			"--logging-format=text", "--log-flush-frequency=10s", "--cleanup", "--init-only", "--version=v1.36.3", "--node-ip=IPv6,10.0.0.5", "--cleanup-kube-proxy",
		}, func(c *Config) {
			c.BindAddress, c.BindAddressHardFail, c.EnableProfiling, c.ShowHiddenMetricsForVersion = "10.0.0.5", true, true, "1.35"
			c.ClientConnection.ContentType, c.ClientConnection.QPS, c.ClientConnection.Burst, c.Master = "application/json", 50, 100, "https://api:6443"
			c.IPTables = IPTables{MasqueradeBit: 15}
			c.IPVS = IPVS{"rr", []string{"10.1.0.0/16", "10.2.0.0/16"}, true, time.Minute, 2 * time.Minute, 3 * time.Minute}
			c.DetectLocalMode, c.DetectLocal = LocalModeBridgeInterface, DetectLocal{"cbr0", "veth"}
			c.NodePortAddresses = []string{"10.0.0.0/8", "fd00::/64"}
			c.OOMScoreAdj = -500
			c.Conntrack = Conntrack{32768, 1, 2 * time.Hour, 30 * time.Minute, true, 30 * time.Second, 2 * time.Minute}
			c.ConfigSyncPeriod = time.Minute
			c.FeatureGates = map[string]bool{"A": true, "B": false, "C": true}
			c.Logging.Verbosity, c.Logging.VModule = 5, logsapi.VModuleConfiguration{{FilePattern: "proxier", Verbosity: 6}}
			c.Logging.FlushFrequency.Duration.Duration = 10 * time.Second
			c.Cleanup, c.InitOnly, c.Version, c.NodeIP, c.CleanupKubeProxy = true, true, "v1.36.3", "IPv6,10.0.0.5", true
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			want := Default()
			want.Warnings = nil
			tc.want(want)
			if want.DetectLocalMode == LocalModeClusterCIDR && len(want.ClusterCIDRs) == 0 {
				want.Warnings = append([]string{"detectLocalMode is ClusterCIDR but no cluster CIDR is set (clusterCIDR / --cluster-cidr); local traffic will not be detected"}, want.Warnings...)
			}
			if d := cmp.Diff(want, got, cmpOpts); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"--proxy-modes=nftables"}, "unknown flag: --proxy-modes"},
		{"unknown shorthand", []string{"-x"}, "unknown shorthand flag: 'x'"},
		{"positional argument", []string{"nftables"}, `no positional arguments are accepted, got ["nftables"]`},
		{"positional argument beside an empty one", []string{"", "--masquerade-all", "x"}, `no positional arguments are accepted, got ["" "x"]`},
		{"bad bind address", []string{"--bind-address=10.0.0.300"}, `"10.0.0.300" is not a valid IP address`},
		{"bad healthz address", []string{"--healthz-bind-address=localhost:10256"}, `"localhost" is not a valid IP address`},
		{"bad healthz format", []string{"--healthz-bind-address=nope"}, `"nope" is not in a valid format (ip or ip:port)`},
		{"bad metrics port", []string{"--metrics-bind-address=1.2.3.4:http"}, `"http" is not a valid number`},
		{"bad duration", []string{"--iptables-sync-period=often"}, `invalid argument "often" for "--iptables-sync-period"`},
		{"bad int", []string{"--conntrack-min=many"}, `invalid argument "many" for "--conntrack-min"`},
		{"bad bool", []string{"--masquerade-all=perhaps"}, `invalid argument "perhaps" for "--masquerade-all"`},
		{"bad feature gate", []string{"--feature-gates=A"}, "missing bool value for A"},
		{"bad feature gate value", []string{"--feature-gates=A=maybe"}, "invalid value of A: maybe"},
		{"bad verbosity", []string{"--v=loud"}, `invalid argument "loud" for "-v, --v"`},
		{"blank hostname override", []string{"--hostname-override=  "}, "empty hostname-override is invalid"},
		{"missing config file", []string{"--config=/nonexistent/kube-proxy.yaml"}, `config file "/nonexistent/kube-proxy.yaml": open`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.args)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
	if _, err := Parse([]string{"--help"}); !errors.Is(err, pflag.ErrHelp) {
		t.Errorf("--help: err = %v, want pflag.ErrHelp", err)
	}
}

// A blank hostnameOverride in the file is an error unless --hostname-override
// replaces it: kube-proxy checks only the name it ends with.
func TestBlankFileHostnameOverride(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(path, []byte(header+"hostnameOverride: \"  \"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Parse([]string{"--config=" + path}); err == nil || !strings.Contains(err.Error(), "hostnameOverride: must not be blank") {
		t.Errorf("blank hostnameOverride alone: err = %v, want it refused", err)
	}
	c, err := Parse([]string{"--config=" + path, "--hostname-override=Node1"})
	if err != nil {
		t.Fatalf("blank hostnameOverride with --hostname-override: %v", err)
	}
	if c.HostnameOverride != "node1" {
		t.Errorf("HostnameOverride = %q, want node1 (the flag's)", c.HostnameOverride)
	}
}

// TestFlagsWithConfig checks kube-proxy v1.36's precedence: with --config,
// file-mapped flags are ignored; --hostname-override, explicitly set logging
// flags and flags without a file equivalent still apply.
func TestFlagsWithConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.conf")
	file := header + `
mode: nftables
clusterCIDR: 10.244.0.0/16
hostnameOverride: from-file
clientConnection: {kubeconfig: /file/kubeconfig}
nftables: {syncPeriod: 20s, minSyncPeriod: 2s}
logging: {verbosity: 1, vmodule: [{filePattern: file, verbosity: 3}]}
featureGates: {FromFile: true}
`
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	fileOnly := func(c *Config) {
		c.ConfigFile = path
		c.ClusterCIDRs = []string{"10.244.0.0/16"}
		c.HostnameOverride = "from-file"
		c.ClientConnection.Kubeconfig = "/file/kubeconfig"
		c.SyncPeriod, c.MinSyncPeriod = 20*time.Second, 2*time.Second
		c.Logging.Verbosity = 1
		c.Logging.VModule = logsapi.VModuleConfiguration{{FilePattern: "file", Verbosity: 3}}
		c.FeatureGates = map[string]bool{"FromFile": true}
	}
	for _, tc := range []struct {
		name string
		args []string
		want func(c *Config)
	}{
		{"file only", nil, func(c *Config) {}},
		{"file-mapped flags are ignored", []string{
			"--kubeconfig=/flag/kubeconfig", "--proxy-mode=iptables", "--cluster-cidr=10.0.0.0/8",
			"--iptables-sync-period=5s", "--feature-gates=FromFlag=true", "--healthz-port=0", "--masquerade-all",
		}, func(c *Config) {
			c.Warnings = []string{"flags --cluster-cidr, --feature-gates, --healthz-port, --iptables-sync-period, --kubeconfig, --masquerade-all, --proxy-mode are ignored because --config is set (kube-proxy behaviour); set them in the configuration file",
				"Flag --healthz-port has been deprecated, This flag is deprecated and will be removed in a future release. Please use --healthz-bind-address instead."}
		}},
		{"hostname-override flag wins", []string{"--hostname-override=From-Flag"}, func(c *Config) { c.HostnameOverride = "from-flag" }},
		{"explicit logging flags win, vmodule from flags first", []string{"--v=4", "--vmodule=flag=5", "--log-flush-frequency=2s"}, func(c *Config) {
			c.Logging.Verbosity = 4
			c.Logging.VModule = logsapi.VModuleConfiguration{{FilePattern: "flag", Verbosity: 5}, {FilePattern: "file", Verbosity: 3}}
			c.Logging.FlushFrequency.Duration.Duration = 2 * time.Second
		}},
		{"flags without file equivalent apply", []string{
			"--master=https://api:6443", "--cleanup", "--init-only", "--write-config-to=/tmp/out", "--version=v1.36.3",
			"--node-ip=10.0.0.5", "--cleanup-kube-proxy",
		}, func(c *Config) {
			c.Master, c.Cleanup, c.InitOnly, c.WriteConfigTo, c.Version = "https://api:6443", true, true, "/tmp/out", "v1.36.3"
			c.NodeIP, c.CleanupKubeProxy = "10.0.0.5", true
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(append([]string{"--config=" + path}, tc.args...))
			if err != nil {
				t.Fatal(err)
			}
			want := Default()
			fileOnly(want)
			tc.want(want)
			if d := cmp.Diff(want, got, cmpOpts); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestLenientOption(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(path, []byte(header+"mode: ipvs\nremovedField: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !NewOptions().LenientDecoding {
		t.Error("NewOptions decodes strictly; kube-proxy v1.36 falls back to lenient decoding")
	}
	for _, lenient := range []bool{false, true} {
		o := NewOptions()
		o.LenientDecoding = lenient
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse([]string{"--config", path}); err != nil {
			t.Fatal(err)
		}
		c, err := o.Complete(fs)
		if lenient {
			if err != nil || c.ProxyMode != ModeIPVS || len(c.Warnings) != 2 || !strings.Contains(c.Warnings[0], `unknown field "removedField"`) {
				t.Errorf("lenient: %v %+v", err, c)
			}
		} else if err == nil || !strings.Contains(err.Error(), `unknown field "removedField"`) {
			t.Errorf("strict: err = %v", err)
		}
	}
}

// TestVersionBeforeConfig: as kube-proxy's, --version (true or raw) is answered
// before the configuration file is read, so a broken or missing file does not
// stop it; --version=vX.Y.Z only sets the reported version, so the file counts.
func TestVersionBeforeConfig(t *testing.T) {
	broken := filepath.Join(t.TempDir(), "broken.yaml")
	if err := os.WriteFile(broken, []byte("kind: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"--version", "--version=raw", "--version=1"} {
		for _, file := range []string{broken, "/nonexistent/config.yaml"} {
			c, err := Parse([]string{v, "--config", file, "--proxy-mode=bogus"})
			if err != nil || c.Version == "" {
				t.Errorf("%s --config %s: %v, version %q", v, file, err, c.Version)
			}
		}
	}
	for _, v := range []string{"--version=v1.36.3", "--version=false"} {
		if _, err := Parse([]string{v, "--config", broken}); err == nil {
			t.Errorf("%s with a broken --config: no error", v)
		}
	}
}

// TestParseKeepsFlags: Parse keeps every flag with its value, defaults
// included, for the metrics server's /flagz.
func TestParseKeepsFlags(t *testing.T) {
	c, err := Parse([]string{"--proxy-mode=nftables", "--cluster-cidr=10.0.0.0/8", "--v=3"})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"proxy-mode": "nftables", "cluster-cidr": "10.0.0.0/8", "v": "3", "conntrack-min": "131072", "masquerade-all": "false"} {
		if got, ok := c.Flags[name]; !ok || got != want {
			t.Errorf("Flags[%q] = %q (%v), want %q", name, got, ok, want)
		}
	}
	// Without --config the platform defaults show, as in kube-proxy's /flagz,
	// whose flags point into the configuration it defaults.
	c, err = Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"proxy-mode": "nftables", "detect-local-mode": "ClusterCIDR", "nodeport-addresses": "[primary]"} {
		if got := c.Flags[name]; got != want {
			t.Errorf("without flags: Flags[%q] = %q, want %q", name, got, want)
		}
	}
}
