package membership

import (
	"context"
	"strings"
	"testing"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// TestReady: an agent is ready once it holds its assignment and, when it is
// in a unit, that unit's view; a view of another unit does not count.
func TestReady(t *testing.T) {
	tests := []struct {
		name       string
		assignment *atollv1.NodeAssignment
		view       *atollv1.UnitView
		want       string // substring of the error; empty: ready
	}{
		{name: "nothing yet", want: "no assignment"},
		{name: "assigned, no view", assignment: &atollv1.NodeAssignment{Node: "a", Unit: "u1"}, want: `no view of unit "u1"`},
		{name: "view of the old unit", assignment: &atollv1.NodeAssignment{Node: "a", Unit: "u2"},
			view: &atollv1.UnitView{Unit: "u1"}, want: `no view of unit "u2"`},
		{name: "assigned with view", assignment: &atollv1.NodeAssignment{Node: "a", Unit: "u1"}, view: &atollv1.UnitView{Unit: "u1"}},
		{name: "in no unit", assignment: &atollv1.NodeAssignment{Node: "a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &Membership{assignment: tt.assignment, unitView: tt.view}
			err := m.Ready(context.Background())
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("not ready: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Ready() = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
