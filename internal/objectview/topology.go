package objectview

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/atoll-edge/atoll/internal/wellknown"
)

// AnyKey is the topology key that, last, means any endpoint.
const AnyKey = "*"

// TopologyKeys returns the topology keys of svc (nil: serve every
// endpoint). A headless Service has none: its endpoints pass through.
func TopologyKeys(svc *corev1.Service) []string {
	if svc == nil || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil
	}
	var keys []string
	for _, k := range strings.Split(svc.Annotations[wellknown.TopologyKeysAnnotation], ",") {
		if k = strings.TrimSpace(k); k != "" {
			keys = append(keys, k)
		}
	}
	return keys
}

// EndpointTopology is, for each node of an EndpointSlice's or Endpoints'
// endpoints, its values of the Service's topology keys (a key the node
// has no label for is left out): what the edge's topology filter reads,
// carried by the view itself (wellknown.EndpointTopologyAnnotation) so
// that no edge needs every Node of the cluster.
type EndpointTopology map[string]map[string]string

// NodeTopology is the values of keys among labels (AnyKey and keys the
// labels lack left out; nil when none is left).
func NodeTopology(keys []string, labels map[string]string) map[string]string {
	var out map[string]string
	for _, k := range keys {
		if v, ok := labels[k]; ok && k != AnyKey {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// Encode is t as the annotation's value: JSON with sorted keys, so that
// the same topology is the same bytes (and the view's fingerprint).
func (t EndpointTopology) Encode() string {
	b, _ := json.Marshal(map[string]map[string]string(t)) // maps of strings always encode, keys sorted
	return string(b)
}

// DecodeEndpointTopology reads the annotation of obj (nil, nil when it
// has none).
func DecodeEndpointTopology(obj Object) (EndpointTopology, error) {
	raw, ok := obj.GetAnnotations()[wellknown.EndpointTopologyAnnotation]
	if !ok {
		return nil, nil
	}
	var t EndpointTopology
	if err := json.Unmarshal([]byte(raw), &t); err != nil {
		return nil, fmt.Errorf("objectview: %s of %s/%s: %w", wellknown.EndpointTopologyAnnotation, obj.GetNamespace(), obj.GetName(), err)
	}
	return t, nil
}

// EndpointNodes are the names of the nodes of obj's endpoints (an
// EndpointSlice or Endpoints; ready and not), sorted, each once.
func EndpointNodes(obj Object) []string {
	set := map[string]struct{}{}
	add := func(n *string) {
		if n != nil && *n != "" {
			set[*n] = struct{}{}
		}
	}
	switch o := obj.(type) {
	case *discoveryv1.EndpointSlice:
		for i := range o.Endpoints {
			add(o.Endpoints[i].NodeName)
		}
	case *corev1.Endpoints:
		for _, ss := range o.Subsets {
			for i := range ss.Addresses {
				add(ss.Addresses[i].NodeName)
			}
			for i := range ss.NotReadyAddresses {
				add(ss.NotReadyAddresses[i].NodeName)
			}
		}
	}
	return slices.Sorted(maps.Keys(set))
}
