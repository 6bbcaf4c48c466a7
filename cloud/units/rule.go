// Package units is Atoll's unit model, the one place that says which
// unit a Node is in and which Nodes are members of each unit:
//
//   - Rule: a Node is in the unit its unit label names (default
//     atoll.io/unit), unless it carries an excluded label (control-plane,
//     master, atoll.io/cloud) or the value cannot name a unit;
//   - Index: the members of every unit, kept from a Node informer's
//     events, read in O(1) by the health service on every ballot;
//   - the NodeUnit controller: one apps.atoll.io NodeUnit per unit, with
//     its members and disruption state (nodeunits.go).
//
// Every cloud service that groups Nodes into units (health, the views,
// the status page, `atoll status`) reads them through this package.
package units

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/wellknown"
)

// Rule says which unit a Node is in.
type Rule struct {
	// Label is the Node label whose value names the node's unit.
	Label string
	// Exclude: Nodes carrying any of these labels are cloud nodes, in no
	// unit, probed by nobody and never protected.
	Exclude []string
}

// DefaultRule groups Nodes by atoll.io/unit and leaves the control plane
// and nodes labelled atoll.io/cloud out.
func DefaultRule() Rule {
	return Rule{
		Label:   wellknown.LabelUnit,
		Exclude: []string{"node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master", wellknown.LabelCloud},
	}
}

// Validate names the first bad field.
func (r Rule) Validate() error {
	if r.Label == "" {
		return errors.New("units: unit label is empty")
	}
	for _, l := range r.Exclude {
		if l == "" {
			return errors.New("units: an excluded label is empty")
		}
		if l == r.Label {
			return fmt.Errorf("units: the unit label %s is also excluded", l)
		}
	}
	return nil
}

// Of returns the unit of n, "" when it is in none (UnitOf).
func (r Rule) Of(n *corev1.Node) string {
	if n == nil {
		return ""
	}
	return r.UnitOf(n.Labels)
}

// UnitOf returns the unit of a Node with labels, "" when it is in none:
// it carries an excluded label, no unit label, or a value that cannot
// name a unit (Check says why).
func (r Rule) UnitOf(labels map[string]string) string {
	u, _ := r.Check(labels)
	return u
}

// Check is UnitOf, with the reason a unit label's value names no unit
// (nil when the Node has none, or is excluded).
func (r Rule) Check(labels map[string]string) (string, error) {
	if r.Excluded(labels) {
		return "", nil
	}
	u := labels[r.Label]
	if u == "" {
		return "", nil
	}
	if err := events.ValidUnit(u); err != nil {
		return "", fmt.Errorf("label %s=%q names no unit: %w", r.Label, u, err)
	}
	return u, nil
}

// Excluded reports whether a Node with labels carries an excluded label.
func (r Rule) Excluded(labels map[string]string) bool {
	for _, l := range r.Exclude {
		if _, ok := labels[l]; ok {
			return true
		}
	}
	return false
}
