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

// NodeIPSpec is the node-IP override: --node-ip in KEP-3705 syntax, else a specific
// --bind-address (kube-proxy treats a non-unspecified bind address as the node IP).
func NodeIPSpec(cfg *config.Config) (nodeip.Spec, error) {
	s := cfg.NodeIP
	if s == "" {
		if a, err := netip.ParseAddr(cfg.BindAddress); err == nil && !a.IsUnspecified() {
			s = a.String()
		}
	}
	spec, err := nodeip.ParseNodeIP(s)
	if err != nil {
		return nodeip.Spec{}, fmt.Errorf("--node-ip: %w", err)
	}
	return spec, nil
}

// waitForNode fetches the proxy's Node, retrying for up to timeout (the kubelet may
// not have registered it yet). A missing Node is not fatal: node IPs then come from
// local interfaces.
func waitForNode(ctx context.Context, client *kubeclient.Client, name string, timeout time.Duration) *v1.Node {
	deadline := time.Now().Add(timeout)
	for {
		node, err := client.Node(ctx, name)
		if err == nil {
			return node
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			klog.InfoS("Node object not found; taking node IPs from local interfaces", "node", name, "err", err)
			return nil
		}
		time.Sleep(time.Second)
	}
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
