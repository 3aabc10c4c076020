package endpointslice

import (
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
	"github.com/dsproxy/dsproxy/pkg/objmeta"
)

// Object is an EndpointSlice as dsproxy keeps it: parsed for its family once, as
// it arrives. The informer's cache holds Objects instead of the API objects (its
// transform calls Ingest), and a family's Cache files the same *Slice, so the
// endpoints of a slice are in memory once, in their compact form. At 10k Services
// the API objects were about 2.7 KB per slice, 55 MB in all.
//
// It carries only the identity the informer needs (objmeta.Meta: namespace, name,
// resource version, and the metav1.Object methods) and implements runtime.Object.
type Object struct {
	objmeta.Meta
	// Family is the slice's addressType's family; nil for FQDN and unknown types.
	Family *family.Family
	// Slice is the parsed slice; nil when it cannot be used at all (Err says why).
	Slice *Slice
	// Skips are the parts of a usable slice that were left out.
	Skips []*model.SkipError
	Err   error
	// Trigger is the endpoints.kubernetes.io/last-change-trigger-time annotation;
	// zero when absent or unparsable.
	Trigger time.Time
}

// Ingest parses es for its addressType's family on node nodeName (which decides
// the endpoints' Local flag). It never fails: an unusable slice is an Object with
// Err set, so that its later deletion is still seen.
func Ingest(es *discovery.EndpointSlice, nodeName string) *Object {
	if es == nil {
		return &Object{Err: &model.SkipError{Object: "EndpointSlice <nil>", Reason: "nil object"}}
	}
	o := &Object{Meta: objmeta.Meta{Namespace: es.Namespace, Name: es.Name, ResourceVersion: es.ResourceVersion}}
	o.Family = family.ForAddressType(es.AddressType)
	if o.Family == nil {
		o.Err = &model.SkipError{Object: "EndpointSlice " + es.Namespace + "/" + es.Name, Field: "addressType",
			Reason: "unsupported addressType " + string(es.AddressType)}
		return o
	}
	o.Slice, o.Skips, o.Err = Parse(o.Family, es, nodeName)
	if o.Err != nil {
		o.Slice = nil
	}
	if v, ok := es.Annotations[v1.EndpointsLastChangeTriggerTime]; ok {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			o.Trigger = t
		}
	}
	return o
}

// DeepCopyObject returns a copy sharing the parsed slice, which is never modified.
func (o *Object) DeepCopyObject() runtime.Object {
	c := *o
	return &c
}

// GetObjectKind: an Object has no type metadata.
func (o *Object) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

var _ metav1.Object = (*Object)(nil)
