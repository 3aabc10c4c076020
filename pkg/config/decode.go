package config

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
	netutils "k8s.io/utils/net"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// kube-proxy's well-known ports (k8s.io/kubernetes/pkg/cluster/ports) and
// OOM score (pkg/kubelet/qos).
const (
	defaultHealthzPort = 10256
	defaultMetricsPort = 10249
	defaultOOMScoreAdj = -999
)

// LoadFile reads a KubeProxyConfiguration file (YAML or JSON) and resolves it
// like Decode. Errors name the file.
func LoadFile(path string) (*Config, error) {
	return loadFile(path, false, false)
}

// loadFile is LoadFile; with lenient, unknown and duplicate fields are warnings;
// with hostnameSet, a blank hostnameOverride is no error (--hostname-override
// replaces it, as in kube-proxy, which checks the name it ends with).
func loadFile(path string, lenient, hostnameSet bool) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file %q: %w", path, err)
	}
	c, err := decode(data, lenient, hostnameSet)
	if err != nil {
		return nil, fmt.Errorf("config file %q: %w", path, err)
	}
	c.ConfigFile = path
	return c, nil
}

// Decode strictly decodes a serialized KubeProxyConfiguration
// (apiVersion kubeproxy.config.k8s.io/v1alpha1), applies kube-proxy's
// v1alpha1 defaulting and conversion, then platform defaults. Malformed
// input, a wrong apiVersion or kind, unknown fields, duplicate fields and
// type mismatches are errors naming the offending field. The result is not
// validated; call Validate.
func Decode(data []byte) (*Config, error) {
	return decode(data, false, false)
}

func decode(data []byte, lenient, hostnameSet bool) (*Config, error) {
	obj, warnings, err := decodeVersioned(data, lenient)
	if err != nil {
		return nil, err
	}
	c := fromVersioned(obj)
	c.Warnings = append(warnings, fileWarnings(obj)...)
	if c.HostnameOverride == "" && obj.HostnameOverride != "" && !hostnameSet {
		return nil, errors.New(`hostnameOverride: must not be blank`)
	}
	c.applyPlatformDefaults()
	return c, nil
}

// decodeVersioned decodes and defaults data. With lenient set, unknown and
// duplicate fields are reported as warnings instead of errors.
func decodeVersioned(data []byte, lenient bool) (*v1alpha1.KubeProxyConfiguration, []string, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, nil, errors.New("empty configuration")
	}
	var warnings []string
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		// Distinguish duplicate keys (strict) from malformed input.
		if js, err = yaml.YAMLToJSON(data); err != nil {
			return nil, nil, fmt.Errorf("malformed YAML/JSON: %w", err)
		}
		if !lenient {
			_, serr := yaml.YAMLToJSONStrict(data)
			return nil, nil, fmt.Errorf("duplicate field: %s", yamlErrorDetail(serr))
		}
		warnings = append(warnings, "configuration has duplicate fields; the last value of each is used")
	}
	if !bytes.HasPrefix(bytes.TrimSpace(js), []byte("{")) {
		return nil, nil, errors.New("configuration must be a YAML or JSON object")
	}

	var tm metav1.TypeMeta
	if err := kjson.UnmarshalCaseSensitivePreserveInts(js, &tm); err != nil {
		return nil, nil, fmt.Errorf("reading apiVersion/kind: %w", err)
	}
	switch {
	case tm.APIVersion == "":
		return nil, nil, fmt.Errorf("missing apiVersion (want %q)", APIVersion)
	case tm.APIVersion != APIVersion:
		return nil, nil, fmt.Errorf("unsupported apiVersion %q (want %q)", tm.APIVersion, APIVersion)
	case tm.Kind == "":
		return nil, nil, fmt.Errorf("missing kind (want %q)", Kind)
	case tm.Kind != Kind:
		return nil, nil, fmt.Errorf("unsupported kind %q (want %q)", tm.Kind, Kind)
	}

	obj := &v1alpha1.KubeProxyConfiguration{}
	strictErrs, err := kjson.UnmarshalStrict(js, obj)
	if err != nil {
		return nil, nil, fmt.Errorf("decoding: %w", err)
	}
	if len(strictErrs) > 0 {
		if !lenient {
			return nil, nil, errors.Join(strictErrs...)
		}
		for _, e := range strictErrs {
			warnings = append(warnings, fmt.Sprintf("ignoring strict decoding error (lenient mode): %v", e))
		}
	}
	setDefaults(obj)
	return obj, warnings, nil
}

