// Package wellknown defines, once, the Kubernetes names Atoll reads and
// writes: its labels, its annotations and its field manager. It imports
// nothing, so the cloud, the edge and the harnesses can all use it.
package wellknown

// Labels.
const (
	// LabelUnit is the default node label whose value names the node's
	// unit (site). The key is configurable (--unit-label).
	LabelUnit = "atoll.io/unit"
	// LabelCloud marks a node as a cloud node: never in a unit.
	LabelCloud = "atoll.io/cloud"
	// LabelAgent is AgentHost on a node whose atoll-edge runs as a host
	// service (deploy/host), not as the DaemonSet's pod.
	LabelAgent = "atoll.io/agent"
	AgentHost  = "host"
)

// Annotations Atoll sets on Nodes.
const (
	// AnnotationVerdict is the peers' verdict: healthy, unhealthy or none.
	AnnotationVerdict = "atoll.io/health-verdict"
	// AnnotationVerdictSince is when the cloud first saw the current
	// verdict (RFC 3339).
	AnnotationVerdictSince = "atoll.io/health-verdict-since"
	// AnnotationHoldUntil is when the hold of a fully disrupted unit ends.
	AnnotationHoldUntil = "atoll.io/unit-hold-until"
)

// Values of AnnotationVerdict.
const (
	VerdictHealthy   = "healthy"
	VerdictUnhealthy = "unhealthy"
	VerdictNone      = "none"
)

// FieldManager is the field manager of every write atoll-cloud makes to
// Kubernetes (patches, server-side applies, the webhook registration), and
// its client's user agent.
const FieldManager = "atoll-cloud"

// Grid workloads (cloud/grid): labels and annotations of the children of
// DeploymentGrids, StatefulSetGrids and ServiceGrids (apps.atoll.io).
const (
	// LabelGrid names the grid a child (Deployment, StatefulSet, Service)
	// and its pods belong to.
	LabelGrid = "apps.atoll.io/grid"
	// LabelGridUnit names the unit a grid's child and its pods run in.
	LabelGridUnit = "apps.atoll.io/unit"
	// AnnotationGridRevision is the hash of what the grid controller
	// applied to a child: equal to the desired one, nothing is written.
	AnnotationGridRevision = "apps.atoll.io/revision"
	// AnnotationGridRevisionSince is when the child got its revision
	// (RFC 3339): the start of its progress deadline in a rollout.
	AnnotationGridRevisionSince = "apps.atoll.io/revision-since"
)

// The protected set, kept in the apiserver for admission while no
// atoll-cloud replica answers: one ConfigMap per unit, in atoll-cloud's
// namespace, named ProtectedNodesPrefix+<unit>, labelled ProtectedNodesLabel,
// whose data keys are the unit's nodes Atoll protects should the cloud lose
// them (the peers see them healthy, or the unit is held). The pod readiness
// policy (PodReadinessPolicy, a ValidatingAdmissionPolicy) reads them.
const (
	ProtectedNodesLabel  = "atoll.io/protected-nodes"
	ProtectedNodesPrefix = "atoll-protected-"
	// PodReadinessPolicy names the ValidatingAdmissionPolicy, and its
	// binding, that refuse the node lifecycle controller's marking of a
	// protected node's pods not ready.
	PodReadinessPolicy = "atoll-pod-readiness"
)
