// Package webhook is Atoll's mutating admission webhook for distributed
// health. When the cloud loses a node that its unit peers still see healthy,
// the node lifecycle controller taints it unreachable:NoExecute and the
// endpoint controllers mark its pods' endpoints not ready, and they keep
// re-applying that view. The webhook applies Atoll's view on every such
// write instead: a protected node keeps only unreachable:NoSchedule, and its
// pods stay ready in Endpoints and EndpointSlices.
//
// The rules are pure functions (ProtectNode, ProtectEndpointSlice,
// ProtectEndpoints) that the health service can also use for its direct
// patches. Server serves them over HTTPS; Register installs the
// MutatingWebhookConfiguration. The webhook never denies a request.
package webhook

import corev1 "k8s.io/api/core/v1"

// Policy says which nodes Atoll protects: the cloud lost them but their unit
// peers see them healthy (or their unit is held). Protected is called on
// every admission request, concurrently, and must answer from memory.
type Policy interface {
	Protected(node string) bool
}

// PolicyFunc adapts a function to Policy.
type PolicyFunc func(node string) bool

// Protected calls f.
func (f PolicyFunc) Protected(node string) bool { return f(node) }

// NodePolicy is implemented by policies that judge a Node from the object
// being written rather than by name: the node lifecycle controller marks a
// node Ready=Unknown and taints it moments apart, and the written object
// carries the Ready condition before any cache has seen it.
type NodePolicy interface {
	ProtectedNode(node *corev1.Node) bool
}

// PodPolicy is implemented by policies that keep an endpoint ready only for
// a pod that was serving when its node was lost. The node lifecycle
// controller marks every pod of a lost node not ready; a pod that was
// already failing must not be made ready again.
type PodPolicy interface {
	Serving(namespace, pod string) bool
}

// nodeProtected asks p about node, preferring NodePolicy.
func nodeProtected(node *corev1.Node, p Policy) bool {
	if np, ok := p.(NodePolicy); ok {
		return np.ProtectedNode(node)
	}
	return p.Protected(node.Name)
}

// podServing asks p whether the pod behind an endpoint was serving; true
// when p has no PodPolicy or the target is not a pod.
func podServing(ref *corev1.ObjectReference, p Policy) bool {
	pp, ok := p.(PodPolicy)
	if !ok || ref == nil || ref.Kind != "Pod" {
		return true
	}
	return pp.Serving(ref.Namespace, ref.Name)
}
