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

// Choose picks, for a Service with keys, the first key under which an
// endpoint sits on a node sharing the host's value (topo: the labels of
// the nodes of all the Service's endpoints, as their views carry them);
// "*" reached means every endpoint; no key yielding any means none. A
// host without a key yields nothing under it.
func Choose(keys []string, host map[string]string, topo objectview.EndpointTopology) Selector {
	if len(keys) == 0 {
		return Selector{all: true}
	}
	for _, k := range keys {
		if k == objectview.AnyKey {
			return Selector{all: true}
		}
		hv, ok := host[k]
		if !ok {
			continue
		}
		for _, l := range topo {
			if v, ok := l[k]; ok && v == hv {
				return Selector{key: k, value: hv, topo: topo}
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
