package protect

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// The functions below never modify their argument. When they change
// something they return a deep copy with the change and true; otherwise they
// return the argument itself and false, so the caller must not modify the
// result of a no-op.

// Node applies NodeTaints to node with p's judgement of it (NodePolicy
// first, see NodeProtected), or as protected when node, as written,
// reports itself Ready: the node lifecycle controller taints a node from
// its cache, which may not have seen yet the kubelet's report that ended
// the loss (it never taints a node it sees Ready, and takes the taint off
// at its next pass), and meanwhile the taint would evict every pod that
// does not tolerate it.
func Node(node *corev1.Node, p Policy) (*corev1.Node, bool) {
	if node == nil {
		return node, false
	}
	return NodeTaints(node, ReportsReady(node) || NodeProtected(node, p))
}

// NodeTaints removes the node.kubernetes.io/unreachable:NoExecute taint
// from a protected node, so the taint-eviction controller does not evict its
// pods. Every other taint stays, including unreachable:NoSchedule: the
// scheduler should not place new pods on a node the cloud cannot reach. An
// unprotected node keeps everything.
func NodeTaints(node *corev1.Node, protected bool) (*corev1.Node, bool) {
	if node == nil || !protected {
		return node, false
	}
	if !slices.ContainsFunc(node.Spec.Taints, isUnreachableNoExecute) {
		return node, false
	}
	out := node.DeepCopy()
	kept := make([]corev1.Taint, 0, len(out.Spec.Taints)-1)
	for _, t := range out.Spec.Taints {
		if !isUnreachableNoExecute(t) {
			kept = append(kept, t)
		}
	}
	if len(kept) == 0 {
		kept = nil
	}
	out.Spec.Taints = kept
	return out, true
}

func isUnreachableNoExecute(t corev1.Taint) bool {
	return t.Key == corev1.TaintNodeUnreachable && t.Effect == corev1.TaintEffectNoExecute
}

// EndpointSlice marks every endpoint on a protected node (with an
// EndpointPolicy: a node whose endpoints it keeps) that is not
// terminating ready and serving (with a PodPolicy: only if its pod was
// serving). Endpoints on other nodes, without a node name, or terminating
// are left as they are.
func EndpointSlice(slice *discoveryv1.EndpointSlice, p Policy) (*discoveryv1.EndpointSlice, bool) {
	if slice == nil {
		return slice, false
	}
	var out *discoveryv1.EndpointSlice
	for i := range slice.Endpoints {
		if !endpointNeedsProtection(slice.Endpoints[i], p) {
			continue
		}
		if out == nil {
			out = slice.DeepCopy()
		}
		c := &out.Endpoints[i].Conditions
		c.Ready, c.Serving = ptrTrue(), ptrTrue()
	}
	if out == nil {
		return slice, false
	}
	return out, true
}

func endpointNeedsProtection(ep discoveryv1.Endpoint, p Policy) bool {
	c := ep.Conditions
	switch {
	case ep.NodeName == nil || *ep.NodeName == "":
		return false
	case c.Terminating != nil && *c.Terminating:
		return false
	case isTrue(c.Ready) && isTrue(c.Serving):
		return false // already what we would write; skip the policy lookup
	}
	return keepsEndpoints(*ep.NodeName, p) && podServing(ep.TargetRef, p)
}

// Endpoints moves, in every subset, the not-ready addresses of
// protected nodes (with an EndpointPolicy: nodes whose endpoints it
// keeps) to the ready addresses: the existing ready addresses
// first, then the moved ones in their original order. Ports stay with their
// subset; addresses of other nodes stay where they are (with a PodPolicy,
// so do addresses of pods that were not serving).
func Endpoints(ep *corev1.Endpoints, p Policy) (*corev1.Endpoints, bool) {
	if ep == nil {
		return ep, false
	}
	var out *corev1.Endpoints
	for si := range ep.Subsets {
		// Ask the policy once per address, so the split is consistent even
		// if the policy changes meanwhile.
		var move []bool
		for ai, a := range ep.Subsets[si].NotReadyAddresses {
			if a.NodeName == nil || *a.NodeName == "" || !keepsEndpoints(*a.NodeName, p) || !podServing(a.TargetRef, p) {
				continue
			}
			if move == nil {
				move = make([]bool, len(ep.Subsets[si].NotReadyAddresses))
			}
			move[ai] = true
		}
		if move == nil {
			continue
		}
		if out == nil {
			out = ep.DeepCopy()
		}
		// Build both lists anew from the (copied) originals rather than
		// deleting in place while iterating: no index arithmetic to get
		// wrong when several addresses move or when addresses of protected
		// and unprotected nodes interleave.
		sub := &out.Subsets[si]
		ready := make([]corev1.EndpointAddress, 0, len(sub.Addresses)+len(sub.NotReadyAddresses))
		ready = append(ready, sub.Addresses...)
		var notReady []corev1.EndpointAddress
		for ai, a := range sub.NotReadyAddresses {
			if move[ai] {
				ready = append(ready, a)
			} else {
				notReady = append(notReady, a)
			}
		}
		sub.Addresses, sub.NotReadyAddresses = ready, notReady
	}
	if out == nil {
		return ep, false
	}
	return out, true
}

func isTrue(b *bool) bool { return b != nil && *b }

func ptrTrue() *bool { t := true; return &t }
