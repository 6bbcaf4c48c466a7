package grid

import (
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
)

func TestPlanRollout(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	old, fresh := now.Add(-time.Hour), now.Add(-10*time.Second)
	// u builds a unit: "new" (no child), "old" (previous revision),
	// "ready" (current, Ready), "updating" (current, not Ready since
	// 10 s), "late" (current, not Ready since an hour).
	u := func(name, state string) unitState {
		s := unitState{Unit: name, Desired: "v2"}
		switch state {
		case "old":
			s.Current, s.Ready, s.Since = "v1", true, old
		case "ready":
			s.Current, s.Ready, s.Since = "v2", true, fresh
		case "updating":
			s.Current, s.Since = "v2", fresh
		case "late":
			s.Current, s.Since = "v2", old
		case "relapsed": // rolled out an hour ago, not Ready now
			s.Current, s.Since, s.Done = "v2", old, true
		}
		return s
	}
	one := ptr.To[int32](1)
	tests := []struct {
		name    string
		units   []unitState
		rollout *appsv1alpha1.Rollout
		prev    *appsv1alpha1.RolloutStatus
		apply   []string
		stalled []string
		pending []string
		resumed bool
	}{
		{name: "new units at once", units: []unitState{u("a", "new"), u("b", "new")}, rollout: &appsv1alpha1.Rollout{MaxUnavailableUnits: one}, apply: []string{"a", "b"}},
		{name: "default: every unit at once", units: []unitState{u("a", "old"), u("b", "old"), u("c", "old")}, apply: []string{"a", "b", "c"}},
		{name: "one at a time", units: []unitState{u("c", "old"), u("a", "old"), u("b", "old")}, rollout: &appsv1alpha1.Rollout{MaxUnavailableUnits: one}, apply: []string{"a"}, pending: []string{"b", "c"}},
		{name: "wait for the updating unit", units: []unitState{u("a", "updating"), u("b", "old")}, rollout: &appsv1alpha1.Rollout{MaxUnavailableUnits: one}, pending: []string{"b"}},
		{name: "next after ready", units: []unitState{u("a", "ready"), u("b", "old"), u("c", "old")}, rollout: &appsv1alpha1.Rollout{MaxUnavailableUnits: one}, apply: []string{"b"}, pending: []string{"c"}},
		{name: "two at a time", units: []unitState{u("a", "updating"), u("b", "old"), u("c", "old")}, rollout: &appsv1alpha1.Rollout{MaxUnavailableUnits: ptr.To[int32](2)}, apply: []string{"b"}, pending: []string{"c"}},
		{name: "canaries first, one at a time", units: []unitState{u("a", "old"), u("b", "old"), u("z", "old"), u("y", "old")}, rollout: &appsv1alpha1.Rollout{CanaryUnits: []string{"z", "y"}}, apply: []string{"z"}, pending: []string{"y", "a", "b"}},
		{name: "second canary after the first is ready", units: []unitState{u("a", "old"), u("z", "ready"), u("y", "old")}, rollout: &appsv1alpha1.Rollout{CanaryUnits: []string{"z", "y"}}, apply: []string{"y"}, pending: []string{"a"}},
		{name: "the rest after the canaries", units: []unitState{u("a", "old"), u("b", "old"), u("z", "ready")}, rollout: &appsv1alpha1.Rollout{CanaryUnits: []string{"z"}}, apply: []string{"a", "b"}},
		{name: "a late unit stops the rollout", units: []unitState{u("a", "late"), u("b", "old")}, rollout: &appsv1alpha1.Rollout{MaxUnavailableUnits: ptr.To[int32](5)}, stalled: []string{"a"}, pending: []string{"b"}},
		{name: "the deadline is the grid's", units: []unitState{u("a", "updating"), u("b", "old")}, rollout: &appsv1alpha1.Rollout{MaxUnavailableUnits: ptr.To[int32](5), ProgressDeadlineSeconds: ptr.To[int32](5)}, stalled: []string{"a"}, pending: []string{"b"}},
		{name: "a unit done with its rollout and not Ready now neither stalls nor waits", units: []unitState{u("a", "relapsed"), u("b", "old")}, rollout: &appsv1alpha1.Rollout{MaxUnavailableUnits: one}, apply: []string{"b"}},
		{name: "new units even when stalled", units: []unitState{u("a", "late"), u("n", "new")}, apply: []string{"n"}, stalled: []string{"a"}},
		{name: "resume passes the stalled unit", units: []unitState{u("a", "late"), u("b", "old")}, rollout: &appsv1alpha1.Rollout{MaxUnavailableUnits: one, Resume: "r1"}, prev: &appsv1alpha1.RolloutStatus{Revision: "rev"}, apply: []string{"b"}, resumed: true},
		{name: "a resume is taken once", units: []unitState{u("a", "late"), u("b", "old")}, rollout: &appsv1alpha1.Rollout{MaxUnavailableUnits: one, Resume: "r1"}, prev: &appsv1alpha1.RolloutStatus{Revision: "rev", Resumed: "r1"}, stalled: []string{"a"}, pending: []string{"b"}},
		{name: "skipped units stay skipped", units: []unitState{u("a", "late"), u("b", "old")}, rollout: &appsv1alpha1.Rollout{MaxUnavailableUnits: one, Resume: "r1"}, prev: &appsv1alpha1.RolloutStatus{Revision: "rev", Resumed: "r1", Skipped: []string{"a"}}, apply: []string{"b"}},
		{name: "skips end with the revision", units: []unitState{u("a", "late"), u("b", "old")}, rollout: &appsv1alpha1.Rollout{MaxUnavailableUnits: one, Resume: "r1"}, prev: &appsv1alpha1.RolloutStatus{Revision: "older", Resumed: "r1", Skipped: []string{"a"}}, stalled: []string{"a"}, pending: []string{"b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := planRollout(tt.units, tt.rollout, tt.prev, "rev", now)
			if !slices.Equal(p.Apply, tt.apply) {
				t.Errorf("apply %v, want %v", p.Apply, tt.apply)
			}
			if !slices.Equal(p.Stalled, tt.stalled) {
				t.Errorf("stalled %v, want %v", p.Stalled, tt.stalled)
			}
			if !slices.Equal(p.Pending, tt.pending) {
				t.Errorf("pending %v, want %v", p.Pending, tt.pending)
			}
			if p.Resumed != tt.resumed {
				t.Errorf("resumed %v", p.Resumed)
			}
		})
	}
	// A unit updating for 10 s of a 600 s deadline: look again when it ends.
	p := planRollout([]unitState{u("a", "updating")}, nil, nil, "rev", now)
	if p.RequeueAfter != 590*time.Second {
		t.Errorf("requeue after %s, want 590s", p.RequeueAfter)
	}
}

