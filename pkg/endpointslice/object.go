package endpointslice

import (
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dsproxy/dsproxy/pkg/family"
	"github.com/dsproxy/dsproxy/pkg/model"
)

// Object is an EndpointSlice as dsproxy keeps it: parsed for its family once, as
// it arrives. The informer's cache holds Objects instead of the API objects (its
// transform calls Ingest), and a family's Cache files the same *Slice, so the
// endpoints of a slice are in memory once, in their compact form. At 10k Services
// the API objects were about 2.7 KB per slice, 55 MB in all.
//
// It carries only the identity the informer needs (namespace, name, resource
// version; not a whole ObjectMeta, 256 bytes of mostly empty fields per slice),
// implements runtime.Object, and is its own metav1.Object for client-go's key
// functions (meta.Accessor): an ObjectMeta view made per call was 25 MB of garbage
// in a 10k cold start.
type Object struct {
	Namespace, Name, ResourceVersion string
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
	o := &Object{Namespace: es.Namespace, Name: es.Name, ResourceVersion: es.ResourceVersion}
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

// The metav1.Object methods: an Object has a namespace, a name and a resource
// version; every other field reads as empty, and setting it does nothing (nothing
// sets them on objects in an informer's cache).

func (o *Object) GetNamespace() string                                       { return o.Namespace }
func (o *Object) SetNamespace(namespace string)                              { o.Namespace = namespace }
func (o *Object) GetName() string                                            { return o.Name }
func (o *Object) SetName(name string)                                        { o.Name = name }
func (o *Object) GetResourceVersion() string                                 { return o.ResourceVersion }
func (o *Object) SetResourceVersion(version string)                          { o.ResourceVersion = version }
func (o *Object) GetGenerateName() string                                    { return "" }
func (o *Object) SetGenerateName(string)                                     {}
func (o *Object) GetUID() types.UID                                          { return "" }
func (o *Object) SetUID(types.UID)                                           {}
func (o *Object) GetGeneration() int64                                       { return 0 }
func (o *Object) SetGeneration(int64)                                        {}
func (o *Object) GetSelfLink() string                                        { return "" }
func (o *Object) SetSelfLink(string)                                         {}
func (o *Object) GetCreationTimestamp() metav1.Time                          { return metav1.Time{} }
func (o *Object) SetCreationTimestamp(metav1.Time)                           {}
func (o *Object) GetDeletionTimestamp() *metav1.Time                         { return nil }
func (o *Object) SetDeletionTimestamp(*metav1.Time)                          {}
func (o *Object) GetDeletionGracePeriodSeconds() *int64                      { return nil }
func (o *Object) SetDeletionGracePeriodSeconds(*int64)                       {}
func (o *Object) GetLabels() map[string]string                               { return nil }
func (o *Object) SetLabels(map[string]string)                                {}
func (o *Object) GetAnnotations() map[string]string                          { return nil }
func (o *Object) SetAnnotations(map[string]string)                           {}
func (o *Object) GetFinalizers() []string                                    { return nil }
func (o *Object) SetFinalizers([]string)                                     {}
func (o *Object) GetOwnerReferences() []metav1.OwnerReference                { return nil }
func (o *Object) SetOwnerReferences([]metav1.OwnerReference)                 {}
func (o *Object) GetManagedFields() []metav1.ManagedFieldsEntry              { return nil }
func (o *Object) SetManagedFields(managedFields []metav1.ManagedFieldsEntry) {}
