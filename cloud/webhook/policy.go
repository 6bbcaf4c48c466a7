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
