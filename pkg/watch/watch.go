// Package watch connects client-go shared informers to dsproxy's handlers: Services
// and EndpointSlices with kube-proxy's label filtering, the proxy's own Node, and
// ServiceCIDRs. Watch loss and API server restarts are handled by the informers'
// reflectors (relist and rewatch with backoff), never by restarting the process.
package watch

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/dsproxy/dsproxy/pkg/endpointslice"
	"github.com/dsproxy/dsproxy/pkg/kubeclient"
	"github.com/dsproxy/dsproxy/pkg/model"
)

// Handler receives every event dsproxy cares about. The MetaProxier implements it.
type Handler interface {
	OnServiceAdd(*v1.Service)
	OnServiceUpdate(old, cur *v1.Service)
	OnServiceDelete(*v1.Service)
	OnEndpointSliceAdd(*endpointslice.Object)
	OnEndpointSliceUpdate(old, cur *endpointslice.Object)
	OnEndpointSliceDelete(*endpointslice.Object)
	OnNodeAdd(*v1.Node)
	OnNodeUpdate(old, cur *v1.Node)
	OnNodeDelete(*v1.Node)
	OnServiceCIDRAdd(*networkingv1.ServiceCIDR)
	OnServiceCIDRUpdate(old, cur *networkingv1.ServiceCIDR)
	OnServiceCIDRDelete(*networkingv1.ServiceCIDR)
}

// Options configure the watches.
type Options struct {
	NodeName string
	// ResyncPeriod is the informers' resync period (kube-proxy's configSyncPeriod);
	// 0 disables resyncs.
	ResyncPeriod time.Duration
	// ServiceCIDRs enables the networking.k8s.io/v1 ServiceCIDR watch.
	ServiceCIDRs bool
}

// ProxySelector is the label selector for EndpointSlices: no headless label (the
// EndpointSlice controller's, on the slices of headless Services), as kube-proxy's,
// and no service-proxy-name label (the controller copies it from a Service another
// proxy owns; kube-proxy lists those slices and never uses them).
func ProxySelector() labels.Selector {
	noProxyName, _ := labels.NewRequirement(model.LabelServiceProxyName, selection.DoesNotExist, nil)
	noHeadless, _ := labels.NewRequirement(model.LabelHeadless, selection.DoesNotExist, nil)
	return labels.NewSelector().Add(*noProxyName, *noHeadless)
}

// serviceSelectors are kube-proxy's for Services: no service-proxy-name label,
// and not headless (spec.clusterIP None), so headless Services are not listed.
func serviceSelectors(o *metav1.ListOptions) {
	noProxyName, _ := labels.NewRequirement(model.LabelServiceProxyName, selection.DoesNotExist, nil)
	o.LabelSelector = labels.NewSelector().Add(*noProxyName).String()
	o.FieldSelector = fields.OneTermNotEqualSelector("spec.clusterIP", v1.ClusterIPNone).String()
}

// serviceCIDRGrace is how long Start waits for the ServiceCIDRs' list, once the
// other lists are in, when that list neither completes nor is refused.
var serviceCIDRGrace = 10 * time.Second

