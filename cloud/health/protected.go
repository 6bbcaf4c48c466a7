package health

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/atoll-edge/atoll/internal/wellknown"
)

// The protected set keeps, in the apiserver, what the pod readiness policy
// (cloud/webhook, a ValidatingAdmissionPolicy) needs to keep a protected
// node's pods ready with no atoll-cloud replica answering: per unit, a
// ConfigMap (wellknown.ProtectedNodesPrefix+<unit>, labelled
// wellknown.ProtectedNodesLabel) whose data keys are the unit's nodes
// Atoll protects should the cloud lose them: those whose verdict
// annotation is healthy, or whose unit's hold is in force (the node
// annotations the guard webhook reads too). The leader writes a unit's
// ConfigMap when that set changes (server-side apply: no read-modify-write);
// a unit with none gets empty data. Steady state writes nothing.
type protectedSets struct {
	namespace string

	mu      sync.Mutex
	written map[string]map[string]string // unit → data as last written (or read at start)
	read    bool                         // written was filled from the cache
}

// protectedData is the data of unit's ConfigMap for its members at now.
func protectedData(members []*corev1.Node, now time.Time) map[string]string {
	data := map[string]string{}
	for _, n := range members {
		switch {
		case n.Annotations[wellknown.AnnotationVerdict] == wellknown.VerdictHealthy:
			data[n.Name] = wellknown.VerdictHealthy
		case holdInForce(n, now):
			data[n.Name] = "held"
		}
	}
	return data
}

// persistedProtection reports whether n's annotations say Atoll protects
// it should the cloud lose it: its peers' verdict healthy, or its unit's
// hold in force. It is the decision the cloud last wrote on the node.
func persistedProtection(n *corev1.Node, now time.Time) bool {
	return n.Annotations[wellknown.AnnotationVerdict] == wellknown.VerdictHealthy || holdInForce(n, now)
}

// holdInForce reports whether n's hold annotation names a time after now.
func holdInForce(n *corev1.Node, now time.Time) bool {
	v, ok := n.Annotations[wellknown.AnnotationHoldUntil]
	if !ok {
		return false
	}
	until, err := time.Parse(time.RFC3339, v)
	return err == nil && now.Before(until)
}

// ProtectedConfigMap names unit's ConfigMap of the protected set.
func ProtectedConfigMap(unit string) string { return wellknown.ProtectedNodesPrefix + unit }

// syncProtected brings every unit's ConfigMap in line with byUnit (unit →
// members; nil members: the unit vanished), writing only those that
// differ from what was last written. Only the leader calls it.
func (s *Service) syncProtected(ctx context.Context, byUnit map[string][]*corev1.Node, now time.Time) error {
	p := s.protected
	if p == nil || p.namespace == "" {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.read {
		var list corev1.ConfigMapList
		if err := s.cache.List(ctx, &list, client.InNamespace(p.namespace), client.HasLabels{wellknown.ProtectedNodesLabel}); err != nil {
			return fmt.Errorf("health: read the protected set: %w", err)
		}
		for _, cm := range list.Items {
			if unit, ok := cutPrefix(cm.Name, wellknown.ProtectedNodesPrefix); ok {
				p.written[unit] = maps.Clone(cm.Data)
			}
		}
		p.read = true
	}
	var errs []error
	for unit, members := range byUnit {
		data := protectedData(members, now)
		old, had := p.written[unit]
		if maps.Equal(old, data) && (had || len(data) == 0) {
			continue
		}
		cm := corev1ac.ConfigMap(ProtectedConfigMap(unit), p.namespace).
			WithLabels(map[string]string{wellknown.ProtectedNodesLabel: "true", "app.kubernetes.io/managed-by": wellknown.FieldManager}).
			WithData(data)
		if err := s.patch.client.Apply(ctx, cm, client.FieldOwner(wellknown.FieldManager), client.ForceOwnership); err != nil {
			errs = append(errs, fmt.Errorf("health: protected set of unit %s: %w", unit, err))
			continue
		}
		p.written[unit] = data
		s.metrics.patches.WithLabelValues("configmap", "ok").Inc()
		s.wrote(Write{Kind: "configmap", Namespace: p.namespace, Name: ProtectedConfigMap(unit), Time: s.now()})
	}
	return errors.Join(errs...)
}

func cutPrefix(s, prefix string) (string, bool) {
	if len(s) > len(prefix) && s[:len(prefix)] == prefix {
		return s[len(prefix):], true
	}
	return "", false
}
