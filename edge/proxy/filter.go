package proxy

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/atoll-edge/atoll/internal/objectview"
)

// Selector decides which endpoints of one Service a host serves.
type Selector struct {
	// all: no filtering (no keys, or "*" reached).
	all bool
	// key and value: endpoints on nodes whose label key equals value.
	key, value string
	topo       objectview.EndpointTopology
}

// Choose picks, for a Service with keys, the first key under which a
// ready endpoint sits on a node sharing the host's value (topo: the
// labels of the nodes of all the Service's endpoints; ready: the nodes
// with at least one ready endpoint). A key whose near endpoints are all
// not ready does not count: the next key is tried, and "*" reached means
// every endpoint, so the ready ones of other units serve. When no key
// has a ready endpoint and none is "*", the first key with any near
// endpoint is chosen (its endpoints, none ready: the Service refuses as
// it would unfiltered); no key with any means none. A host without a key
// yields nothing under it.
func Choose(keys []string, host map[string]string, topo objectview.EndpointTopology, ready map[string]bool) Selector {
	if len(keys) == 0 {
		return Selector{all: true}
	}
	var first Selector // the first key with a near endpoint, ready or not
	for _, k := range keys {
		if k == objectview.AnyKey {
			return Selector{all: true}
		}
		hv, ok := host[k]
		if !ok {
			continue
		}
		near := false
		for n, l := range topo {
			if v, ok := l[k]; ok && v == hv {
				if ready[n] {
					return Selector{key: k, value: hv, topo: topo}
				}
				near = true
			}
		}
		if near && first.key == "" {
			first = Selector{key: k, value: hv, topo: topo}
		}
	}
	return first
}

// ReadySlices are the nodes with at least one ready endpoint in slices
// (an endpoint whose ready condition is unset counts as ready, as the
// API says).
func ReadySlices(slices ...*discoveryv1.EndpointSlice) map[string]bool {
	ready := map[string]bool{}
	for _, sl := range slices {
		for _, ep := range sl.Endpoints {
			if ep.NodeName != nil && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) {
				ready[*ep.NodeName] = true
			}
		}
	}
	return ready
}

// ReadyEndpoints are the nodes with at least one ready address in ep.
func ReadyEndpoints(ep *corev1.Endpoints) map[string]bool {
	ready := map[string]bool{}
	for _, ss := range ep.Subsets {
		for _, a := range ss.Addresses {
			if a.NodeName != nil {
				ready[*a.NodeName] = true
			}
		}
	}
	return ready
}

// Keep reports whether the endpoint on node is served.
func (s Selector) Keep(node string) bool {
	if s.all {
		return true
	}
	if s.key == "" || node == "" {
		return false
	}
	v, ok := s.topo[node][s.key]
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
