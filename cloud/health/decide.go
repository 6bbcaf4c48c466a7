package health

import (
	"time"

	"github.com/atoll-edge/atoll/internal/protect"
	"github.com/atoll-edge/atoll/internal/wellknown"

	corev1 "k8s.io/api/core/v1"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// UnitState is a unit's disruption state, after the node lifecycle
// controller's zone states.
type UnitState string

const (
	// Normal: every node of the unit is Ready in the cloud's view.
	Normal UnitState = "Normal"
	// PartialDisruption: some nodes are not Ready, or all are but their
	// peers still vote (the cloud hears the site).
	PartialDisruption UnitState = "PartialDisruption"
	// FullDisruption: no fresh vote comes from the unit and every node is
	// not Ready or had its leaf link to the hub reported closed: the whole
	// site is cut from the cloud.
	FullDisruption UnitState = "FullDisruption"
)

// Disruption classifies a unit from its nodes' Ready conditions, whether
// the hub reported each node's leaf link closed since its last vote
// (linkDown, in the same order; nil: none), and whether any fresh vote
// about any of its nodes reached the cloud. A unit whose every link the
// hub reported closed is fully disrupted at once, before the node
// lifecycle controller notices its nodes one by one (their Leases expire
// at different times): its hold then applies to each node as soon as it
// is lost, before the controller's NoExecute taint.
func Disruption(ready []corev1.ConditionStatus, linkDown []bool, freshVotes bool) UnitState {
	notReady, silent := 0, 0
	for i, r := range ready {
		down := i < len(linkDown) && linkDown[i]
		if r != corev1.ConditionTrue {
			notReady++
		}
		if r != corev1.ConditionTrue || down {
			silent++
		}
	}
	switch {
	case len(ready) > 0 && silent == len(ready) && !freshVotes:
		return FullDisruption
	case notReady == 0:
		return Normal
	default:
		return PartialDisruption
	}
}

// Protect is the decision table for one node: the cloud lost it (the node
// lifecycle controller set Ready=Unknown because the kubelet stopped
// posting status, protect.LostByCloud) and either its peers see it healthy
// or its whole unit is held. A node the cloud still hears (Ready True or
// False), or whose Unknown has another cause, is left to Kubernetes.
func Protect(node *corev1.Node, t Tally, held bool) bool {
	if !protect.LostByCloud(node) {
		return false
	}
	return t.Verdict == atollv1.Verdict_VERDICT_HEALTHY || held
}

// ReadyStatus is the status of the node's Ready condition (Unknown when
// missing).
func ReadyStatus(n *corev1.Node) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return corev1.ConditionUnknown
}

// VerdictName is the annotation value of a verdict.
func VerdictName(v atollv1.Verdict) string {
	switch v {
	case atollv1.Verdict_VERDICT_HEALTHY:
		return wellknown.VerdictHealthy
	case atollv1.Verdict_VERDICT_UNHEALTHY:
		return wellknown.VerdictUnhealthy
	default:
		return wellknown.VerdictNone
	}
}

// Annotations returns the annotations Atoll wants on a node, given its
// tally; hold is the end of its unit's hold while it is in force (zero:
// none). They change only when the verdict or the hold do, so a steady
// cluster sees no writes: the vote counts, which move with every report,
// are not written (`atoll status` shows them); nor is the unit's
// disruption state, which would rewrite every node of a unit each time one
// of them is lost or found (the metric atoll_health_unit_disruption and
// `atoll status` show it); and the verdict's since is the time the cloud
// first saw it — kept from cur, the node's current annotations, while the
// verdict stays — not the voters' own, which differ from voter to voter.
// The hold is written because the guard webhook reads it: while no
// atoll-cloud replica answers, it is what keeps a held unit's nodes from
// being tainted for eviction.
func Annotations(t Tally, hold time.Time, cur map[string]string, now time.Time) map[string]string {
	verdict := VerdictName(t.Verdict)
	a := map[string]string{wellknown.AnnotationVerdict: verdict}
	if verdict != VerdictName(atollv1.Verdict_VERDICT_NONE) {
		since := cur[wellknown.AnnotationVerdictSince]
		if cur[wellknown.AnnotationVerdict] != verdict || since == "" {
			since = now.UTC().Format(time.RFC3339)
		}
		a[wellknown.AnnotationVerdictSince] = since
	}
	if !hold.IsZero() {
		a[wellknown.AnnotationHoldUntil] = hold.UTC().Format(time.RFC3339)
	}
	return a
}

// ManagedAnnotations are the keys Atoll owns on Nodes: those Annotations
// may set.
var ManagedAnnotations = []string{wellknown.AnnotationVerdict, wellknown.AnnotationVerdictSince, wellknown.AnnotationHoldUntil}
