package kubeclient

import (
	"bytes"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/dsproxy/dsproxy/pkg/model"
)

// The proxy decodes EndpointSlices and Services itself instead of through their
// generated protobuf code, which decodes every field: managedFields, owner
// references, kubectl's last-applied annotation, a Service's selector and status
// conditions, each endpoint's targetRef, zone and hostname, none of which a proxy
// reads, all allocated and then collected. decodeEndpointSlice and decodeService
// read the same wire format but keep only what endpointslice.Ingest and
// watch.CompactService read, skipping every other field without decoding it.
//
// Decoding and Ingest / CompactService of one object, generated -> lean
// (BenchmarkDecodeEndpointSlice, BenchmarkDecodeService):
//
//	slice of 10 endpoints as bench/e2e makes it   4.4 -> 3.2 us   6.0 -> 3.1 KB   106 -> 40 allocations
//	the same as the EndpointSlice controller does 6.9 -> 3.6 us   8.6 -> 3.4 KB   187 -> 43 allocations
//	dual-stack NodePort Service as bench/e2e's    1.4 -> 1.2 us   1.8 -> 1.3 KB    35 -> 16 allocations
//	the same applied with kubectl                 2.5 -> 1.4 us   3.9 -> 1.3 KB    57 -> 16 allocations
//
// The slices' decoder alone took a 10k cold start on a real API server from 1.57 to
// 1.38 CPU seconds (four alternating starts each).

// leanKinds are the kinds whose objects the client decodes with a lean decoder.
var leanKinds = map[schema.GroupVersionKind]func([]byte) (runtime.Object, error){
	discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice"): func(b []byte) (runtime.Object, error) {
		return decodeEndpointSlice(b)
	},
	v1.SchemeGroupVersion.WithKind("Service"): func(b []byte) (runtime.Object, error) {
		return decodeService(b)
	},
}

// protobufMagic prefixes every protobuf-encoded API object (a runtime.Unknown).
var protobufMagic = []byte{0x6b, 0x38, 0x73, 0x00}

// leanNegotiator is the client's NegotiatedSerializer: inner's, except that its
// protobuf serializer decodes the leanKinds with their lean decoders.
type leanNegotiator struct {
	runtime.NegotiatedSerializer
	infos []runtime.SerializerInfo
}

func newLeanNegotiator(inner runtime.NegotiatedSerializer) leanNegotiator {
	infos := append([]runtime.SerializerInfo(nil), inner.SupportedMediaTypes()...)
	for i := range infos {
		if infos[i].MediaType == runtime.ContentTypeProtobuf {
			infos[i].Serializer = leanDecoder{infos[i].Serializer}
		}
	}
	return leanNegotiator{NegotiatedSerializer: inner, infos: infos}
}

func (n leanNegotiator) SupportedMediaTypes() []runtime.SerializerInfo { return n.infos }

// leanDecoder decodes the leanKinds itself when asked for any object (into nil, as
// a watch's events and a Get are decoded). Everything else goes to the protobuf
// serializer it wraps, and so does an object the lean decoder refuses: the
// generated code then decodes it whole or reports the error, so that no input is
// refused that the generated code would have accepted (a refused event ends the
// watch).
type leanDecoder struct{ runtime.Serializer }

func (d leanDecoder) Decode(data []byte, gvk *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if into == nil && bytes.HasPrefix(data, protobufMagic) {
		if actual, raw, ok := unknownEnvelope(data[len(protobufMagic):]); ok {
			if decode := leanKinds[actual]; decode != nil {
				if obj, err := decode(raw); err == nil {
					return obj, &actual, nil
				}
			}
		}
	}
	return d.Serializer.Decode(data, gvk, into)
}

// unknownEnvelope reads the type and the raw bytes of a runtime.Unknown (typeMeta
// = 1 {apiVersion = 1, kind = 2}, raw = 2; contentEncoding and contentType, which
// the protobuf serializer ignores as well, are skipped).
func unknownEnvelope(b []byte) (schema.GroupVersionKind, []byte, bool) {
	var apiVersion, kind string
	var raw []byte
	err := eachField(b, func(num protowire.Number, typ protowire.Type, _ uint64, v []byte) error {
		switch num {
		case 1:
			if err := wantBytes(typ); err != nil {
				return err
			}
			return eachField(v, func(num protowire.Number, typ protowire.Type, _ uint64, v []byte) error {
				switch num {
				case 1:
					apiVersion = string(v)
				case 2:
					kind = string(v)
				default:
					return nil
				}
				return wantBytes(typ)
			})
		case 2:
			raw = v
			return wantBytes(typ)
		}
		return nil
	})
	if err != nil {
		return schema.GroupVersionKind{}, nil, false
	}
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return schema.GroupVersionKind{}, nil, false
	}
	return gv.WithKind(kind), raw, true
}

