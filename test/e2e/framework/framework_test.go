//go:build e2e

package framework

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

const linkNS = "dsproxy-e2e-fw"

func TestMain(m *testing.M) { Main(m) }

// TestDualStackEndpointSlices checks what dsproxy's e2e tests rely on: a
// RequireDualStack Service gets a ClusterIP of each family, and
// kube-controller-manager builds IPv4 and IPv6 EndpointSlices from pods whose
// status the test wrote.
func TestDualStackEndpointSlices(t *testing.T) {
	cp := Start(t, linkNS)
	ctx := context.Background()
	ns := cp.Namespace(t, "fw")

	node := "node-" + ns
	if _, err := cp.CreateNode(node, "192.0.2.10", "2001:db8::10"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Client.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}) })

	sel := map[string]string{"app": "web"}
	svc, err := cp.Client.CoreV1().Services(ns).Create(ctx, DualStackService(ns, "web", sel, 80, 8080), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(svc.Spec.ClusterIPs) != 2 {
		t.Fatalf("clusterIPs = %v, want one per family", svc.Spec.ClusterIPs)
	}
	v4, v6 := netip.MustParseAddr(svc.Spec.ClusterIPs[0]), netip.MustParseAddr(svc.Spec.ClusterIPs[1])
	if !netip.MustParsePrefix("10.96.0.0/16").Contains(v4) || !netip.MustParsePrefix("fd00:96::/112").Contains(v6) {
		t.Fatalf("clusterIPs = %v, not in the service CIDRs", svc.Spec.ClusterIPs)
	}
	t.Logf("service clusterIPs %v", svc.Spec.ClusterIPs)

	pods := []struct {
		name  string
		ips   []string
		ready bool
	}{
		{"a", []string{"10.64.0.10", "fd00:64::10"}, true},
		{"b", []string{"10.64.0.11", "fd00:64::11"}, true},
		{"c", []string{"10.64.0.12", "fd00:64::12"}, false},
	}
	for _, p := range pods {
		if _, err := cp.CreatePodWithIPs(ns, p.name, node, p.ips, sel, p.ready); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		family corev1.IPFamily
		want   []string
	}{
		{corev1.IPv4Protocol, []string{"10.64.0.10", "10.64.0.11", "10.64.0.12"}},
		{corev1.IPv6Protocol, []string{"fd00:64::10", "fd00:64::11", "fd00:64::12"}},
	} {
		// all three pods are endpoints, the first two ready
		eps, err := cp.WaitForEndpointSlicesFunc(ns, "web", tc.family, func(eps []discoveryv1.EndpointSlice) bool {
			return slices.Equal(EndpointAddresses(eps), tc.want) && slices.Equal(ReadyAddresses(eps), tc.want[:2])
		})
		if err != nil {
			t.Fatalf("%s endpoints = %v (ready %v), want %v (ready %v): %v", tc.family,
				EndpointAddresses(eps), ReadyAddresses(eps), tc.want, tc.want[:2], err)
		}
		for _, s := range eps {
			for _, e := range s.Endpoints {
				if e.NodeName == nil || *e.NodeName != node {
					t.Errorf("endpoint %v: nodeName %v, want %s", e.Addresses, e.NodeName, node)
				}
			}
			if len(s.Ports) != 1 || s.Ports[0].Port == nil || *s.Ports[0].Port != 8080 {
				t.Errorf("slice %s ports = %v, want 8080", s.Name, s.Ports)
			}
		}
	}

	// Flip pod c to ready: both families follow.
	c, err := cp.Client.CoreV1().Pods(ns).Get(ctx, "c", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.SetPodStatus(c, pods[2].ips, true); err != nil {
		t.Fatal(err)
	}
	for _, f := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
		if _, err := cp.WaitForEndpointSlices(ns, "web", f, 3); err != nil {
			t.Fatal(err)
		}
	}

	// Delete pod a: both families drop it.
	if err := cp.DeletePod(ns, "a"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
		if _, err := cp.WaitForEndpointSlices(ns, "web", f, 2); err != nil {
			t.Fatal(err)
		}
	}

	// node-ipam-controller gives the node one podCIDR per family.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, Timeout, true, func(ctx context.Context) (bool, error) {
		n, err := cp.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		return err == nil && len(n.Spec.PodCIDRs) == 2, nil
	})
	if err != nil {
		t.Errorf("node podCIDRs not allocated: %v", err)
	}
}

// TestServerDryRun checks that manifests can be validated against the real
// API server with kubectl apply --dry-run=server.
func TestServerDryRun(t *testing.T) {
	cp := Start(t)
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	write(t, good, `apiVersion: v1
kind: Service
metadata: {name: dry, namespace: default}
spec:
  ipFamilyPolicy: RequireDualStack
  selector: {app: dry}
  ports: [{port: 80, targetPort: 8080}]
`)
	write(t, bad, `apiVersion: v1
kind: Service
metadata: {name: dry, namespace: default}
spec:
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv4]
  ports: [{port: 80}]
`)
	if out, err := cp.Kubectl("apply", "--dry-run=server", "-f", good); err != nil || !strings.Contains(out, "server dry run") {
		t.Fatalf("dry-run of a valid manifest: %v\n%s", err, out)
	}
	if out, err := cp.Kubectl("apply", "--dry-run=server", "-f", bad); err == nil {
		t.Fatalf("dry-run of an invalid manifest passed:\n%s", out)
	}
	if _, err := cp.Client.CoreV1().Services("default").Get(context.Background(), "dry", metav1.GetOptions{}); err == nil {
		t.Fatal("dry run created the service")
	}
}

// TestLinkedNamespace checks that a linked namespace reaches the API server
// over both families with the link kubeconfigs.
func TestLinkedNamespace(t *testing.T) {
	cp := Start(t, linkNS)
	for _, kc := range []string{cp.LinkKubeconfig, cp.LinkKubeconfig + "6"} {
		out, err := exec.Command("ip", "netns", "exec", linkNS, filepath.Join(cp.Bin, "kubectl"),
			"--kubeconfig", kc, "get", "--raw", "/readyz").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "ok" {
			t.Errorf("readyz from %s with %s: %v %s", linkNS, kc, err, out)
		}
	}
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
