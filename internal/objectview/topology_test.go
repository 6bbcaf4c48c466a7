package objectview

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/atoll-edge/atoll/internal/wellknown"
)

// The topology a view carries: only the keys a node has (never "*"),
// the same bytes for the same topology, every node of an object's
// endpoints once, and an annotation that does not decode named in the
// error.
func TestEndpointTopology(t *testing.T) {
	if got := NodeTopology([]string{"zone", "region", AnyKey}, map[string]string{"zone": "z1", "other": "x", AnyKey: "?"}); fmt.Sprint(got) != "map[zone:z1]" {
		t.Fatalf("NodeTopology = %v", got)
	}
	if got := NodeTopology([]string{"zone"}, nil); got != nil {
		t.Fatalf("NodeTopology of a node without the key = %v, want nil", got)
	}
	a := EndpointTopology{"n2": {"zone": "b", "region": "r"}, "n1": {"zone": "a"}}
	b := EndpointTopology{"n1": {"zone": "a"}, "n2": {"region": "r", "zone": "b"}}
	if a.Encode() != b.Encode() || a.Encode() != `{"n1":{"zone":"a"},"n2":{"region":"r","zone":"b"}}` {
		t.Fatalf("encodings %s and %s", a.Encode(), b.Encode())
	}
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "default", Annotations: map[string]string{wellknown.EndpointTopologyAnnotation: a.Encode()}},
		Endpoints:  []discoveryv1.Endpoint{{NodeName: ptr.To("n2")}, {NodeName: ptr.To("n1")}, {NodeName: ptr.To("n2")}, {}},
	}
	if got := EndpointNodes(sl); fmt.Sprint(got) != "[n1 n2]" {
		t.Fatalf("EndpointNodes(slice) = %v", got)
	}
	if got, err := DecodeEndpointTopology(sl); err != nil || got.Encode() != a.Encode() {
		t.Fatalf("decoded %v, %v", got, err)
	}
	ep := &corev1.Endpoints{Subsets: []corev1.EndpointSubset{{
		Addresses: []corev1.EndpointAddress{{NodeName: ptr.To("n3")}}, NotReadyAddresses: []corev1.EndpointAddress{{NodeName: ptr.To("n1")}},
	}}}
	if got := EndpointNodes(ep); fmt.Sprint(got) != "[n1 n3]" {
		t.Fatalf("EndpointNodes(endpoints) = %v", got)
	}
	if got, err := DecodeEndpointTopology(ep); got != nil || err != nil {
		t.Fatalf("no annotation decoded as %v, %v", got, err)
	}
	sl.Annotations[wellknown.EndpointTopologyAnnotation] = `{"n1":["zone"]}`
	if _, err := DecodeEndpointTopology(sl); err == nil || !strings.Contains(err.Error(), "default/web-1") || !strings.Contains(err.Error(), wellknown.EndpointTopologyAnnotation) {
		t.Fatalf("a broken annotation: %v", err)
	}
}
