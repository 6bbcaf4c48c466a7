package protect

import corev1 "k8s.io/api/core/v1"

// ReasonNodeStatusUnknown is the reason the node lifecycle controller of
// kube-controller-manager (k8s.io/kubernetes pkg/controller/nodelifecycle)
// gives the Ready condition it turns Unknown when the kubelet stopped
// posting node status ("Kubelet stopped posting node status.").
const ReasonNodeStatusUnknown = "NodeStatusUnknown"

// LostByCloud reports whether the cloud lost node: its Ready condition is
// Unknown, set so by the node lifecycle controller because the kubelet
// stopped posting status. Only such a node may be protected: Ready=False,
// and Unknown for any other reason (a kubelet that reports it does not
// know, a node that never posted status), are the node's own word or no
// word at all, and Atoll never overrides them, on the Node or through its
// endpoints.
func LostByCloud(node *corev1.Node) bool {
	if node == nil {
		return false
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionUnknown && c.Reason == ReasonNodeStatusUnknown
		}
	}
	return false
}

// ReportsReady reports whether node's Ready condition is True: only the
// kubelet reports that.
func ReportsReady(node *corev1.Node) bool {
	if node == nil {
		return false
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
