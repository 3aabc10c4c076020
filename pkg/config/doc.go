// Package config resolves dsproxy's configuration from kube-proxy v1.36
// compatible command-line flags and KubeProxyConfiguration files, so that an
// existing kube-proxy DaemonSet (args) and ConfigMap (config.conf) work
// unchanged.
//
// Typical use:
//
//	opts := config.NewOptions()
//	fs := pflag.NewFlagSet("dsproxy", pflag.ContinueOnError)
//	opts.AddFlags(fs)
//	if err := fs.Parse(os.Args[1:]); err != nil { ... }
//	cfg, err := opts.Complete(fs)   // load --config, apply precedence and defaults
//	if err == nil { err = cfg.Validate() }
//	for _, w := range cfg.Warnings { log(w) }
//
// # Precedence (kube-proxy v1.36, cmd/kube-proxy/app/options.go Complete)
//
// Without --config, every flag applies on top of the kube-proxy v1alpha1
// defaults.
//
// With --config, the file replaces the whole configuration: every flag that
// maps onto a KubeProxyConfiguration field is ignored, even when given
// explicitly (dsproxy reports each ignored flag in Config.Warnings; kube-proxy
// is silent). The only exceptions are:
//
//   - --hostname-override: a non-empty flag value overrides the file;
//   - logging flags (-v/--v, --vmodule, --logging-format,
//     --log-flush-frequency, --log-{text,json}-split-stream,
//     --log-{text,json}-info-buffer-size) that were explicitly set override
//     the file; --vmodule entries from the flag are placed before the file's;
//   - flags with no file equivalent always apply: --master, --cleanup,
//     --init-only, --write-config-to, --version, and the dsproxy-only
//     --node-ip and --cleanup-kube-proxy.
//
// In particular --kubeconfig, --proxy-mode, --cluster-cidr and
// --feature-gates are ignored when --config is given, exactly as in kube-proxy.
//
// # Deviations from kube-proxy
//
//   - The default proxy mode is nftables (kube-proxy: iptables). As in
//     kube-proxy, a file with mode "" takes its sync periods, masqueradeAll and
//     masqueradeBit from the iptables section, then the mode is defaulted
//     (Config.ModeDefaulted); the nftables section is then neither used nor
//     checked. /configz shows the settings in use in the nftables section.
//   - An empty metrics bind address (--metrics-port=0) means "disabled", as
//     for healthz; kube-proxy v1.36 rejects it. An empty --cluster-cidr means
//     "none"; kube-proxy rejects it.
//   - The json log format is registered by this package
//     (k8s.io/component-base/logs/json/register), as by kube-proxy's main, so
//     --log-json-split-stream and --log-json-info-buffer-size exist wherever
//     the flags are.
//   - ClusterCIDRs are validated in every detect-local mode, not only in
//     ClusterCIDR mode.
//   - Of the featureGates, which are checked as kube-proxy checks them
//     (FeatureGate, with its gate list generated from kube-proxy), only a few
//     act: the logging gates, ComponentFlagz and ComponentStatusz, and
//     AllowServiceExternalIPs=false, which makes the proxy ignore Services'
//     externalIPs, as kube-proxy does; kube-proxy v1.36's other proxy gates
//     are locked to their defaults. NativeHistograms, which kube-proxy applies
//     to its metrics, does nothing.
package config
