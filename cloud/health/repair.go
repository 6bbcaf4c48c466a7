package health

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/atoll-edge/atoll/internal/protect"
)

// Any replica restores a protected node. The leader reconciles a node as
// soon as it changes; a replica that does not lead looks, at each resync,
// for a node it would protect that has been lost for RepairAfter and still
// is not (its unreachable:NoExecute taint, an endpoint of one of its
// serving pods not ready), and reconciles it itself, with the same write
// rules (one patch per object, each under preconditions), but only while
// the leader is silent (its Lease unrenewed for two retry periods): a
// live leader, even a slow one, does its own work, so no object is
// written twice. When the leader dies, its Lease passes to another
// replica only after the Lease's duration, and a protected node must not
// wait that long.

// repairs reconciles, on a replica that does not lead, the lost nodes of
// nodes it would protect that the leader left unprotected for
// RepairAfter. It returns how many it reconciled.
func (s *Service) repairs(ctx context.Context, nodes []*corev1.Node, now time.Time) int {
	if s.leads() || s.cfg.RepairAfter <= 0 {
		return 0
	}
	n := 0
	var leaderSilent *bool // read once a node needs it
	for _, node := range nodes {
		if !protect.LostByCloud(node) || now.Sub(lostSince(node)) < s.cfg.RepairAfter || !s.ProtectedNode(node) {
			continue
		}
		if !s.unprotected(ctx, node) {
			continue
		}
		if leaderSilent == nil {
			silent, err := s.leaderSilent(ctx)
			if err != nil {
				s.log.Warn("cannot tell whether the leader is alive; no repair this resync", "err", err)
				return n
			}
			leaderSilent = &silent
		}
		if !*leaderSilent {
			continue // the leader is alive: its work
		}
		s.log.Warn("restoring the protection of a node the leader left unprotected", "node", node.Name, "lost_for", now.Sub(lostSince(node)).Round(time.Second))
		s.metrics.repairs.Inc()
		if _, err := s.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Name: node.Name}}); err != nil {
			s.log.Warn("restoring a protected node failed; retrying at the next resync", "node", node.Name, "err", err)
		}
		n++
	}
	return n
}

// lostSince is when node's Ready condition last changed (zero: never).
func lostSince(node *corev1.Node) time.Time {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

// unprotected reports whether a node s protects still carries what its
// protection removes: the unreachable:NoExecute taint, or a not-ready
// endpoint of a serving pod on it.
func (s *Service) unprotected(ctx context.Context, node *corev1.Node) bool {
	if _, changed := protect.NodeTaints(node, true); changed {
		return true
	}
	var slices discoveryv1.EndpointSliceList
	if err := s.cache.List(ctx, &slices, client.MatchingFields{nodeIndex: node.Name}, client.UnsafeDisableDeepCopy); err == nil {
		for i := range slices.Items {
			if _, changed := protect.EndpointSlice(&slices.Items[i], s); changed {
				return true
			}
		}
	}
	var eps corev1.EndpointsList
	if err := s.cache.List(ctx, &eps, client.MatchingFields{nodeIndex: node.Name}, client.UnsafeDisableDeepCopy); err == nil {
		for i := range eps.Items {
			if _, changed := protect.Endpoints(&eps.Items[i], s); changed {
				return true
			}
		}
	}
	return false
}
