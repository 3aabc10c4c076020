package config

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"
)

// cmpOpts compares resource quantities (inside logging options) by value and
// leaves out Flags, what the command line said (TestParseKeepsFlags checks it).
var cmpOpts = cmp.Options{cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 }), cmpopts.IgnoreFields(Config{}, "Flags", "ModeDefaulted")}

const header = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"

// TestDefaults lists kube-proxy v1.36's v1alpha1 defaults (SetDefaults_KubeProxyConfiguration
// and Linux platformApplyDefaults) and checks Default(), an empty file and no flags against them.
func TestDefaults(t *testing.T) {
	fromFile, err := Decode([]byte(header))
	if err != nil {
		t.Fatal(err)
	}
	fromFlags, err := Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*Config{"Default": Default(), "file": fromFile, "flags": fromFlags} {
		t.Run(name, func(t *testing.T) {
			for _, tc := range []struct {
				field     string
				got, want any
			}{
				{"mode (dsproxy; kube-proxy: iptables)", c.ProxyMode, ModeNFTables},
				{"bindAddress", c.BindAddress, "0.0.0.0"},
				{"healthzBindAddress", c.HealthzBindAddress, "0.0.0.0:10256"},
				{"metricsBindAddress", c.MetricsBindAddress, "127.0.0.1:10249"},
				{"bindAddressHardFail", c.BindAddressHardFail, false},
				{"enableProfiling", c.EnableProfiling, false},
				{"hostnameOverride", c.HostnameOverride, ""},
				{"oomScoreAdj", c.OOMScoreAdj, int32(-999)},
				{"syncPeriod", c.SyncPeriod, 30 * time.Second},
				{"minSyncPeriod (dsproxy; kube-proxy: 1s)", c.MinSyncPeriod, time.Duration(0)},
				{"configSyncPeriod", c.ConfigSyncPeriod, 15 * time.Minute},
				{"iptables.masqueradeBit", c.IPTables.MasqueradeBit, int32(14)},
				{"iptables.localhostNodePorts", c.IPTables.LocalhostNodePorts, true},
				{"nftables.masqueradeBit", c.NFTables.MasqueradeBit, int32(14)},
				{"masqueradeAll", c.MasqueradeAll, false},
				{"ipvs.scheduler", c.IPVS.Scheduler, ""},
				{"ipvs.tcpTimeout", c.IPVS.TCPTimeout, time.Duration(0)},
				{"conntrack.maxPerCore", c.Conntrack.MaxPerCore, int32(32768)},
				{"conntrack.min", c.Conntrack.Min, int32(131072)},
				{"conntrack.tcpEstablishedTimeout", c.Conntrack.TCPEstablishedTimeout, 24 * time.Hour},
				{"conntrack.tcpCloseWaitTimeout", c.Conntrack.TCPCloseWaitTimeout, time.Hour},
				{"conntrack.tcpBeLiberal", c.Conntrack.TCPBeLiberal, false},
				{"conntrack.udpTimeout", c.Conntrack.UDPTimeout, time.Duration(0)},
				{"conntrack.udpStreamTimeout", c.Conntrack.UDPStreamTimeout, time.Duration(0)},
				{"clientConnection.kubeconfig", c.ClientConnection.Kubeconfig, ""},
				{"clientConnection.contentType", c.ClientConnection.ContentType, "application/vnd.kubernetes.protobuf"},
				{"clientConnection.qps", c.ClientConnection.QPS, float32(5)},
				{"clientConnection.burst", c.ClientConnection.Burst, int32(10)},
				{"detectLocalMode", c.DetectLocalMode, LocalModeClusterCIDR},
				{"clusterCIDR", len(c.ClusterCIDRs), 0},
				{"nodePortAddresses (nftables mode)", c.NodePortAddresses, []string{"primary"}},
				{"featureGates", c.FeatureGates, map[string]bool{}},
				{"logging.format", c.Logging.Format, "text"},
				{"logging.flushFrequency", c.Logging.FlushFrequency.Duration.Duration, 5 * time.Second},
				{"logging.verbosity", uint32(c.Logging.Verbosity), uint32(0)},
				{"portRange", c.PortRange, ""},
			} {
				if !cmp.Equal(tc.got, tc.want, cmpOpts) {
					t.Errorf("%s = %#v, want %#v", tc.field, tc.got, tc.want)
				}
			}
			if err := c.Validate(); err != nil {
				t.Errorf("defaults do not validate: %v", err)
			}
		})
	}
	if d := cmp.Diff(Default(), fromFile, cmpOpts); d != "" {
		t.Errorf("Default() != empty file (-want +got):\n%s", d)
	}
}