var errWireType = fmt.Errorf("wrong wire type")

func wantBytes(typ protowire.Type) error {
	if typ != protowire.BytesType {
		return errWireType
	}
	return nil
}

func wantVarint(typ protowire.Type) error {
	if typ != protowire.VarintType {
		return errWireType
	}
	return nil
}

// eachField calls fn with each field of the protobuf message b in order: its
// number, its wire type and its value (v for varints, data for length-delimited
// fields; fixed-size and group fields are passed with neither). It stops at the
// first malformed field or error from fn.
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, v uint64, data []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v uint64
		var data []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			data, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := fn(num, typ, v, data); err != nil {
			return err
		}
	}
	return nil
}

// decodeEndpointSlice decodes the protobuf encoding of a discovery.k8s.io/v1
// EndpointSlice as its generated Unmarshal would, but keeps only:
//
//   - metadata: name, namespace, resourceVersion; the labels
//     kubernetes.io/service-name, service.kubernetes.io/service-proxy-name and
//     service.kubernetes.io/headless; the annotations
//     endpoints.kubernetes.io/last-change-trigger-time and k8s.io/initial-events-end
//     (which marks the end of a streamed list in a bookmark);
//   - addressType, and every port's name, protocol and port;
//   - every endpoint, with its addresses, conditions, nodeName and hints.
//
// Every other field is skipped (well-formedness aside, its content is not read).
// It is stricter than the generated code: a kept field of the wrong wire type, or
// a field number beyond protobuf's range, is an error (the generated code reads
// some of those some other way); the API server never sends either. The
// conditions' and node names' pointers, and the endpoints' first addresses, are
// in arrays shared by the endpoints of a slice.
func decodeEndpointSlice(b []byte) (*discoveryv1.EndpointSlice, error) {
	es := &discoveryv1.EndpointSlice{}
	n := 0
	if err := eachField(b, func(num protowire.Number, typ protowire.Type, _ uint64, _ []byte) error {
		if num == 2 && typ == protowire.BytesType {
			n++
		}
		return nil
	}); err != nil {
		return nil, err
	}
	es.Endpoints = make([]discoveryv1.Endpoint, 0, n)
	a := &arena{bools: make([]bool, 0, 3*n), strs: make([]string, 0, 2*n)}
	err := eachField(b, func(num protowire.Number, typ protowire.Type, _ uint64, v []byte) error {
		switch num {
		case 1:
			if err := wantBytes(typ); err != nil {
				return fmt.Errorf("metadata: %w", err)
			}
			if err := decodeMeta(&es.ObjectMeta, v, sliceMeta); err != nil {
				return fmt.Errorf("metadata: %w", err)
			}
		case 2:
			if err := wantBytes(typ); err != nil {
				return fmt.Errorf("endpoints: %w", err)
			}
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{})
			if err := decodeEndpoint(&es.Endpoints[len(es.Endpoints)-1], v, a); err != nil {
				return fmt.Errorf("endpoints[%d]: %w", len(es.Endpoints)-1, err)
			}
		case 3:
			if err := wantBytes(typ); err != nil {
				return fmt.Errorf("ports: %w", err)
			}
			es.Ports = append(es.Ports, discoveryv1.EndpointPort{})
			if err := decodePort(&es.Ports[len(es.Ports)-1], v); err != nil {
				return fmt.Errorf("ports[%d]: %w", len(es.Ports)-1, err)
			}
		case 4:
			if err := wantBytes(typ); err != nil {
				return fmt.Errorf("addressType: %w", err)
			}
			es.AddressType = discoveryv1.AddressType(known(v))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return es, nil
}

// metaFields are what decodeMeta keeps for a kind besides the name, namespace and
// resource version: the creation time or not, and which labels and annotations.
type metaFields struct {
	created             bool
	labels, annotations []string
}

var (
	sliceMeta = metaFields{
		labels:      []string{discoveryv1.LabelServiceName, model.LabelServiceProxyName, model.LabelHeadless},
		annotations: []string{v1.EndpointsLastChangeTriggerTime, metav1.InitialEventsAnnotationKey},
	}
	serviceMeta = metaFields{
		created:     true,
		labels:      []string{model.LabelServiceProxyName, model.LabelHeadless},
		annotations: []string{metav1.InitialEventsAnnotationKey},
	}
)

// decodeMeta decodes the name, namespace and resource version of an ObjectMeta,
// and what keep names.
func decodeMeta(m *metav1.ObjectMeta, b []byte, keep metaFields) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, _ uint64, v []byte) error {
		switch num {
		case 1:
			m.Name = string(v)
		case 3:
			m.Namespace = string(v)
		case 6:
			m.ResourceVersion = string(v)
		case 8:
			if !keep.created {
				return nil
			}
			if err := wantBytes(typ); err != nil {
				return err
			}
			return decodeTime(&m.CreationTimestamp, v)
		case 11:
			return keepEntry(&m.Labels, keep.labels, typ, v)
		case 12:
			return keepEntry(&m.Annotations, keep.annotations, typ, v)
		default:
			return nil
		}
		return wantBytes(typ)
	})
}

