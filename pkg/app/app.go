// Package app assembles the dsproxy daemon from its configuration: the API client,
// node addresses, one proxier per usable family with its kernel backend, the
// meta-proxier, the informers, and the health and metrics servers.
package app

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/config"
	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/kubeclient"
	"github.com/dsproxy/dsproxy/pkg/nodeip"
	"github.com/dsproxy/dsproxy/pkg/proxier"
)

// NodeName returns the name of the node dsproxy runs on: --hostname-override, else
// the host name, lower-cased as kube-proxy does.
func NodeName(cfg *config.Config) (string, error) {
	if cfg.HostnameOverride != "" {
		return strings.ToLower(strings.TrimSpace(cfg.HostnameOverride)), nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("finding the node name (set --hostname-override): %w", err)
	}
	return strings.ToLower(strings.TrimSpace(h)), nil
}

// RESTConfig builds the API client configuration: --kubeconfig / --master, else the
// in-cluster service account.
func RESTConfig(cfg *config.Config) (*rest.Config, error) {
	cc := cfg.ClientConnection
	var rc *rest.Config
	var err error
	if cc.Kubeconfig == "" && cfg.Master == "" {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.BuildConfigFromFlags(cfg.Master, cc.Kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("API client configuration: %w", err)
	}
	rc.QPS, rc.Burst = cc.QPS, int(cc.Burst)
	if cc.ContentType != "" {
		rc.ContentType = cc.ContentType
	}
	if cc.AcceptContentTypes != "" {
		rc.AcceptContentTypes = cc.AcceptContentTypes
	}
	rc.UserAgent = "dsproxy"
	return rc, nil
}

// NodeIPSpec is dsproxy's node-IP override: --node-ip in KEP-3705 syntax.
func NodeIPSpec(cfg *config.Config) (nodeip.Spec, error) {
	spec, err := nodeip.ParseNodeIP(cfg.NodeIP)
	if err != nil {
		return nodeip.Spec{}, fmt.Errorf("--node-ip: %w", err)
	}
	return spec, nil
}

// bindNodeIP is a specific --bind-address, which kube-proxy takes as the node IP
// of its family (the primary one), whatever the Node lists; invalid when
// --bind-address is unspecified or --node-ip is set.
func bindNodeIP(cfg *config.Config) netip.Addr {
	if cfg.NodeIP != "" {
		return netip.Addr{}
	}
	if a, ok := family.ParseIP(cfg.BindAddress); ok && !a.IsUnspecified() {
		return a
	}
	return netip.Addr{}
}

// familyNodeIPs are the node IPs per family as kube-proxy v1.36 takes them: the
// Node's (after --node-ip), a specific --bind-address overriding its family's.
func familyNodeIPs(ips nodeip.IPs, bind netip.Addr) map[*family.Family]netip.Addr {
	out := map[*family.Family]netip.Addr{}
	for _, f := range family.All {
		if ip := ips.For(f); ip.IsValid() {
			out[f] = ip
		}
	}
	if f := family.Of(bind); f != nil {
		out[f] = bind
	}
	return out
}

// ipv6Disabled says why the kernel cannot carry IPv6, as kube-proxy checks it
// (no /proc/net/if_inet6, or net.ipv6.conf.all.disable_ipv6 = 1), or "".
func ipv6Disabled(procDir string) string {
	if _, err := os.Stat(filepath.Join(procDir, "net/if_inet6")); err != nil {
		return "no kernel support for IPv6"
	}
	if b, err := os.ReadFile(filepath.Join(procDir, "sys/net/ipv6/conf/all/disable_ipv6")); err == nil && strings.TrimSpace(string(b)) == "1" {
		return "IPv6 disabled in the kernel (net.ipv6.conf.all.disable_ipv6 = 1)"
	}
	return ""
}

// familyNodeIP returns the node IP family f is proxied with. A family without one
// is proxied, as kube-proxy proxies every family the kernel supports, with the
// loopback address as its node IP (it only decides whether loadBalancerSourceRanges
// hold the node and what "primary" NodePort addresses are); unless dsproxy's
// --node-ip asks for a single-stack node of the other family, or the kernel has no
// IPv6. ok is false, with the reason, for a family not proxied.
func familyNodeIP(f *family.Family, ips nodeip.IPs, nodeIPs map[*family.Family]netip.Addr, procDir string) (ip netip.Addr, ok bool, why string) {
	if ip, ok := nodeIPs[f]; ok {
		return ip, true, ""
	}
	if e, single := ips.Spec.SingleStack(); single && e.Family != f {
		return netip.Addr{}, false, ips.Usable(f).Error()
	}
	if f == family.IPv6 {
		if why := ipv6Disabled(procDir); why != "" {
			return netip.Addr{}, false, why
		}
	}
	if f == family.IPv6 {
		return netip.IPv6Loopback(), true, ""
	}
	return netip.AddrFrom4([4]byte{127, 0, 0, 1}), true, ""
}

// waitForNode fetches the proxy's Node, retrying for up to timeout until it
// exists and lists an address, as kube-proxy v1.36's NodeManager waits for the
// node IPs (the kubelet may not have registered the Node yet; a cloud node gets
// its addresses from the cloud controller). Neither is fatal, as in kube-proxy:
// the last Node seen, or nil, is returned, and the node IPs are then loopback
// (or, with --node-ip, from local interfaces) until the Node lists addresses.
// The error is ctx's, when it ends first.
func waitForNode(ctx context.Context, client *kubeclient.Client, name string, timeout time.Duration) (*v1.Node, error) {
	deadline := time.Now().Add(timeout)
	var node *v1.Node
	for {
		n, err := client.Node(ctx, name)
		if err == nil {
			node = n
			if hasNodeIPs(n) {
				return n, nil
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if time.Now().After(deadline) {
			if node == nil {
				klog.ErrorS(err, "Timed out waiting for node to exist", "node", name)
			} else {
				klog.ErrorS(nil, "Timed out waiting for node to be assigned IPs", "node", name)
			}
			return node, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// hasNodeIPs reports whether the Node lists an InternalIP or ExternalIP that
// node IP selection can use, as kube-proxy takes node IPs from those.
func hasNodeIPs(n *v1.Node) bool {
	addrs, _ := nodeip.ParseAddresses(n.Status.Addresses)
	return len(addrs) > 0
}

// podCIDRsTimeout is how long, past the wait for the Node, the daemon waits for
// the Node's PodCIDRs with --detect-local-mode=NodeCIDR before giving up, as
// kube-proxy v1.36 does.
const podCIDRsTimeout = 5 * time.Minute

// waitForPodCIDRs polls get every poll until the Node has PodCIDRs, for up to
// timeout. Without them NodeCIDR mode cannot tell local traffic, so, as kube-proxy,
// the daemon then fails to start (and its pod restarts) rather than serve without.
func waitForPodCIDRs(ctx context.Context, get func(context.Context) (*v1.Node, error), timeout, poll time.Duration) (*v1.Node, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var node *v1.Node
	for {
		if n, err := get(ctx); err == nil {
			node = n
			if len(podCIDRs(n)) > 0 {
				return n, nil
			}
		}
		select {
		case <-ctx.Done():
			if node == nil {
				return nil, fmt.Errorf("--detect-local-mode=NodeCIDR: timed out after %v waiting for the Node object to exist", timeout)
			}
			return nil, fmt.Errorf("--detect-local-mode=NodeCIDR: timed out after %v waiting for PodCIDR allocation on node %q", timeout, node.Name)
		case <-time.After(poll):
		}
	}
}

// podCIDRs are the Node's spec.podCIDRs, or its older spec.podCIDR.
func podCIDRs(node *v1.Node) []string {
	if node == nil {
		return nil
	}
	if len(node.Spec.PodCIDRs) == 0 && node.Spec.PodCIDR != "" {
		return []string{node.Spec.PodCIDR}
	}
	return node.Spec.PodCIDRs
}

// localDetector derives one family's local-traffic detection from the
// configuration, as kube-proxy does; a mode that cannot work for the family falls
// back to none with a log line saying why.
func localDetector(cfg *config.Config, f *family.Family, node *v1.Node) proxier.LocalDetector {
	switch config.LocalMode(cfg.DetectLocalMode) {
	case config.LocalModeClusterCIDR:
		if cidrs := familyCIDRs(f, cfg.ClusterCIDRs); len(cidrs) > 0 {
			return proxier.LocalDetector{Mode: proxier.LocalModeClusterCIDR, CIDRs: cidrs}
		}
	case config.LocalModeNodeCIDR:
		if c := familyCIDRs(f, podCIDRs(node)); len(c) > 0 {
			return proxier.LocalDetector{Mode: proxier.LocalModeNodeCIDR, CIDRs: c}
		}
	case config.LocalModeBridgeInterface:
		return proxier.LocalDetector{Mode: proxier.LocalModeBridgeInterface, Interface: cfg.DetectLocal.BridgeInterface}
	case config.LocalModeInterfaceNamePrefix:
		return proxier.LocalDetector{Mode: proxier.LocalModeInterfaceNamePrefix, Interface: cfg.DetectLocal.InterfaceNamePrefix}
	default:
		return proxier.LocalDetector{}
	}
	klog.InfoS("No local-traffic detection for this family: no CIDR of the family for the mode",
		"ipFamily", f.Name, "detectLocalMode", cfg.DetectLocalMode)
	return proxier.LocalDetector{}
}

func familyCIDRs(f *family.Family, strs []string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range strs {
		if p, err := config.ParseCIDR(s); err == nil && f.ContainsPrefix(p) {
			out = append(out, p)
		}
	}
	return out
}

// errNoFamily is returned when no family is usable on the node.
var errNoFamily = errors.New("no IP family is usable on this node")