// TestCompleted: a child is done with its rollout when its workload
// controller says so for its latest spec, whatever its pods do since.
func TestCompleted(t *testing.T) {
	dep := func(gen, observed int64, reason string) *appsv1.Deployment {
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Generation: gen}}
		d.Status.ObservedGeneration = observed
		d.Status.Conditions = []appsv1.DeploymentCondition{{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: reason}}
		return d
	}
	sts := func(gen, observed int64, current, update string, updated int32) *appsv1.StatefulSet {
		s := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Generation: gen}, Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](2)}}
		s.Status = appsv1.StatefulSetStatus{ObservedGeneration: observed, CurrentRevision: current, UpdateRevision: update, UpdatedReplicas: updated}
		return s
	}
	for _, tt := range []struct {
		name string
		done bool
		got  bool
	}{
		{"deployment rolled out", true, deploymentCompleted(dep(2, 2, "NewReplicaSetAvailable"))},
		{"deployment rolling", false, deploymentCompleted(dep(2, 2, "ReplicaSetUpdated"))},
		{"deployment's new spec not observed", false, deploymentCompleted(dep(3, 2, "NewReplicaSetAvailable"))},
		{"statefulset rolled out", true, statefulSetCompleted(sts(2, 2, "r2", "r2", 2))},
		{"statefulset rolling", false, statefulSetCompleted(sts(2, 2, "r1", "r2", 1))},
		{"statefulset's new spec not observed", false, statefulSetCompleted(sts(3, 2, "r2", "r2", 2))},
	} {
		if tt.got != tt.done {
			t.Errorf("%s: completed %v, want %v", tt.name, tt.got, tt.done)
		}
	}
}
