//go:build e2e && netns

package e2e

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dsproxy/dsproxy/test/e2e/framework"
)

// TestAwaitEarlierLoads holds an earlier load's namespace in deletion with a
// finalizer on one of its Services: awaitEarlierLoads must wait while it is there
// and return once it is gone.
func TestAwaitEarlierLoads(t *testing.T) {
	cp := framework.Start(t)
	ctx := context.Background()
	c := cp.Client
	ns, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-await-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const hold = "dsproxy.test/hold"
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "held", Finalizers: []string{hold}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}
	if _, err := c.CoreV1().Services(ns.Name).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	release := func() error {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": nil}})
		_, err := c.CoreV1().Services(ns.Name).Patch(ctx, "held", types.MergePatchType, patch, metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	t.Cleanup(func() {
		_ = release()
		_ = c.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	if err := c.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	var werr error
	go func() { werr = awaitEarlierLoads(wctx, t.Logf, c); close(done) }()
	t.Cleanup(func() {
		// No log from the waiter after the test has ended.
		cancel()
		<-done
	})
	select {
	case <-done:
		t.Fatalf("returned (%v) while namespace %s was still being deleted", werr, ns.Name)
	case <-time.After(3 * time.Second):
	}
	if _, err := c.CoreV1().Namespaces().Get(ctx, ns.Name, metav1.GetOptions{}); err != nil {
		t.Fatalf("namespace %s should still be there, held by the Service's finalizer: %v", ns.Name, err)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		if werr != nil {
			t.Fatal(werr)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("still waiting 2 min after namespace %s's last Service was released", ns.Name)
	}
	if _, err := c.CoreV1().Namespaces().Get(ctx, ns.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("returned while namespace %s is still there (%v)", ns.Name, err)
	}
}