// fileWarnings reports file settings that are accepted but have no effect.
func fileWarnings(obj *v1alpha1.KubeProxyConfiguration) []string {
	var w []string
	if obj.PortRange != "" {
		w = append(w, fmt.Sprintf("portRange %q is deprecated and ignored (as in kube-proxy)", obj.PortRange))
	}
	if obj.Winkernel != (v1alpha1.KubeProxyWinkernelConfiguration{}) || obj.WindowsRunAsService {
		w = append(w, "winkernel and windowsRunAsService are Windows-only and ignored")
	}
	return w
}

// setDefaults mirrors k8s.io/kubernetes/pkg/proxy/apis/config/v1alpha1
// SetDefaults_KubeProxyConfiguration at v1.36.3.
func setDefaults(obj *v1alpha1.KubeProxyConfiguration) {
	if obj.BindAddress == "" {
		obj.BindAddress = "0.0.0.0"
	}
	healthzHost, metricsHost := "0.0.0.0", "127.0.0.1"
	if netutils.ParseIPSloppy(obj.BindAddress).To4() == nil {
		healthzHost, metricsHost = "[::]", "[::1]"
	}
	if obj.HealthzBindAddress == "" {
		obj.HealthzBindAddress = healthzHost + ":" + strconv.Itoa(defaultHealthzPort)
	} else {
		obj.HealthzBindAddress = appendPortIfNeeded(obj.HealthzBindAddress, defaultHealthzPort)
	}
	if obj.MetricsBindAddress == "" {
		obj.MetricsBindAddress = metricsHost + ":" + strconv.Itoa(defaultMetricsPort)
	} else {
		obj.MetricsBindAddress = appendPortIfNeeded(obj.MetricsBindAddress, defaultMetricsPort)
	}
	if obj.OOMScoreAdj == nil {
		obj.OOMScoreAdj = ptr[int32](defaultOOMScoreAdj)
	}
	defaultDuration(&obj.IPTables.SyncPeriod, 30*time.Second)
	// minSyncPeriod: no default (kube-proxy: 1s). dsproxy's syncs are incremental
	// (one endpoint: well under a millisecond) and changes arriving during a sync
	// are merged into the next one, so by default every change is programmed at
	// once. An explicit value is honoured as kube-proxy does.
	if obj.IPTables.LocalhostNodePorts == nil {
		obj.IPTables.LocalhostNodePorts = ptr(true)
	}
	defaultDuration(&obj.IPVS.SyncPeriod, 30*time.Second)
	defaultDuration(&obj.NFTables.SyncPeriod, 30*time.Second)
	if obj.Conntrack.MaxPerCore == nil {
		obj.Conntrack.MaxPerCore = ptr[int32](32 * 1024)
	}
	if obj.Conntrack.Min == nil {
		obj.Conntrack.Min = ptr[int32](128 * 1024)
	}
	if obj.IPTables.MasqueradeBit == nil {
		obj.IPTables.MasqueradeBit = ptr[int32](14)
	}
	if obj.NFTables.MasqueradeBit == nil {
		obj.NFTables.MasqueradeBit = ptr[int32](14)
	}
	if obj.Conntrack.TCPEstablishedTimeout == nil {
		obj.Conntrack.TCPEstablishedTimeout = &metav1.Duration{Duration: 24 * time.Hour}
	}
	if obj.Conntrack.TCPCloseWaitTimeout == nil {
		obj.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{Duration: time.Hour}
	}
	defaultDuration(&obj.ConfigSyncPeriod, 15*time.Minute)
	if obj.ClientConnection.ContentType == "" {
		obj.ClientConnection.ContentType = "application/vnd.kubernetes.protobuf"
	}
	if obj.ClientConnection.QPS == 0 {
		obj.ClientConnection.QPS = 5
	}
	if obj.ClientConnection.Burst == 0 {
		obj.ClientConnection.Burst = 10
	}
	if obj.FeatureGates == nil {
		obj.FeatureGates = map[string]bool{}
	}
	logsapi.SetRecommendedLoggingConfiguration(&obj.Logging)
}

