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
	// FullDisruption: the whole site is cut from the cloud: no fresh vote
	// comes from the unit, and the cloud hears none of its members, by
	// their kubelets (not Ready) or by their Leases and agents together
	// (a Lease no longer renewed, an agent's leaf link reported closed).
	// The unit is held.
	FullDisruption UnitState = "FullDisruption"
	// AgentsSilent: every agent of the unit is cut from the hub (a bad
	// agent rollout, a site that reaches the apiserver but not the hub),
	// while some of its kubelets still report. No peer verdict reaches
	// the cloud, so nothing protects a node that is lost; the unit is not
	// held: a node whose kubelet dies is left to Kubernetes.
	AgentsSilent UnitState = "AgentsSilent"
)

// UnitStates are the states, in the order of their metric.
var UnitStates = []UnitState{Normal, PartialDisruption, FullDisruption, AgentsSilent}

// Member is what the cloud hears of one member of a unit.
type Member struct {
	// Ready is the member's Ready condition.
	Ready corev1.ConditionStatus
	// LinkDown: the hub reported its agent's leaf link closed after the
	// agent's last ballot.
	LinkDown bool
	// Silent: LinkDown, for SilentAfter already.
	Silent bool
	// Unheard: no ballot of its agent reached the hub for UnheardAfter
	// (none since this replica started: since then), though no close of
	// its link was reported: the hub's report went unseen (the link
	// closed while no replica ran, or with the hub server that held it).
	Unheard bool
	// LeaseStale: its kubelet's Lease was not renewed for half its
	// duration (or it has none).
	LeaseStale bool
}

// Lost reports whether the cloud hears nothing of m: its kubelet is not
// Ready, or its agent is not heard (its link down, or Unheard) and its
// kubelet's Lease stale. A site cut off has its links reported closed
// within a ping interval of each other (its cut voters' votes keep
// protecting meanwhile: Config.CutGrace) and its Leases go stale within
// half a Lease's duration, before the node lifecycle controller marks its
// nodes Unknown one by one: its hold then applies to each node as soon as
// the controller loses it, before its NoExecute taint. A site cut off
// while no atoll-cloud replica ran is seen by its silence instead.
func (m Member) Lost() bool {
	return m.Ready != corev1.ConditionTrue || ((m.LinkDown || m.Unheard) && m.LeaseStale)
}

// Disruption classifies a unit from what the cloud hears of its members
// and whether fresh votes about any of them still reach the cloud
// (Config.UnheardAfter).
func Disruption(members []Member, freshVotes bool) UnitState {
	notReady, lost, silent := 0, 0, 0
	for _, m := range members {
		if m.Ready != corev1.ConditionTrue {
			notReady++
		}
		if m.Lost() {
			lost++
		}
		if m.Silent {
			silent++
		}
	}
	switch {
	case len(members) == 0 || freshVotes:
		if notReady == 0 {
			return Normal
		}
		return PartialDisruption
	case lost == len(members):
		return FullDisruption
	case silent == len(members):
		return AgentsSilent
	case notReady == 0:
		return Normal
	default:
		return PartialDisruption
	}
}

// Protect is the decision table for one node: the cloud lost it (the node
// lifecycle controller set Ready=Unknown because the kubelet stopped
// posting status, protect.LostByCloud) and either its peers see it healthy
// (their votes that count, with those of voters cut less than the cut
// grace ago: Tally.Protecting) or its whole unit is held. A node the cloud still hears (Ready True or
// False), or whose Unknown has another cause, is left to Kubernetes.
func Protect(node *corev1.Node, t Tally, held bool) bool {
	if !protect.LostByCloud(node) {
		return false
	}
	return t.Verdict == atollv1.Verdict_VERDICT_HEALTHY || t.Protecting == atollv1.Verdict_VERDICT_HEALTHY || held
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
