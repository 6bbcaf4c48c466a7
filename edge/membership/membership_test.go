package membership

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/poll"
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

// TestSaveKeepsWhatTheDiskRefused: state the disk refuses (here the
// state directory is a file; a full disk on real nodes) is written on the
// next retry once the disk takes it, the newest of each file.
func TestSaveKeepsWhatTheDiskRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	m := &Membership{cfg: Config{StateDir: dir}, log: slog.New(slog.DiscardHandler)}
	m.save("assignment.pb", &atollv1.NodeAssignment{Node: "a", Unit: "u1"})
	m.save("assignment.pb", &atollv1.NodeAssignment{Node: "a", Unit: "u2"})
	if len(m.unsaved) != 1 {
		t.Fatalf("kept %d files, want 1", len(m.unsaved))
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); m.keepSaving(ctx) }()
	defer func() { cancel(); <-done }()
	var a atollv1.NodeAssignment
	poll.Eventually(t, 3*saveRetry, func() error {
		if err := readProto(filepath.Join(dir, "assignment.pb"), &a); err != nil {
			return err
		}
		if a.GetUnit() != "u2" {
			return fmt.Errorf("kept unit %q, want u2", a.GetUnit())
		}
		return nil
	})
	m.saveMu.Lock()
	defer m.saveMu.Unlock()
	if len(m.unsaved) != 0 {
		t.Errorf("still unsaved: %v", m.unsaved)
	}
}