// TestDefaultsMatchKubeGolden checks defaulting and conversion against
// kube-proxy's own golden file (pkg/proxy/apis/config/scheme/testdata/
// KubeProxyConfiguration/after/v1alpha1.yaml at v1.36.3): the defaulted,
// converted (mode "") configuration re-encodes to exactly that file, but for
// dsproxy's one deliberate difference: minSyncPeriod has no default (kube-proxy: 1s).
func TestDefaultsMatchKubeGolden(t *testing.T) {
	golden, err := os.ReadFile("testdata/kube-proxy-v1.36-defaults.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.ReplaceAll(golden, []byte("minSyncPeriod: 1s"), []byte("minSyncPeriod: 0s"))
	if n := bytes.Count(golden, []byte("minSyncPeriod: 1s")); n != 1 {
		t.Fatalf("golden file has %d minSyncPeriod: 1s lines, want 1 (iptables; the active mode's section)", n)
	}
	got, err := fromVersioned(defaultedVersioned()).EncodeYAML()
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(string(want), string(got)); d != "" {
		t.Errorf("defaults differ from kube-proxy golden (-kube +dsproxy):\n%s", d)
	}
	c, err := Decode(golden)
	if err != nil {
		t.Fatal(err)
	}
	def := Default()
	def.MinSyncPeriod = time.Second // explicit in kube-proxy's file, and honoured
	if d := cmp.Diff(def, c, cmpOpts); d != "" {
		t.Errorf("decoding kube golden != Default() (-want +got):\n%s", d)
	}
}

func TestDecodeKubeadmConfigMap(t *testing.T) {
	raw, err := os.ReadFile("testdata/kubeadm-kube-proxy-configmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(raw, &cm); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "config.conf")
	if err := os.WriteFile(path, []byte(cm.Data["config.conf"]), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.ConfigFile = path
	want.ClusterCIDRs = []string{"10.244.0.0/16", "fd00:10:244::/56"}
	want.ClientConnection.Kubeconfig = "/var/lib/kube-proxy/kubeconfig.conf"
	if d := cmp.Diff(want, got, cmpOpts); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

// TestDecodeModeSections checks kube-proxy's v1alpha1 conversion: the mode
// selects the section the sync periods and masqueradeAll come from, and mode
// "" reads the iptables section before the mode is defaulted.
func TestDecodeModeSections(t *testing.T) {
	const sections = `
iptables: {syncPeriod: 11s, minSyncPeriod: 2s, masqueradeAll: true}
ipvs: {syncPeriod: 12s, minSyncPeriod: 3s}
nftables: {syncPeriod: 13s, minSyncPeriod: 4s, masqueradeAll: false}
`
	for _, tc := range []struct {
		mode          string
		wantMode      ProxyMode
		sync, minSync time.Duration
		masqAll       bool
		nodePortAddrs []string
	}{
		{"", ModeNFTables, 11 * time.Second, 2 * time.Second, true, []string{"primary"}},
		{"iptables", ModeIPTables, 11 * time.Second, 2 * time.Second, true, nil},
		{"ipvs", ModeIPVS, 12 * time.Second, 3 * time.Second, true, nil},
		{"nftables", ModeNFTables, 13 * time.Second, 4 * time.Second, false, []string{"primary"}},
	} {
		t.Run("mode="+tc.mode, func(t *testing.T) {
			c, err := Decode([]byte(header + "mode: \"" + tc.mode + "\"\n" + sections))
			if err != nil {
				t.Fatal(err)
			}
			if c.ProxyMode != tc.wantMode || c.SyncPeriod != tc.sync || c.MinSyncPeriod != tc.minSync || c.MasqueradeAll != tc.masqAll {
				t.Errorf("got mode %q sync %v min %v masqueradeAll %v", c.ProxyMode, c.SyncPeriod, c.MinSyncPeriod, c.MasqueradeAll)
			}
			if !cmp.Equal(c.NodePortAddresses, tc.nodePortAddrs) {
				t.Errorf("nodePortAddresses = %q, want %q", c.NodePortAddresses, tc.nodePortAddrs)
			}
		})
	}
	// ipvs.minSyncPeriod has no v1alpha1 default.
	c, err := Decode([]byte(header + "mode: ipvs\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.SyncPeriod != 30*time.Second || c.MinSyncPeriod != 0 {
		t.Errorf("ipvs defaults: sync %v min %v", c.SyncPeriod, c.MinSyncPeriod)
	}
}

func TestDecodeFields(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		check      func(c *Config) bool
	}{
		{"JSON", `{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","mode":"iptables","clusterCIDR":"10.0.0.0/8"}`,
			func(c *Config) bool {
				return c.ProxyMode == ModeIPTables && cmp.Equal(c.ClusterCIDRs, []string{"10.0.0.0/8"})
			}},
		{"IPv6 bindAddress defaults servers to IPv6", header + "bindAddress: \"fd00::1\"\n",
			func(c *Config) bool {
				return c.HealthzBindAddress == "[::]:10256" && c.MetricsBindAddress == "[::1]:10249"
			}},
		{"bare IP gets default port", header + "healthzBindAddress: 10.0.0.1\nmetricsBindAddress: \"::\"\n",
			func(c *Config) bool {
				return c.HealthzBindAddress == "10.0.0.1:10256" && c.MetricsBindAddress == "[::]:10249"
			}},
		{"explicit conntrack zeros kept", header + "conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}\n",
			func(c *Config) bool { return c.Conntrack == Conntrack{} }},
		{"hostname normalized", header + "hostnameOverride: \" Node-1 \"\n",
			func(c *Config) bool { return c.HostnameOverride == "node-1" }},
		{"detect local", header + "detectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: cbr0, interfaceNamePrefix: veth}\n",
			func(c *Config) bool {
				return c.DetectLocalMode == LocalModeBridgeInterface && c.DetectLocal == DetectLocal{"cbr0", "veth"}
			}},
		{"feature gates and misc", header + "featureGates: {Foo: true}\noomScoreAdj: 5\nlogging: {verbosity: 4}\nipvs: {scheduler: rr, excludeCIDRs: [10.0.0.0/8], strictARP: true}\nnodePortAddresses: [10.0.0.0/8]\n",
			func(c *Config) bool {
				return c.FeatureGates["Foo"] && c.OOMScoreAdj == 5 && c.Logging.Verbosity == 4 && c.IPVS.Scheduler == "rr" &&
					c.IPVS.StrictARP && c.IPVS.ExcludeCIDRs[0] == "10.0.0.0/8" && c.NodePortAddresses[0] == "10.0.0.0/8"
			}},
		{"portRange warns", header + "portRange: 30000-32767\n",
			func(c *Config) bool { return len(c.Warnings) == 1 && strings.Contains(c.Warnings[0], "portRange") }},
		{"winkernel warns", header + "winkernel: {networkName: x}\n",
			func(c *Config) bool { return len(c.Warnings) == 1 && strings.Contains(c.Warnings[0], "Windows-only") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Decode([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c) {
				t.Errorf("unexpected config: %+v", c)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
	}{
		{"empty", "  \n", "empty configuration"},
		{"malformed YAML", header + "mode: [nftables\n", "malformed YAML/JSON"},
		{"malformed JSON", `{"apiVersion": "x",`, "malformed YAML/JSON"},
		{"not an object", "- a\n- b\n", "must be a YAML or JSON object"},
		{"scalar", "nftables\n", "must be a YAML or JSON object"},
		{"missing apiVersion", "kind: KubeProxyConfiguration\n", `missing apiVersion (want "kubeproxy.config.k8s.io/v1alpha1")`},
		{"wrong apiVersion", "apiVersion: kubeproxy.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n", `unsupported apiVersion "kubeproxy.config.k8s.io/v1beta1"`},
		{"missing kind", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n", `missing kind (want "KubeProxyConfiguration")`},
		{"wrong kind", "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n", `unsupported kind "KubeletConfiguration"`},
		{"apiVersion not a string", "apiVersion: [1]\nkind: KubeProxyConfiguration\n", "reading apiVersion/kind"},
		{"unknown top-level field", header + "unknownField: x\n", `unknown field "unknownField"`},
		{"unknown nested field", header + "iptables:\n  syncPeriode: 10s\n", `unknown field "iptables.syncPeriode"`},
		{"case mismatch", header + "Mode: nftables\n", `unknown field "Mode"`},
		{"duplicate field", header + "portRange: \"\"\nportRange: \"\"\n", `duplicate field: line 4: key "portRange" already set in map`},
		{"duplicate JSON field", `{"apiVersion":"kubeproxy.config.k8s.io/v1alpha1","kind":"KubeProxyConfiguration","mode":"a","mode":"b"}`, `duplicate field: line 1: key "mode" already set in map`},
		{"wrong type", header + "conntrack:\n  maxPerCore: lots\n", "conntrack.maxPerCore"},
		{"bad duration", header + "syncPeriod: 1\n", `unknown field "syncPeriod"`},
		{"bad duration value", header + "iptables: {syncPeriod: soon}\n", "decoding"},
		{"blank hostname", header + "hostnameOverride: \"  \"\n", "hostnameOverride: must not be blank"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode([]byte(tc.body))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestLoadFileErrorsNameFile(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(header+"iptables:\n  bogus: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		bad:                                `config file "` + bad + `": unknown field "iptables.bogus"`,
		filepath.Join(dir, "missing.yaml"): `config file "` + filepath.Join(dir, "missing.yaml") + `": open`,
	} {
		if _, err := LoadFile(path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("LoadFile(%s) err = %v, want %q", path, err, want)
		}
	}
}

func TestLenientDecoding(t *testing.T) {
	c, err := decode([]byte(header+"mode: iptables\nfoo: 1\nportRange: \"\"\nportRange: \"\"\n"), true, false)
	if err != nil {
		t.Fatal(err)
	}
	if c.ProxyMode != ModeIPTables || len(c.Warnings) != 2 {
		t.Errorf("mode %q warnings %q", c.ProxyMode, c.Warnings)
	}
	if _, err := decode([]byte(header+"mode: [\n"), true, false); err == nil {
		t.Error("lenient decoding accepted malformed YAML")
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"--proxy-mode=ipvs", "--ipvs-sync-period=7s", "--ipvs-min-sync-period=2s", "--masquerade-all", "--cluster-cidr=10.0.0.0/8,fd00::/64", "--ipvs-exclude-cidrs=10.1.0.0/16"},
		{"--proxy-mode=iptables", "--iptables-sync-period=9s", "--feature-gates=A=true", "--hostname-override=n1", "--v=3", "--vmodule=foo=2"},
		{"--masquerade-all", "--nodeport-addresses=10.0.0.0/8", "--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=veth"},
	} {
		c, err := Parse(args)
		if err != nil {
			t.Fatal(err)
		}
		c.Warnings = nil
		b, err := c.EncodeYAML()
		if err != nil {
			t.Fatal(err)
		}
		back, err := Decode(b)
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, b)
		}
		back.Warnings = nil
		if d := cmp.Diff(c, back, cmpOpts); d != "" {
			t.Errorf("%v: round trip (-want +got):\n%s", args, d)
		}
	}
}

// TestModeDefaulted: an empty mode is kube-proxy's iptables mode, so dsproxy's
// nftables mode then takes the mode-generic settings and the masquerade bit from
// the iptables section (file) or flags, and its errors name that section; an
// explicit nftables mode takes the nftables section's.
func TestModeDefaulted(t *testing.T) {
	sections := "iptables: {syncPeriod: 11s, minSyncPeriod: 2s, masqueradeAll: true, masqueradeBit: 5}\n" +
		"nftables: {syncPeriod: 22s, minSyncPeriod: 3s, masqueradeBit: 7}\n"
	for _, tc := range []struct {
		mode          string
		defaulted     bool
		sync, minSync time.Duration
		masqAll       bool
		bit           int32
	}{
		{"", true, 11 * time.Second, 2 * time.Second, true, 5},
		{"nftables", false, 22 * time.Second, 3 * time.Second, false, 7},
		{"iptables", false, 11 * time.Second, 2 * time.Second, true, 5},
	} {
		c, err := Decode([]byte(header + "mode: \"" + tc.mode + "\"\n" + sections))
		if err != nil {
			t.Fatalf("mode %q: %v", tc.mode, err)
		}
		got := []any{c.ModeDefaulted, c.SyncPeriod, c.MinSyncPeriod, c.MasqueradeAll, c.MasqueradeBit()}
		want := []any{tc.defaulted, tc.sync, tc.minSync, tc.masqAll, tc.bit}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("mode %q: [defaulted sync minSync masqueradeAll bit] (-want +got):\n%s", tc.mode, d)
		}
	}

	c, err := Decode([]byte(header + "iptables: {syncPeriod: 30s, minSyncPeriod: 2m}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := "iptables.minSyncPeriod (--iptables-min-sync-period): invalid value 2m0s: must be less than or equal to iptables.syncPeriod (30s)"
	if err := c.Validate(); err == nil || err.Error() != want {
		t.Errorf("Validate: %v\nwant %s", err, want)
	}

	// kube-proxy checks the nftables section only in an explicit nftables mode.
	for mode, ok := range map[string]bool{"": true, "iptables": true, "nftables": false} {
		c, err := Decode([]byte(header + "mode: \"" + mode + "\"\nnftables: {masqueradeBit: 40}\n"))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); (err == nil) != ok {
			t.Errorf("mode %q, nftables.masqueradeBit 40: Validate: %v, want ok %v", mode, err, ok)
		}
	}

	for _, tc := range []struct {
		args      []string
		defaulted bool
		bit       int32
	}{
		{nil, true, 14},
		{[]string{"--iptables-masquerade-bit=5"}, true, 5},
		{[]string{"--iptables-masquerade-bit=6", "--iptables-sync-period=7s", "--masquerade-all"}, true, 6},
		{[]string{"--iptables-masquerade-bit=5", "--proxy-mode=nftables"}, false, 14},
		{[]string{"--iptables-masquerade-bit=5", "--proxy-mode=ipvs"}, false, 5},
	} {
		c, err := Parse(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		if c.ModeDefaulted != tc.defaulted || c.MasqueradeBit() != tc.bit {
			t.Errorf("%v: defaulted %v, bit %d; want %v, %d", tc.args, c.ModeDefaulted, c.MasqueradeBit(), tc.defaulted, tc.bit)
		}
		// What /configz and --write-config-to show is what runs: read back,
		// it gives the same bit and settings.
		b, err := c.EncodeYAML()
		if err != nil {
			t.Fatal(err)
		}
		back, err := Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		if back.ProxyMode != c.ProxyMode || back.MasqueradeBit() != tc.bit || back.SyncPeriod != c.SyncPeriod || back.MasqueradeAll != c.MasqueradeAll {
			t.Errorf("%v: read back: mode %s, bit %d, sync %v, masqueradeAll %v; want %s, %d, %v, %v", tc.args,
				back.ProxyMode, back.MasqueradeBit(), back.SyncPeriod, back.MasqueradeAll, c.ProxyMode, tc.bit, c.SyncPeriod, c.MasqueradeAll)
		}
	}
}
