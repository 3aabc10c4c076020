//go:build e2e && netns

package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/dsproxy/dsproxy/test/e2e/framework"
)

// TestEventControlPlaneSched checks, against the real control plane, that
// etcd's and kube-apiserver's scheduler accounting can be read, and that the
// event log records it with each event while armed, and only then.
func TestEventControlPlaneSched(t *testing.T) {
	cp := framework.Start(t)
	c := cp.Client
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ld := &load{cp: cp}
	s0, ok := ld.controlPlaneSched()
	if !ok || s0.ran <= 0 {
		t.Fatalf("controlPlaneSched = %+v, %v; want some CPU time", s0, ok)
	}
	// Not "bench-": awaitEarlierLoads waits for those while they are deleted.
	ns, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cpsched-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{}) })
	evs, err := watchEvents(ctx, c, ns.Name)
	if err != nil {
		t.Fatal(err)
	}
	create := func(name string) event {
		t.Helper()
		t0 := time.Now()
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
		}
		if _, err := c.CoreV1().Services(ns.Name).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		ev, err := evs.first("Service", name, watch.Added, t0)
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	if ev := create("before"); ev.cpOK {
		t.Errorf("event before arm has the control plane's accounting: %+v", ev)
	}
	disarm := evs.arm(ld.controlPlaneSched)
	ev := create("armed")
	disarm()
	if !ev.cpOK {
		t.Fatalf("event while armed has no control-plane accounting: %+v", ev)
	}
	if d := ev.cp.sub(s0); d.ran <= 0 {
		t.Errorf("the control plane ran %v between the first read and a Service create's event; want some", d.ran)
	}
	if ev := create("after"); ev.cpOK {
		t.Errorf("event after disarm has the control plane's accounting: %+v", ev)
	}
}
