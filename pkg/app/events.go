package app

import (
	"context"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// eventPoster creates Events (kubeclient.Client).
type eventPoster interface {
	PostEvent(ctx context.Context, ev *eventsv1.Event) error
}

// recorder emits the Events kube-proxy emits (events.k8s.io/v1, with dsproxy as
// the reporting controller): Starting on the Node, FailedToStartServiceHealthcheck
// on a Service whose health check node port cannot be opened, and
// FailedToStartMetricServer / FailedToStartProxierHealthcheck on the Node when
// --bind-address-hard-fail stops the proxy. Posting is asynchronous; a failure
// is logged. There are few: no aggregation.
type recorder struct {
	post     eventPoster
	node     string
	instance string
	now      func() time.Time
	wg       sync.WaitGroup
}

func newRecorder(post eventPoster, node string) *recorder {
	return &recorder{post: post, node: node, instance: "dsproxy-" + node, now: time.Now}
}

const reportingController = "dsproxy"

func (r *recorder) nodeRef() v1.ObjectReference {
	return v1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: r.node}
}

// event posts one Event about regarding.
func (r *recorder) event(regarding v1.ObjectReference, typ, reason, action, note string) {
	ns := regarding.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault // as client-go's recorder, for cluster-scoped objects
	}
	t := r.now()
	ev := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", regarding.Name, t.UnixNano()), Namespace: ns},
		EventTime:           metav1.NewMicroTime(t),
		ReportingController: reportingController,
		ReportingInstance:   r.instance,
		Action:              action,
		Reason:              reason,
		Regarding:           regarding,
		Note:                note,
		Type:                typ,
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.post.PostEvent(ctx, ev); err != nil {
			klog.V(2).InfoS("Could not post an Event", "reason", reason, "regarding", regarding.Kind+"/"+regarding.Name, "err", err)
		}
	}()
}

// flush waits, up to timeout, for the Events posted so far.
func (r *recorder) flush(timeout time.Duration) {
	if r == nil {
		return
	}
	done := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
	}
}

// starting is kube-proxy's birth cry.
func (r *recorder) starting(note string) {
	if r == nil {
		return
	}
	r.event(r.nodeRef(), v1.EventTypeNormal, "Starting", "StartDsproxy", note)
}

// healthCheckFailed reports a Service health check node port that cannot be
// opened (healthcheck.ServiceHealthConfig.OnListenError).
func (r *recorder) healthCheckFailed(svc types.NamespacedName, port uint16, err error) {
	if r == nil {
		return
	}
	msg := fmt.Sprintf("node %s failed to start healthcheck %q on port %d: %v", r.node, svc.String(), port, err)
	r.event(v1.ObjectReference{APIVersion: "v1", Kind: "Service", Namespace: svc.Namespace, Name: svc.Name},
		v1.EventTypeWarning, "FailedToStartServiceHealthcheck", "Listen", msg)
}

// serverFailed reports the metrics or healthz server's failure that stops the
// proxy under --bind-address-hard-fail.
func (r *recorder) serverFailed(server string, err error) {
	if r == nil {
		return
	}
	reason := "FailedToStartMetricServer"
	if server == "healthz" {
		reason = "FailedToStartProxierHealthcheck"
	}
	r.event(r.nodeRef(), v1.EventTypeWarning, reason, "StartDsproxy", err.Error())
}
