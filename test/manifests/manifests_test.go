// Package manifests checks the deployment manifests in deploy/ offline: they decode
// strictly into their API types, the DaemonSet's arguments and the ConfigMap's
// KubeProxyConfiguration are accepted by dsproxy's own configuration parser. The
// e2e suite additionally validates them against a real API server (dry-run).
package manifests

import (
	"bytes"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/dsproxy/dsproxy/pkg/app"
	"github.com/dsproxy/dsproxy/pkg/config"
)

func documents(t *testing.T, path string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, d := range bytes.Split(data, []byte("\n---\n")) {
		if len(bytes.TrimSpace(d)) > 0 {
			out = append(out, d)
		}
	}
	return out
}

func strict(t *testing.T, doc []byte, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(doc, into); err != nil {
		t.Fatalf("decoding %T: %v", into, err)
	}
}

// configMap decodes deploy/configmap.yaml and its config.conf.
func configMap(t *testing.T) (v1.ConfigMap, *config.Config) {
	t.Helper()
	var cm v1.ConfigMap
	strict(t, documents(t, "../../deploy/configmap.yaml")[0], &cm)
	cfg, err := config.Decode([]byte(cm.Data["config.conf"]))
	if err != nil {
		t.Fatal(err)
	}
	return cm, cfg
}

func TestConfigMapIsAValidKubeProxyConfiguration(t *testing.T) {
	_, cfg := configMap(t)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.ProxyMode != config.ModeNFTables || len(cfg.ClusterCIDRs) != 2 {
		t.Fatalf("unexpected config: mode %q clusterCIDRs %v", cfg.ProxyMode, cfg.ClusterCIDRs)
	}
}