func defaultDuration(d *metav1.Duration, def time.Duration) {
	if d.Duration == 0 {
		d.Duration = def
	}
}

func ptr[T any](v T) *T { return &v }

// appendPortIfNeeded mirrors kube-proxy's proxyutil.AppendPortIfNeeded: an
// IP without a port gets port appended; anything else is returned unchanged
// (validation catches it).
func appendPortIfNeeded(addr string, port int32) string {
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr
	}
	if netutils.ParseIPSloppy(addr) == nil {
		return addr
	}
	return net.JoinHostPort(addr, strconv.Itoa(int(port)))
}

// fromVersioned converts a defaulted v1alpha1 object the way kube-proxy's
// v1alpha1→internal conversion does: mode "" reads the iptables section,
// masqueradeAll comes from the nftables section in nftables mode and from
// the iptables section otherwise, and clusterCIDR is split on commas.
// Platform defaults are not applied.
func fromVersioned(in *v1alpha1.KubeProxyConfiguration) *Config {
	c := &Config{
		ProxyMode:                   ProxyMode(in.Mode),
		HostnameOverride:            normalizeHostname(in.HostnameOverride),
		BindAddress:                 in.BindAddress,
		BindAddressHardFail:         in.BindAddressHardFail,
		HealthzBindAddress:          in.HealthzBindAddress,
		MetricsBindAddress:          in.MetricsBindAddress,
		EnableProfiling:             in.EnableProfiling,
		ShowHiddenMetricsForVersion: in.ShowHiddenMetricsForVersion,
		DetectLocalMode:             LocalMode(in.DetectLocalMode),
		DetectLocal: DetectLocal{
			BridgeInterface:     in.DetectLocal.BridgeInterface,
			InterfaceNamePrefix: in.DetectLocal.InterfaceNamePrefix,
		},
		NodePortAddresses: cloneStrings(in.NodePortAddresses),
		ConfigSyncPeriod:  in.ConfigSyncPeriod.Duration,
		IPTables: IPTables{
			MasqueradeBit:      deref(in.IPTables.MasqueradeBit),
			LocalhostNodePorts: deref(in.IPTables.LocalhostNodePorts),
		},
		NFTables: NFTables{MasqueradeBit: deref(in.NFTables.MasqueradeBit)},
		IPVS: IPVS{
			Scheduler:     in.IPVS.Scheduler,
			ExcludeCIDRs:  cloneStrings(in.IPVS.ExcludeCIDRs),
			StrictARP:     in.IPVS.StrictARP,
			TCPTimeout:    in.IPVS.TCPTimeout.Duration,
			TCPFinTimeout: in.IPVS.TCPFinTimeout.Duration,
			UDPTimeout:    in.IPVS.UDPTimeout.Duration,
		},
		Conntrack: Conntrack{
			MaxPerCore:       deref(in.Conntrack.MaxPerCore),
			Min:              deref(in.Conntrack.Min),
			TCPBeLiberal:     in.Conntrack.TCPBeLiberal,
			UDPTimeout:       in.Conntrack.UDPTimeout.Duration,
			UDPStreamTimeout: in.Conntrack.UDPStreamTimeout.Duration,
		},
		ClientConnection: ClientConnection{
			Kubeconfig:         in.ClientConnection.Kubeconfig,
			AcceptContentTypes: in.ClientConnection.AcceptContentTypes,
			ContentType:        in.ClientConnection.ContentType,
			QPS:                in.ClientConnection.QPS,
			Burst:              in.ClientConnection.Burst,
		},
		OOMScoreAdj:  deref(in.OOMScoreAdj),
		PortRange:    in.PortRange,
		FeatureGates: map[string]bool{},
		Logging:      *in.Logging.DeepCopy(),
	}
	if d := in.Conntrack.TCPEstablishedTimeout; d != nil {
		c.Conntrack.TCPEstablishedTimeout = d.Duration
	}
	if d := in.Conntrack.TCPCloseWaitTimeout; d != nil {
		c.Conntrack.TCPCloseWaitTimeout = d.Duration
	}
	for k, v := range in.FeatureGates {
		c.FeatureGates[k] = v
	}
	switch c.ProxyMode {
	case ModeNFTables:
		c.MasqueradeAll = in.NFTables.MasqueradeAll
		c.SyncPeriod, c.MinSyncPeriod = in.NFTables.SyncPeriod.Duration, in.NFTables.MinSyncPeriod.Duration
	case ModeIPVS:
		c.MasqueradeAll = in.IPTables.MasqueradeAll
		c.SyncPeriod, c.MinSyncPeriod = in.IPVS.SyncPeriod.Duration, in.IPVS.MinSyncPeriod.Duration
	default:
		c.MasqueradeAll = in.IPTables.MasqueradeAll
		c.SyncPeriod, c.MinSyncPeriod = in.IPTables.SyncPeriod.Duration, in.IPTables.MinSyncPeriod.Duration
	}
	if in.ClusterCIDR != "" {
		c.ClusterCIDRs = strings.Split(in.ClusterCIDR, ",")
	}
	return c
}

