// Package protect holds the rules of what a node that Atoll protects keeps
// while the cloud has lost it: the cloud's node lifecycle and endpoint
// controllers taint it unreachable:NoExecute and mark its pods' endpoints
// not ready, and a protected node keeps only unreachable:NoSchedule and its
// serving pods' endpoints ready. Which nodes the cloud has lost is itself a
// rule here (LostByCloud): only those whose Ready=Unknown comes from the
// node lifecycle controller may be protected.
//
// The rules are pure functions of an object and the verdict state (a
// Policy: which nodes are protected, and optionally a NodePolicy and a
// PodPolicy). The admission webhook (cloud/webhook), the health reconciler
// (cloud/health) and the edge endpoints proxy call them. The package imports
// only the standard library, k8s.io/api and k8s.io/apimachinery, so any of
// them can; a layout test keeps it that way.
package protect

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

// EndpointPolicy is implemented by policies that keep a node's serving
// pods' endpoints ready a little beyond the node's protection: the node
// lifecycle controller marked its pods not ready while it was lost, and
// when it comes back they stay so until its kubelet posts their status
// again, moments after the node's own.
type EndpointPolicy interface {
	KeepsEndpoints(node string) bool
}

// keepsEndpoints asks p about node's endpoints, preferring EndpointPolicy.
func keepsEndpoints(node string, p Policy) bool {
	if ep, ok := p.(EndpointPolicy); ok {
		return ep.KeepsEndpoints(node)
	}
	return p.Protected(node)
}

// NodeProtected asks p about node, preferring NodePolicy.
func NodeProtected(node *corev1.Node, p Policy) bool {
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
