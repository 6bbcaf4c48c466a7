package members

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// pass runs one recompute: the full publish when one is due, otherwise
// only what the dirty nodes touch. The cost of an event (a Node change, a
// topology report) is then its unit's size, not the cluster's: the dirty
// node's assignment, the views of the unit it left and the unit it is in,
// and those units' members' assignments (their route secret may rotate),
// where put skips, without a round trip, what did not change.
func (s *Service) pass(ctx context.Context) error {
	s.mu.Lock()
	full := s.full || s.unitMembers == nil
	dirty := s.dirty
	s.dirty = map[string]bool{}
	s.full = false
	s.mu.Unlock()
	if full {
		err := s.publish(ctx)
		if err != nil {
			s.mu.Lock()
			s.full = true // the next pass tries everything again
			s.mu.Unlock()
		}
		return err
	}
	if len(dirty) == 0 {
		return nil
	}
	s.metrics.incremental.Inc()
	return s.publishNodes(ctx, dirty)
}

// expireNodes drops the declared nodes that stopped reporting NodeTTL ago
// and marks them dirty.
func (s *Service) expireNodes(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, n := range s.nodes {
		if now.Sub(n.seen) > s.cfg.NodeTTL {
			s.log.Info("node stopped reporting; dropping it", "node", name, "unit", n.report.GetUnit(), "last_seen", n.seen)
			delete(s.nodes, name)
			s.dirty[name] = true
		}
	}
}

// memberOf returns what the membership source says of node name: ok is
// false when it is no member (no such Node, or excluded); isNode whether
// a Kubernetes Node of that name exists (always false with the declared
// source). Callers hold mu.
func (s *Service) memberOf(name string) (m member, ok, isNode bool) {
	if s.cfg.Source == SourceDeclared {
		n, found := s.nodes[name]
		if !found {
			return member{}, false, false
		}
		return s.checked(name, member{unit: n.report.GetUnit(), ip: internalIP(n.report), labels: n.report.GetLabels(), routeURL: n.report.GetRouteUrl(), key: s.nodeKey(name)}), true, false
	}
	n, err := s.kube.Get(name)
	if err != nil {
		if !apierrors.IsNotFound(err) {
			s.log.Error("cannot read node", "node", name, "err", err)
		}
		return member{}, false, false
	}
	if s.excluded(n) {
		return member{}, false, true
	}
	return s.checked(name, s.kubeMember(n)), true, true
}

// kubeMember is the member a Kubernetes Node makes. Callers hold mu.
func (s *Service) kubeMember(n *corev1.Node) member {
	unit, err := s.cfg.Units.Check(n.Labels)
	if err != nil {
		s.log.Warn("node in no unit", "node", n.Name, "err", err)
	}
	m := member{unit: unit, labels: n.Labels}
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			m.ip = a.Address
			break
		}
	}
	if r, ok := s.nodes[n.Name]; ok {
		m.routeURL = r.report.GetRouteUrl()
	}
	m.key = s.nodeKey(n.Name)
	return m
}

// publishNodes recomputes the assignments of the dirty nodes and the
// views of the units they left or joined, with those units' assignments.
func (s *Service) publishNodes(ctx context.Context, dirty map[string]bool) error {
	now := time.Now()
	units := map[string]bool{}
	assign := map[string]bool{} // nodes whose assignment to publish
	var deleted, back []string
	s.mu.Lock()
	for name := range dirty {
		old, had := s.assigned[name]
		m, ok, isNode := s.memberOf(name)
		if had && old != "" {
			units[old] = true
			delete(s.unitMembers[old], name)
		}
		_, reports := s.nodes[name]
		switch {
		case ok:
			s.assigned[name] = m.unit
			assign[name] = true
			if m.unit != "" {
				units[m.unit] = true
				if s.unitMembers[m.unit] == nil {
					s.unitMembers[m.unit] = map[string]bool{}
				}
				s.unitMembers[m.unit][name] = true
			}
		case reports:
			// An agent that reports but is not a Node is told it is in
			// no unit.
			s.assigned[name] = ""
			assign[name] = true
		default:
			delete(s.assigned, name)
			for _, field := range []string{"route_url", "internal_ip", "node_key"} {
				delete(s.rejected, name+"/"+field)
			}
		}
		if s.gate != nil && s.kubeNodes != nil && s.cfg.Source == SourceKubernetes {
			switch was := s.kubeNodes[name]; {
			case was && !isNode:
				deleted = append(deleted, name)
				delete(s.kubeNodes, name)
			case !was && isNode:
				back = append(back, name)
				s.kubeNodes[name] = true
			}
		}
	}
	members := make(map[string][]*atollv1.UnitMember, len(units))
	names := make(map[string][]string, len(units))
	for unit := range units {
		for name := range s.unitMembers[unit] {
			m, ok, _ := s.memberOf(name)
			if !ok || m.unit != unit {
				continue // changed since: it is dirty again
			}
			names[unit] = append(names[unit], name)
			members[unit] = append(members[unit], &atollv1.UnitMember{Name: name, InternalIp: m.ip, Labels: m.labels, RouteUrl: m.routeURL, NodeKey: m.key})
			assign[name] = true
		}
		slices.Sort(names[unit])
		if len(s.unitMembers[unit]) == 0 {
			delete(s.unitMembers, unit)
		}
	}
	unitOf := make(map[string]string, len(assign))
	for name := range assign {
		unitOf[name] = s.assigned[name]
	}
	s.metrics.nodes.Set(float64(len(s.assigned)))
	s.metrics.units.Set(float64(len(s.unitMembers)))
	s.mu.Unlock()

	for _, name := range deleted {
		s.log.Info("node deleted; closing its hub link and refusing it until the node is back", "node", name)
		s.gate.Suspend(name)
	}
	for _, name := range back {
		s.gate.Resume(name)
	}
	errs := []error{s.publishUnitEvents(ctx, units, names, false)}
	fail := s.failer(ctx, &errs)
	for _, unit := range slices.Sorted(maps.Keys(units)) {
		if err := s.publishUnit(ctx, unit, members[unit], now, fail); err != nil {
			errs = append(errs, err)
		}
	}
	secrets := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(unitOf)) {
		unit := unitOf[name]
		s.publishAssignment(ctx, name, unit, names[unit], secrets, now, fail)
	}
	return errors.Join(errs...)
}
