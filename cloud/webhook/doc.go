// Package webhook is Atoll's mutating admission webhook for distributed
// health. When the cloud loses a node that its unit peers still see healthy,
// the node lifecycle controller taints it unreachable:NoExecute and the
// endpoint controllers mark its pods' endpoints not ready, and they keep
// re-applying that view. The webhook applies Atoll's view on every such
// write instead: a protected node keeps only unreachable:NoSchedule, and its
// pods stay ready in Endpoints and EndpointSlices.
//
// The rules live in internal/protect; this package adapts them to
// admission requests (an admission.Handler), serves them on
// controller-runtime's webhook.Server with a cert watcher on the
// certificate directory (Server), and installs the
// MutatingWebhookConfiguration (Register). It runs on every atoll-cloud
// replica, answering from that replica's vote state. The webhook never
// denies a request.
package webhook