// KubeProxyConfiguration returns c as a v1alpha1 object, the inverse of the
// file conversion (mode-generic settings go to the section of c.ProxyMode).
// Use it for --write-config-to or to expose the effective configuration.
func (c *Config) KubeProxyConfiguration() *v1alpha1.KubeProxyConfiguration {
	out := &v1alpha1.KubeProxyConfiguration{
		TypeMeta:                    metav1.TypeMeta{APIVersion: APIVersion, Kind: Kind},
		FeatureGates:                map[string]bool{},
		HostnameOverride:            c.HostnameOverride,
		BindAddress:                 c.BindAddress,
		HealthzBindAddress:          c.HealthzBindAddress,
		MetricsBindAddress:          c.MetricsBindAddress,
		BindAddressHardFail:         c.BindAddressHardFail,
		EnableProfiling:             c.EnableProfiling,
		ShowHiddenMetricsForVersion: c.ShowHiddenMetricsForVersion,
		Mode:                        v1alpha1.ProxyMode(c.ProxyMode),
		IPTables: v1alpha1.KubeProxyIPTablesConfiguration{
			MasqueradeBit:      ptr(c.IPTables.MasqueradeBit),
			LocalhostNodePorts: ptr(c.IPTables.LocalhostNodePorts),
		},
		NFTables: v1alpha1.KubeProxyNFTablesConfiguration{MasqueradeBit: ptr(c.NFTables.MasqueradeBit)},
		IPVS: v1alpha1.KubeProxyIPVSConfiguration{
			Scheduler:     c.IPVS.Scheduler,
			ExcludeCIDRs:  cloneStrings(c.IPVS.ExcludeCIDRs),
			StrictARP:     c.IPVS.StrictARP,
			TCPTimeout:    metav1.Duration{Duration: c.IPVS.TCPTimeout},
			TCPFinTimeout: metav1.Duration{Duration: c.IPVS.TCPFinTimeout},
			UDPTimeout:    metav1.Duration{Duration: c.IPVS.UDPTimeout},
		},
		DetectLocalMode: v1alpha1.LocalMode(c.DetectLocalMode),
		DetectLocal: v1alpha1.DetectLocalConfiguration{
			BridgeInterface:     c.DetectLocal.BridgeInterface,
			InterfaceNamePrefix: c.DetectLocal.InterfaceNamePrefix,
		},
		ClusterCIDR:       strings.Join(c.ClusterCIDRs, ","),
		NodePortAddresses: cloneStrings(c.NodePortAddresses),
		OOMScoreAdj:       ptr(c.OOMScoreAdj),
		Conntrack: v1alpha1.KubeProxyConntrackConfiguration{
			MaxPerCore:            ptr(c.Conntrack.MaxPerCore),
			Min:                   ptr(c.Conntrack.Min),
			TCPEstablishedTimeout: &metav1.Duration{Duration: c.Conntrack.TCPEstablishedTimeout},
			TCPCloseWaitTimeout:   &metav1.Duration{Duration: c.Conntrack.TCPCloseWaitTimeout},
			TCPBeLiberal:          c.Conntrack.TCPBeLiberal,
			UDPTimeout:            metav1.Duration{Duration: c.Conntrack.UDPTimeout},
			UDPStreamTimeout:      metav1.Duration{Duration: c.Conntrack.UDPStreamTimeout},
		},
		ConfigSyncPeriod: metav1.Duration{Duration: c.ConfigSyncPeriod},
		PortRange:        c.PortRange,
		Logging:          *c.Logging.DeepCopy(),
	}
	out.ClientConnection.Kubeconfig = c.ClientConnection.Kubeconfig
	out.ClientConnection.AcceptContentTypes = c.ClientConnection.AcceptContentTypes
	out.ClientConnection.ContentType = c.ClientConnection.ContentType
	out.ClientConnection.QPS = c.ClientConnection.QPS
	out.ClientConnection.Burst = c.ClientConnection.Burst
	for k, v := range c.FeatureGates {
		out.FeatureGates[k] = v
	}
	sync, minSync := metav1.Duration{Duration: c.SyncPeriod}, metav1.Duration{Duration: c.MinSyncPeriod}
	switch c.ProxyMode {
	case ModeNFTables:
		out.NFTables.MasqueradeAll = c.MasqueradeAll
		out.NFTables.MasqueradeBit = ptr(c.MasqueradeBit())
		out.NFTables.SyncPeriod, out.NFTables.MinSyncPeriod = sync, minSync
	case ModeIPVS:
		out.IPTables.MasqueradeAll = c.MasqueradeAll
		out.IPVS.SyncPeriod, out.IPVS.MinSyncPeriod = sync, minSync
	default:
		out.IPTables.MasqueradeAll = c.MasqueradeAll
		out.IPTables.SyncPeriod, out.IPTables.MinSyncPeriod = sync, minSync
	}
	return out
}

// EncodeYAML returns c as a KubeProxyConfiguration YAML document. Decode
// reads it back to an equivalent Config, except that disabled ("") healthz
// and metrics addresses come back defaulted, as they would in kube-proxy.
func (c *Config) EncodeYAML() ([]byte, error) {
	return yaml.Marshal(c.KubeProxyConfiguration())
}

// yamlErrorDetail strips go-yaml's "yaml: unmarshal errors:" preamble,
// keeping the "line N: ..." details.
func yamlErrorDetail(err error) string {
	var lines []string
	for l := range strings.Lines(err.Error()) {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasSuffix(l, "unmarshal errors:") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "; ")
}

func normalizeHostname(s string) string { return strings.ToLower(strings.TrimSpace(s)) }

func deref[T any](p *T) T {
	if p == nil {
		var zero T
		return zero
	}
	return *p
}

func cloneStrings(s []string) []string {
	if s == nil {
		return nil
	}
	return append([]string(nil), s...)
}
