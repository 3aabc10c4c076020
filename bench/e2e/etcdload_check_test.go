//go:build e2e && netns

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dsproxy/dsproxy/test/e2e/framework"
)

// TestEtcdLoad checks -load=etcd against the real control plane: what it writes
// into etcd, the API server serves as Services, EndpointSlices and IPAddresses
// of its own; its allocators refuse the ClusterIPs and NodePorts the load holds;
// the cleanup leaves none of it, and frees the NodePorts.
func TestEtcdLoad(t *testing.T) {
	cp := framework.Start(t)
	ctx := context.Background()
	saved := *flagLoad
	*flagLoad = "etcd"
	t.Cleanup(func() { *flagLoad = saved })
	const n = 300
	ld, err := newLoad(t, cp, []int{n}, 0)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := ld.grow(ctx, n); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d Services written into etcd and served in %v", n, time.Since(start).Round(time.Millisecond))

	svcs, err := ld.client.CoreV1().Services(ld.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slices, err := ld.client.DiscoveryV1().EndpointSlices(ld.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(svcs.Items) != n+1 || len(slices.Items) != 2*n+2 {
		t.Fatalf("the API server lists %d Services and %d slices, want %d and %d", len(svcs.Items), len(slices.Items), n+1, 2*n+2)
	}
	// Defaulted as the API server defaults a Service it creates.
	tmpl := ld.etcd.svc[corev1.ServiceTypeNodePort].Spec
	var held corev1.ServicePort
	nodePorts := 0
	for _, s := range svcs.Items {
		if s.Name == "probe" {
			continue
		}
		sp := s.Spec
		if *sp.IPFamilyPolicy != corev1.IPFamilyPolicyRequireDualStack || len(sp.IPFamilies) != 2 || len(sp.ClusterIPs) != 2 ||
			sp.SessionAffinity != tmpl.SessionAffinity || *sp.InternalTrafficPolicy != *tmpl.InternalTrafficPolicy || sp.Ports[0].TargetPort != tmpl.Ports[0].TargetPort {
			t.Errorf("Service %s: spec %+v, want one like %+v", s.Name, sp, tmpl)
		}
		if s.UID == "" || s.ResourceVersion == "" || s.CreationTimestamp.IsZero() {
			t.Errorf("Service %s: uid %q, resourceVersion %q, created %v", s.Name, s.UID, s.ResourceVersion, s.CreationTimestamp)
		}
		if sp.Type == corev1.ServiceTypeNodePort {
			nodePorts++
			held = sp.Ports[0]
			if sp.ExternalTrafficPolicy != tmpl.ExternalTrafficPolicy {
				t.Errorf("Service %s: externalTrafficPolicy %q, want %q", s.Name, sp.ExternalTrafficPolicy, tmpl.ExternalTrafficPolicy)
			}
		}
	}
	if want := (n + ld.w.NodePortEvery - 1) / ld.w.NodePortEvery; nodePorts != want {
		t.Errorf("%d NodePort Services, want %d", nodePorts, want)
	}
	for _, es := range slices.Items {
		if es.Generation != 1 || len(es.Endpoints) == 0 || es.Labels["kubernetes.io/service-name"] == "" {
			t.Errorf("slice %s: generation %d, %d endpoints, labels %v", es.Name, es.Generation, len(es.Endpoints), es.Labels)
		}
	}

	// The allocators know what the load holds.
	last := ld.ips[n-1]
	for fi, f := range fams {
		s := ld.serviceToCreate(fmt.Sprintf("same-ip-%d", fi), corev1.ServiceTypeClusterIP)
		s.Spec.IPFamilyPolicy = nil
		s.Spec.IPFamilies = []corev1.IPFamily{corev1.IPFamily(f.Name)}
		s.Spec.ClusterIPs = []string{last[fi].String()}
		s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
		if _, err := ld.client.CoreV1().Services(ld.ns).Create(ctx, s, metav1.CreateOptions{}); err == nil {
			t.Errorf("the API server gave a new Service ClusterIP %s, which svc-%d holds", last[fi], n-1)
		} else if !apierrors.IsInvalid(err) {
			t.Errorf("a new Service with svc-%d's ClusterIP %s: %v, want it invalid", n-1, last[fi], err)
		}
	}
	samePort := func(name string) (*corev1.Service, error) {
		s := ld.serviceToCreate(name, corev1.ServiceTypeNodePort)
		s.Spec.Ports[0].NodePort = held.NodePort
		return ld.client.CoreV1().Services(ld.ns).Create(ctx, s, metav1.CreateOptions{})
	}
	if _, err := samePort("same-port"); err == nil {
		t.Errorf("the API server gave a new Service NodePort %d, which the load holds", held.NodePort)
	} else if !apierrors.IsInvalid(err) {
		t.Errorf("a new Service with the load's NodePort %d: %v, want it invalid", held.NodePort, err)
	}

	// The check that nothing replaced the load's IPAddresses can fail: one
	// deleted through the API server (its repair loop recreates it, with
	// another UID) is found.
	if err := ld.checkIPAddresses(ctx); err != nil {
		t.Fatal(err)
	}
	gone := ld.ips[1][0].String()
	if err := ld.client.NetworkingV1().IPAddresses().Delete(ctx, gone, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := ld.checkIPAddresses(ctx); err == nil || !strings.Contains(err.Error(), gone) {
		t.Errorf("after deleting IPAddress %s: checkIPAddresses gave %v, want an error naming it", gone, err)
	}

	if err := ld.cleanEtcd(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		svcs, nSlices, err := ld.served(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, ipErr := ld.client.NetworkingV1().IPAddresses().Get(ctx, last[1].String(), metav1.GetOptions{})
		if svcs == 1 && nSlices == 2 && apierrors.IsNotFound(ipErr) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the cleanup: %d Services, %d slices, IPAddress %s: %v", svcs, nSlices, last[1], ipErr)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Nor does the API server's repair loop bring any of the load's IPAddresses
	// back (it recreates one for a Service it still sees).
	time.Sleep(2 * time.Second)
	ips, err := ld.client.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ip := range ips.Items {
		if r := ip.Spec.ParentRef; r != nil && r.Namespace == ld.ns && r.Name != "probe" {
			t.Errorf("after the cleanup: IPAddress %s of Service %s (created %v)", ip.Name, r.Name, ip.CreationTimestamp)
		}
	}
	// The freed NodePort can be had again (the allocator re-reads the range
	// when its write of the old one conflicts).
	s, err := samePort("freed-port")
	if err != nil {
		t.Fatalf("NodePort %d after the cleanup: %v", held.NodePort, err)
	}
	if err := ld.client.CoreV1().Services(ld.ns).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}