// decodeTime decodes a metav1.Time (seconds = 1, nanos = 2) as its Unmarshal
// does: whole seconds, in the local time zone; empty is the zero time.
func decodeTime(t *metav1.Time, b []byte) error {
	if len(b) == 0 {
		t.Time = time.Time{}
		return nil
	}
	var sec int64
	if err := eachField(b, func(num protowire.Number, typ protowire.Type, x uint64, _ []byte) error {
		switch num {
		case 1:
			sec = int64(x)
		case 2:
		default:
			return nil
		}
		return wantVarint(typ)
	}); err != nil {
		return err
	}
	t.Time = time.Unix(sec, 0).Local()
	return nil
}

// keepEntry decodes a map<string, string> entry (key = 1, value = 2) into *m if
// its key is one of keep.
func keepEntry(m *map[string]string, keep []string, typ protowire.Type, b []byte) error {
	if err := wantBytes(typ); err != nil {
		return err
	}
	var key, value []byte
	if err := eachField(b, func(num protowire.Number, typ protowire.Type, _ uint64, v []byte) error {
		switch num {
		case 1:
			key = v
		case 2:
			value = v
		default:
			return nil
		}
		return wantBytes(typ)
	}); err != nil {
		return err
	}
	for _, k := range keep {
		if string(key) == k {
			if *m == nil {
				*m = make(map[string]string, 1)
			}
			(*m)[k] = string(value)
		}
	}
	return nil
}

func decodeEndpoint(ep *discoveryv1.Endpoint, b []byte, a *arena) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, _ uint64, v []byte) error {
		switch num {
		case 1:
			if ep.Addresses == nil {
				// Nearly every endpoint has one address: its slice
				// has room for one, in the arena; a second one
				// reallocates.
				a.string(string(v))
				ep.Addresses = a.strs[len(a.strs)-1 : len(a.strs) : len(a.strs)]
			} else {
				ep.Addresses = append(ep.Addresses, string(v))
			}
		case 2:
			if err := wantBytes(typ); err != nil {
				return err
			}
			return decodeConditions(&ep.Conditions, v, a)
		case 6:
			ep.NodeName = a.string(string(v))
		case 8:
			if err := wantBytes(typ); err != nil {
				return err
			}
			if ep.Hints == nil {
				ep.Hints = &discoveryv1.EndpointHints{}
			}
			return decodeHints(ep.Hints, v)
		default:
			return nil
		}
		return wantBytes(typ)
	})
}

func decodeConditions(c *discoveryv1.EndpointConditions, b []byte, a *arena) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, x uint64, _ []byte) error {
		var p **bool
		switch num {
		case 1:
			p = &c.Ready
		case 2:
			p = &c.Serving
		case 3:
			p = &c.Terminating
		default:
			return nil
		}
		if err := wantVarint(typ); err != nil {
			return err
		}
		*p = a.bool(x != 0)
		return nil
	})
}

func decodeHints(h *discoveryv1.EndpointHints, b []byte) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, _ uint64, v []byte) error {
		if num != 1 && num != 2 {
			return nil
		}
		if err := wantBytes(typ); err != nil {
			return err
		}
		var name string
		if err := eachField(v, func(num protowire.Number, typ protowire.Type, _ uint64, v []byte) error {
			if num != 1 {
				return nil
			}
			name = string(v)
			return wantBytes(typ)
		}); err != nil {
			return err
		}
		if num == 1 {
			h.ForZones = append(h.ForZones, discoveryv1.ForZone{Name: name})
		} else {
			h.ForNodes = append(h.ForNodes, discoveryv1.ForNode{Name: name})
		}
		return nil
	})
}