// Start creates the informers, registers h and starts them. It returns once the
// Service, EndpointSlice and Node caches have synced (or ctx is done), so the
// first proxy sync sees a complete cluster rather than programming a partial
// one. The ServiceCIDRs' list is waited for too, unless it is refused (no RBAC
// for servicecidrs, an API server without networking.k8s.io/v1 ServiceCIDRs) or
// is not in serviceCIDRGrace after the others: kube-proxy's proxiers do not
// wait for ServiceCIDRs at all, and their only use is the drop of unallocated
// service addresses, which follows when they arrive.
func Start(ctx context.Context, client *kubeclient.Client, h Handler, opts Options) error {
	sel := ProxySelector().String()
	proxyObjects := func(o *metav1.ListOptions) { o.LabelSelector = sel }
	var regs []cache.DoneChecker
	var infs []cache.SharedIndexInformer
	add := func(r kubeclient.Resource, tweak func(*metav1.ListOptions), transform cache.TransformFunc, hs cache.ResourceEventHandlerFuncs) (cache.SharedIndexInformer, error) {
		inf := cache.NewSharedIndexInformerWithOptions(client.ListWatch(r, tweak), r.Object(),
			cache.SharedIndexInformerOptions{ResyncPeriod: opts.ResyncPeriod})
		if err := inf.SetTransform(transform); err != nil {
			return nil, fmt.Errorf("watching %s: %w", r, err)
		}
		reg, err := inf.AddEventHandler(hs)
		if err != nil {
			return nil, fmt.Errorf("watching %s: %w", r, err)
		}
		regs = append(regs, reg.HasSyncedChecker())
		infs = append(infs, inf)
		return inf, nil
	}
	forProxy := ForProxy(opts.NodeName)
	if _, err := add(kubeclient.Services, serviceSelectors, forProxy, serviceHandlers(h)); err != nil {
		return err
	}
	if _, err := add(kubeclient.EndpointSlices, proxyObjects, forProxy, handlers(h.OnEndpointSliceAdd, h.OnEndpointSliceUpdate, h.OnEndpointSliceDelete)); err != nil {
		return err
	}
	if opts.NodeName != "" {
		thisNode := func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", opts.NodeName).String()
		}
		if _, err := add(kubeclient.Nodes, thisNode, StripForProxy, handlers(h.OnNodeAdd, h.OnNodeUpdate, h.OnNodeDelete)); err != nil {
			return err
		}
	}
	essential := len(regs)
	var cidrErr chan error // the ServiceCIDR reflector's first permanent error
	if opts.ServiceCIDRs {
		inf, err := add(kubeclient.ServiceCIDRs, nil, forProxy, handlers(h.OnServiceCIDRAdd, h.OnServiceCIDRUpdate, h.OnServiceCIDRDelete))
		if err != nil {
			return err
		}
		cidrErr = make(chan error, 1)
		err = inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			cache.DefaultWatchErrorHandler(ctx, r, err)
			// Only an error that ends the wait takes the slot: a transient
			// one kept there would make the wait drop a later refusal.
			if !permanentListError(err) {
				return
			}
			select {
			case cidrErr <- err:
			default:
			}
		})
		if err != nil {
			return fmt.Errorf("watching %s: %w", kubeclient.ServiceCIDRs, err)
		}
	}
	for _, inf := range infs {
		go inf.RunWithContext(ctx)
	}
	// WaitFor is woken by each handler's last initial delivery; WaitForCacheSync
	// would poll every 100 ms, 50 ms of every start on average.
	if !cache.WaitFor(ctx, "", regs[:essential]...) {
		return fmt.Errorf("waiting for informer caches: %w", context.Cause(ctx))
	}
	if cidrErr != nil {
		if err := waitServiceCIDRs(ctx, regs[essential], cidrErr); err != nil {
			return err
		}
	}
	klog.InfoS("Informer caches synced", "node", opts.NodeName)
	return nil
}

// waitServiceCIDRs waits for the ServiceCIDR handler's initial list, until the
// reflector reports an error that retrying will not mend (forbidden, or not
// served) or serviceCIDRGrace passes; then it logs that the proxy starts
// without them. errs carries only such errors (permanentListError): others
// (a timeout, a refused connection while the API server starts) are left to
// the reflector's retries within the grace.
func waitServiceCIDRs(ctx context.Context, reg cache.DoneChecker, errs <-chan error) error {
	grace := time.NewTimer(serviceCIDRGrace)
	defer grace.Stop()
	var why any
	for why == nil {
		select {
		case <-reg.Done():
			return nil
		case <-ctx.Done():
			return fmt.Errorf("waiting for informer caches: %w", context.Cause(ctx))
		case err := <-errs:
			why = err
		case <-grace.C:
			why = "no answer in " + serviceCIDRGrace.String()
		}
	}
	if cache.IsDone(reg) {
		return nil // delivered meanwhile
	}
	klog.ErrorS(nil, "Starting without ServiceCIDRs: the addresses of service CIDRs that no Service has are not dropped until the list succeeds",
		"reason", why)
	return nil
}

// permanentListError reports whether a reflector's error is one a retry will
// not mend soon: no permission, or a resource the API server does not serve.
func permanentListError(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err)
}

// serviceHandlers: the Service informer's cache holds *Service (ForProxy); h gets
// each expanded, made for the call.
func serviceHandlers(h Handler) cache.ResourceEventHandlerFuncs {
	return handlers(
		func(s *Service) { h.OnServiceAdd(s.Expand()) },
		func(old, cur *Service) { h.OnServiceUpdate(old.Expand(), cur.Expand()) },
		func(s *Service) { h.OnServiceDelete(s.Expand()) })
}

// handlers adapts typed handlers to client-go's untyped ones. Objects of the wrong
// type are logged and dropped; deletes seen only as tombstones are unwrapped.
func handlers[T any](add func(T), update func(old, cur T), del func(T)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if o, ok := typed[T](obj); ok {
				add(o)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := typed[T](oldObj)
			n, ok2 := typed[T](newObj)
			if ok1 && ok2 {
				update(o, n)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if o, ok := typed[T](obj); ok {
				del(o)
			}
		},
	}
}

func typed[T any](obj any) (T, bool) {
	o, ok := obj.(T)
	if !ok {
		klog.ErrorS(nil, "Unexpected object type from informer", "type", fmt.Sprintf("%T", obj))
	}
	return o, ok
}
