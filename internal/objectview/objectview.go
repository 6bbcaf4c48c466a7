// Package objectview encodes and decodes the object views the cloud
// publishes to each unit on the VIEWS stream (atollv1.ObjectView): one
// Kubernetes Service, EndpointSlice, Endpoints or Node in its protobuf
// wire form, with a fingerprint of its content. The cloud publisher
// (cloud/views/objects) and the edge proxy (edge/proxy) share it; it
// imports only k8s.io/api and apimachinery.
package objectview

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"

	"github.com/atoll-edge/atoll/events"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// The kinds of object views: lowercase plural resources, the kind token of
// their subjects.
const (
	KindServices       = "services"
	KindEndpointSlices = "endpointslices"
	KindEndpoints      = "endpoints"
	KindNodes          = "nodes"
)

// Kinds are the kinds of object views.
var Kinds = []string{KindNodes, KindServices, KindEndpointSlices, KindEndpoints}

// ContentTypeProtobuf is the encoding of the objects in the views.
const ContentTypeProtobuf = "application/vnd.kubernetes.protobuf"

// Object is a Kubernetes object of one of the Kinds.
type Object interface {
	metav1.Object
	runtime.Object
}

// Info describes one kind.
type Info struct {
	GVK        schema.GroupVersionKind
	Namespaced bool
	New        func() Object
	NewList    func() runtime.Object
}

// Kind returns what is known of kind, and whether it is one of the Kinds.
func Kind(kind string) (Info, bool) { i, ok := kindInfo[kind]; return i, ok }

var kindInfo = map[string]Info{
	KindServices: {
		GVK: corev1.SchemeGroupVersion.WithKind("Service"), Namespaced: true,
		New: func() Object { return &corev1.Service{} }, NewList: func() runtime.Object { return &corev1.ServiceList{} },
	},
	KindEndpointSlices: {
		GVK: discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice"), Namespaced: true,
		New: func() Object { return &discoveryv1.EndpointSlice{} }, NewList: func() runtime.Object { return &discoveryv1.EndpointSliceList{} },
	},
	KindEndpoints: {
		GVK: corev1.SchemeGroupVersion.WithKind("Endpoints"), Namespaced: true,
		New: func() Object { return &corev1.Endpoints{} }, NewList: func() runtime.Object { return &corev1.EndpointsList{} },
	},
	KindNodes: {
		GVK: corev1.SchemeGroupVersion.WithKind("Node"),
		New: func() Object { return &corev1.Node{} }, NewList: func() runtime.Object { return &corev1.NodeList{} },
	},
}

// Scheme knows the kinds of the views (and the meta types).
var Scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := discoveryv1.AddToScheme(s); err != nil {
		panic(err)
	}
	// ServiceCIDRs: the edge proxy serves them (empty) to kube-proxy.
	if err := networkingv1.AddToScheme(s); err != nil {
		panic(err)
	}
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	return s
}()

// serializer is the protobuf wire form kube-apiserver serves as
// application/vnd.kubernetes.protobuf.
var serializer = protobuf.NewSerializer(Scheme, Scheme)

// Encode returns the view of obj, of kind. obj is encoded as it is; the
// caller trims it first.
func Encode(kind string, obj Object) (*atollv1.ObjectView, error) {
	info, ok := kindInfo[kind]
	if !ok {
		return nil, fmt.Errorf("objectview: unknown kind %q", kind)
	}
	obj.GetObjectKind().SetGroupVersionKind(info.GVK)
	var buf bytes.Buffer
	if err := serializer.Encode(obj, &buf); err != nil {
		return nil, fmt.Errorf("objectview: encode %s %s/%s: %w", kind, obj.GetNamespace(), obj.GetName(), err)
	}
	v := &atollv1.ObjectView{
		Kind:            kind,
		Namespace:       obj.GetNamespace(),
		Name:            obj.GetName(),
		Uid:             string(obj.GetUID()),
		ResourceVersion: obj.GetResourceVersion(),
		ContentType:     ContentTypeProtobuf,
		Object:          buf.Bytes(),
	}
	fp, err := Fingerprint(v)
	if err != nil {
		return nil, err
	}
	v.Fingerprint = fp
	return v, nil
}

// Tombstone is the view of a deleted object: its name, namespace and uid.
func Tombstone(kind, namespace, name, uid string) (*atollv1.ObjectView, error) {
	info, ok := kindInfo[kind]
	if !ok {
		return nil, fmt.Errorf("objectview: unknown kind %q", kind)
	}
	obj := info.New()
	obj.SetNamespace(namespace)
	obj.SetName(name)
	obj.SetUID(types.UID(uid))
	v, err := Encode(kind, obj)
	if err != nil {
		return nil, err
	}
	v.Deleted = true
	if v.Fingerprint, err = Fingerprint(v); err != nil {
		return nil, err
	}
	return v, nil
}

// Fingerprint digests the content of v: everything but its resource
// version, time and fingerprint.
func Fingerprint(v *atollv1.ObjectView) (string, error) {
	c := proto.Clone(v).(*atollv1.ObjectView)
	c.ResourceVersion, c.Time, c.Fingerprint = "", nil, ""
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("objectview: fingerprint: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16]), nil
}

// Subject is where the view of (kind, namespace, name) for unit goes; an
// empty namespace is a cluster-scoped object's.
func Subject(unit, kind, namespace, name string) (string, error) {
	if namespace == "" {
		namespace = events.ClusterScoped
	}
	return events.ViewSubject(unit, kind, namespace, name)
}

// Decode returns the Kubernetes object a view carries, with its kind set.
func Decode(v *atollv1.ObjectView) (Object, error) {
	info, ok := kindInfo[v.GetKind()]
	if !ok {
		return nil, fmt.Errorf("objectview: unknown kind %q", v.GetKind())
	}
	if v.GetContentType() != ContentTypeProtobuf {
		return nil, fmt.Errorf("objectview: %s %s/%s: content type %q", v.GetKind(), v.GetNamespace(), v.GetName(), v.GetContentType())
	}
	obj := info.New()
	if _, _, err := serializer.Decode(v.GetObject(), &info.GVK, obj); err != nil {
		return nil, fmt.Errorf("objectview: decode %s %s/%s: %w", v.GetKind(), v.GetNamespace(), v.GetName(), err)
	}
	obj.GetObjectKind().SetGroupVersionKind(info.GVK)
	return obj, nil
}