// The API server must be reached without a Service proxy: the in-cluster
// configuration's address is the "kubernetes" Service's ClusterIP, which only
// this proxy would serve. So the config names the ConfigMap's kubeconfig.conf
// (as kubeadm's kube-proxy does), whose server is a host name or a node address,
// with the pod's ServiceAccount token and CA; and the pod resolves names with the
// node's resolver, not the cluster DNS (a Service too).
func TestAPIServerReachedWithoutAProxy(t *testing.T) {
	cm, cfg := configMap(t)
	const dir = "/var/lib/dsproxy/"
	kc := cfg.ClientConnection.Kubeconfig
	if !strings.HasPrefix(kc, dir) || cm.Data[strings.TrimPrefix(kc, dir)] == "" {
		t.Fatalf("clientConnection.kubeconfig %q: want a key of the ConfigMap, mounted at %s", kc, dir)
	}
	// The token and CA paths must be the ServiceAccount's; here they point at
	// stand-ins so that the client configuration builds as the daemon builds it.
	const sa = "/var/run/secrets/kubernetes.io/serviceaccount/"
	raw := cm.Data[strings.TrimPrefix(kc, dir)]
	if !strings.Contains(raw, "tokenFile: "+sa+"token") || !strings.Contains(raw, "certificate-authority: "+sa+"ca.crt") {
		t.Fatalf("kubeconfig.conf does not use the ServiceAccount's token and CA:\n%s", raw)
	}
	tmp := t.TempDir()
	if err := os.WriteFile(tmp+"/token", []byte("t"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tmp+"/ca.crt", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tmp+"/kubeconfig.conf", []byte(strings.ReplaceAll(raw, sa, tmp+"/")), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.ClientConnection.Kubeconfig = tmp + "/kubeconfig.conf"
	rc, err := app.RESTConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(rc.Host)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" {
		t.Fatalf("API server %q: want https://<host>:<port>", rc.Host)
	}
	if h := u.Hostname(); h == "kubernetes" || strings.HasPrefix(h, "kubernetes.default") || strings.Contains(h+".", ".svc.") {
		t.Errorf("API server %s is the kubernetes Service's name, resolved by the cluster DNS (a Service)", rc.Host)
	}
	if a, err := netip.ParseAddr(u.Hostname()); err == nil {
		for _, p := range []string{"10.96.0.0/16", "fd00:10:96::/112"} { // kind's service CIDRs
			if netip.MustParsePrefix(p).Contains(a) {
				t.Errorf("API server %s is a Service address", rc.Host)
			}
		}
	}

	var ds appsv1.DaemonSet
	strict(t, documents(t, "../../deploy/daemonset.yaml")[0], &ds)
	if p := ds.Spec.Template.Spec.DNSPolicy; p == v1.DNSClusterFirstWithHostNet {
		t.Errorf("dnsPolicy %s: names would resolve through the cluster DNS Service", p)
	}
}

func TestDaemonSet(t *testing.T) {
	var ds appsv1.DaemonSet
	strict(t, documents(t, "../../deploy/daemonset.yaml")[0], &ds)
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork || len(spec.Containers) != 1 {
		t.Fatal("dsproxy must run with host networking, one container")
	}
	c := spec.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.Privileged == nil || *sc.Privileged || sc.Capabilities == nil {
		t.Fatal("the container must not be privileged and must name its capabilities")
	}
	if !contains(sc.Capabilities.Add, "NET_ADMIN") {
		t.Fatalf("capabilities %v lack NET_ADMIN", sc.Capabilities.Add)
	}
	if ds.Spec.Selector == nil || ds.Spec.Selector.MatchLabels["k8s-app"] != ds.Spec.Template.Labels["k8s-app"] {
		t.Fatal("selector does not match the template labels")
	}
	// The arguments must parse as dsproxy flags, with the config file from the
	// ConfigMap in place.
	var cm v1.ConfigMap
	strict(t, documents(t, "../../deploy/configmap.yaml")[0], &cm)
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/config.conf", []byte(cm.Data["config.conf"]), 0o600); err != nil {
		t.Fatal(err)
	}
	parse := func(cmd []string) *config.Config {
		t.Helper()
		var args []string
		for _, a := range cmd[1:] {
			a = strings.ReplaceAll(a, "$(NODE_NAME)", "node-a")
			args = append(args, strings.ReplaceAll(a, "/var/lib/dsproxy", dir))
		}
		cfg, err := config.Parse(args)
		if err != nil {
			t.Fatalf("DaemonSet args %v: %v", args, err)
		}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	// The health server answers once the Node (30 s) and, with NodeCIDR, its
	// PodCIDRs (5 min) are there: no probe may restart the pod before.
	if sp := c.StartupProbe; sp == nil || sp.PeriodSeconds*sp.FailureThreshold < 330 {
		t.Errorf("startup probe %+v: want one that waits at least 5.5 min", sp)
	}
	if lp := c.LivenessProbe; lp == nil || lp.HTTPGet == nil || lp.HTTPGet.Path != "/livez" {
		t.Errorf("liveness probe %+v: want /livez", lp)
	}
	cfg := parse(c.Command)
	if cfg.HostnameOverride != "node-a" || !cfg.CleanupKubeProxy || cfg.InitOnly {
		t.Fatalf("proxy container: hostname override %q, --cleanup-kube-proxy %v, --init-only %v", cfg.HostnameOverride, cfg.CleanupKubeProxy, cfg.InitOnly)
	}
	// The init container does the privileged setup, with the same configuration.
	if len(spec.InitContainers) != 1 {
		t.Fatalf("%d init containers, want 1 (dsproxy --init-only)", len(spec.InitContainers))
	}
	ic := spec.InitContainers[0]
	if ic.Image != c.Image || ic.SecurityContext == nil || ic.SecurityContext.Privileged == nil || !*ic.SecurityContext.Privileged {
		t.Fatalf("init container: image %q (proxy %q), want the same, privileged", ic.Image, c.Image)
	}
	if init := parse(ic.Command); !init.InitOnly || init.ProxyMode != cfg.ProxyMode {
		t.Fatalf("init container: --init-only %v, mode %s (proxy: %s)", init.InitOnly, init.ProxyMode, cfg.ProxyMode)
	}
}

func TestRBACIsReadOnlyExceptEvents(t *testing.T) {
	docs := documents(t, "../../deploy/rbac.yaml")
	var role rbacv1.ClusterRole
	for _, d := range docs {
		if strings.Contains(string(d), "\nkind: ClusterRole\n") {
			strict(t, d, &role)
		}
	}
	if len(role.Rules) == 0 {
		t.Fatal("no ClusterRole found")
	}
	for _, r := range role.Rules {
		events := contains(r.Resources, "events")
		for _, v := range r.Verbs {
			if !events && v != "get" && v != "list" && v != "watch" {
				t.Errorf("rule %v grants %q", r.Resources, v)
			}
		}
	}
}

func contains[T ~string](list []T, s T) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
