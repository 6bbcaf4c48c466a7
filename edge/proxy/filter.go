package proxy

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/atoll-edge/atoll/internal/wellknown"
)

// AnyKey, as the last topology key, means any endpoint.
const AnyKey = "*"

// TopologyKeys returns the topology keys of svc (nil: serve every
// endpoint). A headless Service has none: its endpoints pass through.
func TopologyKeys(svc *corev1.Service) []string {
	if svc == nil || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil
	}
	raw := svc.Annotations[wellknown.TopologyKeysAnnotation]
	var keys []string
	for _, k := range strings.Split(raw, ",") {
		if k = strings.TrimSpace(k); k != "" {
			keys = append(keys, k)
		}
	}
	return keys
}

// Labels returns the labels of a node by name (false: unknown node).
type Labels func(node string) (map[string]string, bool)

// Selector decides which endpoints of one Service a host serves.
type Selector struct {
	// all: no filtering (no keys, or "*" reached).
	all bool
	// key and value: endpoints on nodes whose label key equals value.
	key, value string
	labels     Labels
}

// Choose picks, for a Service with keys, the first key under which an
// endpoint (of nodeNames, the nodes of all the Service's endpoints) sits
// on a node sharing the host's value; "*" reached means every endpoint;
// no key yielding any means none. A host without a key yields nothing
// under it.
func Choose(keys []string, host map[string]string, nodeNames []string, labels Labels) Selector {
	if len(keys) == 0 {
		return Selector{all: true}
	}
	for _, k := range keys {
		if k == AnyKey {
			return Selector{all: true}
		}
		hv, ok := host[k]
		if !ok {
			continue
		}
		for _, n := range nodeNames {
			if l, ok := labels(n); ok {
				if v, ok := l[k]; ok && v == hv {
					return Selector{key: k, value: hv, labels: labels}
				}
			}
		}
	}
	return Selector{} // none
}

// Keep reports whether the endpoint on node is served.
func (s Selector) Keep(node string) bool {
	if s.all {
		return true
	}
	if s.key == "" || node == "" {
		return false
	}
	l, ok := s.labels(node)
	if !ok {
		return false
	}
	v, ok := l[s.key]
	return ok && v == s.value
}

// FilterSlice returns slice with only the endpoints s keeps (a copy when
// anything is dropped).
func (s Selector) FilterSlice(slice *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	if s.all {
		return slice
	}
	out := slice.DeepCopy()
	out.Endpoints = nil
	for _, ep := range slice.Endpoints {
		node := ""
		if ep.NodeName != nil {
			node = *ep.NodeName
		}
		if s.Keep(node) {
			out.Endpoints = append(out.Endpoints, *ep.DeepCopy())
		}
	}
	return out
}

// FilterEndpoints returns ep with only the addresses s keeps; a subset
// left without addresses is dropped.
func (s Selector) FilterEndpoints(ep *corev1.Endpoints) *corev1.Endpoints {
	if s.all {
		return ep
	}
	out := ep.DeepCopy()
	out.Subsets = nil
	keep := func(as []corev1.EndpointAddress) []corev1.EndpointAddress {
		var kept []corev1.EndpointAddress
		for _, a := range as {
			node := ""
			if a.NodeName != nil {
				node = *a.NodeName
			}
			if s.Keep(node) {
				kept = append(kept, a)
			}
		}
		return kept
	}
	for _, ss := range ep.DeepCopy().Subsets {
		ss.Addresses, ss.NotReadyAddresses = keep(ss.Addresses), keep(ss.NotReadyAddresses)
		if len(ss.Addresses)+len(ss.NotReadyAddresses) > 0 {
			out.Subsets = append(out.Subsets, ss)
		}
	}
	return out
}

// sliceNodes are the node names of the endpoints of slices.
func sliceNodes(slices []*discoveryv1.EndpointSlice) []string {
	var out []string
	for _, sl := range slices {
		for _, ep := range sl.Endpoints {
			if ep.NodeName != nil {
				out = append(out, *ep.NodeName)
			}
		}
	}
	return out
}

// endpointsNodes are the node names of the addresses of ep.
func endpointsNodes(ep *corev1.Endpoints) []string {
	var out []string
	for _, ss := range ep.Subsets {
		for _, as := range [][]corev1.EndpointAddress{ss.Addresses, ss.NotReadyAddresses} {
			for _, a := range as {
				if a.NodeName != nil {
					out = append(out, *a.NodeName)
				}
			}
		}
	}
	return out
}