func decodePort(p *discoveryv1.EndpointPort, b []byte) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, x uint64, v []byte) error {
		switch num {
		case 1:
			s := string(v)
			p.Name = &s
		case 2:
			s := v1.Protocol(known(v))
			p.Protocol = &s
		case 3:
			if err := wantVarint(typ); err != nil {
				return err
			}
			port := int32(x)
			p.Port = &port
			return nil
		default:
			return nil
		}
		return wantBytes(typ)
	})
}

// arena hands out the *bool of the endpoints' conditions and the *string of their
// node names and addresses from arrays shared by the endpoints of a slice: a few
// allocations per slice instead of several per endpoint. Each pointer is to an
// element of its own, never handed out twice.
type arena struct {
	bools []bool
	strs  []string
}

func (a *arena) bool(v bool) *bool {
	if len(a.bools) == cap(a.bools) {
		a.bools = make([]bool, 0, 16)
	}
	a.bools = append(a.bools, v)
	return &a.bools[len(a.bools)-1]
}

func (a *arena) string(v string) *string {
	if len(a.strs) == cap(a.strs) {
		a.strs = make([]string, 0, 16)
	}
	a.strs = append(a.strs, v)
	return &a.strs[len(a.strs)-1]
}

// decodeService decodes the protobuf encoding of a core/v1 Service as its
// generated Unmarshal would, keeping only what watch.CompactService reads:
//
//   - metadata: name, namespace, resourceVersion, creationTimestamp; the labels
//     service.kubernetes.io/service-proxy-name and service.kubernetes.io/headless;
//     the annotation k8s.io/initial-events-end;
//   - spec: type, clusterIP, clusterIPs, ipFamilies, ports (name, protocol, port,
//     nodePort), externalTrafficPolicy, internalTrafficPolicy, sessionAffinity and
//     its clientIP timeout, trafficDistribution, externalIPs,
//     loadBalancerSourceRanges, healthCheckNodePort, allocateLoadBalancerNodePorts;
//   - status: the load balancer ingresses' ip and ipMode.
//
// Every other field is skipped, as in decodeEndpointSlice, which says what it
// refuses.
func decodeService(b []byte) (*v1.Service, error) {
	svc := &v1.Service{}
	err := eachField(b, func(num protowire.Number, typ protowire.Type, _ uint64, v []byte) error {
		var err error
		switch num {
		case 1:
			if err = wantBytes(typ); err == nil {
				err = decodeMeta(&svc.ObjectMeta, v, serviceMeta)
			}
			if err != nil {
				return fmt.Errorf("metadata: %w", err)
			}
		case 2:
			if err = wantBytes(typ); err == nil {
				err = decodeServiceSpec(&svc.Spec, v)
			}
			if err != nil {
				return fmt.Errorf("spec: %w", err)
			}
		case 3:
			if err = wantBytes(typ); err == nil {
				err = decodeServiceStatus(&svc.Status, v)
			}
			if err != nil {
				return fmt.Errorf("status: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return svc, nil
}

func decodeServiceSpec(spec *v1.ServiceSpec, b []byte) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, x uint64, v []byte) error {
		switch num {
		case 1:
			if err := wantBytes(typ); err != nil {
				return err
			}
			spec.Ports = append(spec.Ports, v1.ServicePort{})
			return decodeServicePort(&spec.Ports[len(spec.Ports)-1], v)
		case 3:
			spec.ClusterIP = string(v)
		case 18:
			spec.ClusterIPs = append(spec.ClusterIPs, string(v))
		case 4:
			spec.Type = v1.ServiceType(known(v))
		case 5:
			spec.ExternalIPs = append(spec.ExternalIPs, string(v))
		case 7:
			spec.SessionAffinity = v1.ServiceAffinity(known(v))
		case 9:
			spec.LoadBalancerSourceRanges = append(spec.LoadBalancerSourceRanges, string(v))
		case 11:
			spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicy(known(v))
		case 12:
			spec.HealthCheckNodePort = int32(x)
			return wantVarint(typ)
		case 14:
			if err := wantBytes(typ); err != nil {
				return err
			}
			if spec.SessionAffinityConfig == nil {
				spec.SessionAffinityConfig = &v1.SessionAffinityConfig{}
			}
			return decodeAffinity(spec.SessionAffinityConfig, v)
		case 19:
			spec.IPFamilies = append(spec.IPFamilies, v1.IPFamily(known(v)))
		case 20:
			b := x != 0
			spec.AllocateLoadBalancerNodePorts = &b
			return wantVarint(typ)
		case 22:
			p := v1.ServiceInternalTrafficPolicy(known(v))
			spec.InternalTrafficPolicy = &p
		case 23:
			d := known(v)
			spec.TrafficDistribution = &d
		default:
			return nil
		}
		return wantBytes(typ)
	})
}

func decodeServicePort(p *v1.ServicePort, b []byte) error {
	return eachField(b, func(num protowire.Number, typ protowire.Type, x uint64, v []byte) error {
		switch num {
		case 1:
			p.Name = known(v)
		case 2:
			p.Protocol = v1.Protocol(known(v))
		case 3:
			p.Port = int32(x)
			return wantVarint(typ)
		case 5:
			p.NodePort = int32(x)
			return wantVarint(typ)
		default:
			return nil
		}
		return wantBytes(typ)
	})
}

// decodeAffinity decodes a SessionAffinityConfig's clientIP (1) timeoutSeconds (1).
func decodeAffinity(c *v1.SessionAffinityConfig, b []byte) error {
	return eachMessage(b, 1, func(v []byte) error {
		if c.ClientIP == nil {
			c.ClientIP = &v1.ClientIPConfig{}
		}
		return eachField(v, func(num protowire.Number, typ protowire.Type, x uint64, _ []byte) error {
			if num != 1 {
				return nil
			}
			t := int32(x)
			c.ClientIP.TimeoutSeconds = &t
			return wantVarint(typ)
		})
	})
}

// decodeServiceStatus decodes the status's loadBalancer (1) ingress (1) ip (1)
// and ipMode (3).
func decodeServiceStatus(st *v1.ServiceStatus, b []byte) error {
	return eachMessage(b, 1, func(v []byte) error {
		return eachMessage(v, 1, func(v []byte) error {
			st.LoadBalancer.Ingress = append(st.LoadBalancer.Ingress, v1.LoadBalancerIngress{})
			ing := &st.LoadBalancer.Ingress[len(st.LoadBalancer.Ingress)-1]
			return eachField(v, func(num protowire.Number, typ protowire.Type, _ uint64, v []byte) error {
				switch num {
				case 1:
					ing.IP = string(v)
				case 3:
					m := v1.LoadBalancerIPMode(known(v))
					ing.IPMode = &m
				default:
					return nil
				}
				return wantBytes(typ)
			})
		})
	})
}

// eachMessage calls fn with each occurrence of field num of message b, which must
// be length-delimited (a message), in order; other fields are skipped.
func eachMessage(b []byte, num protowire.Number, fn func(v []byte) error) error {
	return eachField(b, func(n protowire.Number, typ protowire.Type, _ uint64, v []byte) error {
		if n != num {
			return nil
		}
		if err := wantBytes(typ); err != nil {
			return err
		}
		return fn(v)
	})
}

// knownStrings are values the decoders meet in nearly every object: known returns
// these without allocating.
var knownStrings = func() map[string]string {
	m := map[string]string{}
	for _, s := range []string{
		string(v1.ServiceTypeClusterIP), string(v1.ServiceTypeNodePort), string(v1.ServiceTypeLoadBalancer), string(v1.ServiceTypeExternalName),
		string(v1.ProtocolTCP), string(v1.ProtocolUDP), string(v1.ProtocolSCTP),
		string(v1.IPv4Protocol), string(v1.IPv6Protocol), string(discoveryv1.AddressTypeFQDN),
		string(v1.ServiceAffinityNone), string(v1.ServiceAffinityClientIP),
		string(v1.ServiceExternalTrafficPolicyCluster), string(v1.ServiceExternalTrafficPolicyLocal),
		string(v1.LoadBalancerIPModeVIP), string(v1.LoadBalancerIPModeProxy),
		v1.ServiceTrafficDistributionPreferClose, "http", "https", "dns", "dns-tcp", "metrics",
	} {
		m[s] = s
	}
	return m
}()

// known returns b as a string, the one of knownStrings if it is one.
func known(b []byte) string {
	if s, ok := knownStrings[string(b)]; ok {
		return s
	}
	return string(b)
}
