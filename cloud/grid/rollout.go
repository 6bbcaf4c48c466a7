package grid

import (
	"slices"
	"time"

	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
)

// DefaultProgressDeadline is a unit's progress deadline when the grid
// sets none (the CRD defaults it too).
const DefaultProgressDeadline = 600 * time.Second

// unitState is what the rollout plan knows of one unit.
type unitState struct {
	Unit string
	// Desired is the revision the unit's child should have; Current the
	// one it has ("" when it has no child).
	Desired, Current string
	// Ready: the child is Ready at its current revision.
	Ready bool
	// Done: the child finished rolling out its current revision (its
	// workload controller says so), even if it is not Ready now (a pod
	// restarting): its progress deadline is behind it.
	Done bool
	// Since is when the child got its current revision.
	Since time.Time
}

// plan is what one reconcile does to move a rollout on.
type plan struct {
	// Apply lists the units whose child is applied now (created or moved
	// to its desired revision), in order.
	Apply []string
	// Updating lists the units at the desired revision not yet Ready;
	// Stalled those of them past their progress deadline (and not
	// skipped by a resume); Pending the units still waiting.
	Updating, Stalled, Pending []string
	// Status is the rollout's new status.
	Status appsv1alpha1.RolloutStatus
	// Resumed: a new spec.rollout.resume value was taken this time.
	Resumed bool
	// RequeueAfter is when the earliest updating unit reaches its
	// deadline (0: none).
	RequeueAfter time.Duration
}

// planRollout decides which units change now. Units without a child get
// one at once (there is nothing to keep available). Units whose child has
// another revision change in order — the canary units first, one at a
// time and each Ready before the next, then the others by name — with at
// most maxUnavailableUnits (default: all) updating at once. A unit that
// stays not Ready past its progress deadline stops the rollout until a
// resume, which lets the rollout pass the units stalled then. A unit whose
// child finished rolling out its revision is done with it: going not Ready
// later (a pod restarting) neither stalls nor holds the rollout.
func planRollout(units []unitState, r *appsv1alpha1.Rollout, prev *appsv1alpha1.RolloutStatus, revision string, now time.Time) plan {
	if r == nil {
		r = &appsv1alpha1.Rollout{}
	}
	deadline := DefaultProgressDeadline
	if r.ProgressDeadlineSeconds != nil {
		deadline = time.Duration(*r.ProgressDeadlineSeconds) * time.Second
	}
	var skipped []string
	resumed := ""
	if prev != nil {
		resumed = prev.Resumed
		if prev.Revision == revision {
			skipped = slices.Clone(prev.Skipped)
		}
	}
	ordered := orderUnits(units, r.CanaryUnits)
	p := plan{}
	var updated []string
	for _, u := range ordered {
		switch u.Current {
		case "":
			p.Apply = append(p.Apply, u.Unit)
		case u.Desired:
			updated = append(updated, u.Unit)
			if u.Ready || u.Done || slices.Contains(skipped, u.Unit) {
				continue
			}
			p.Updating = append(p.Updating, u.Unit)
			if left := u.Since.Add(deadline).Sub(now); left <= 0 {
				p.Stalled = append(p.Stalled, u.Unit)
			} else if p.RequeueAfter == 0 || left < p.RequeueAfter {
				p.RequeueAfter = left
			}
		default:
			p.Pending = append(p.Pending, u.Unit)
		}
	}
	if r.Resume != "" && r.Resume != resumed {
		// Resume: the units stalled now count as done for this revision.
		p.Resumed = true
		resumed = r.Resume
		for _, u := range p.Stalled {
			skipped = append(skipped, u)
			p.Updating = slices.DeleteFunc(p.Updating, func(x string) bool { return x == u })
		}
		p.Stalled = nil
	}
	budget := len(units)
	if r.MaxUnavailableUnits != nil {
		budget = int(*r.MaxUnavailableUnits)
	}
	budget -= len(p.Updating)
	canary := func(u string) bool { return slices.Contains(r.CanaryUnits, u) }
	canaryBusy := slices.ContainsFunc(p.Updating, canary)
	var started []string
	if len(p.Stalled) == 0 {
		for _, u := range p.Pending {
			if budget <= 0 || canaryBusy {
				break
			}
			if !canary(u) && slices.ContainsFunc(p.Pending, func(x string) bool { return canary(x) && !slices.Contains(started, x) }) {
				break // canaries first
			}
			started = append(started, u)
			budget--
			if canary(u) {
				canaryBusy = true // one canary at a time
			}
		}
	}
	p.Apply = append(p.Apply, started...)
	p.Pending = slices.DeleteFunc(p.Pending, func(u string) bool { return slices.Contains(started, u) })
	slices.Sort(skipped)
	p.Status = appsv1alpha1.RolloutStatus{
		Revision: revision,
		Updated:  sortedOrNil(updated),
		Pending:  nilIfEmpty(p.Pending),
		Stalled:  sortedOrNil(p.Stalled),
		Skipped:  nilIfEmpty(slices.Compact(skipped)),
		Resumed:  resumed,
	}
	return p
}

// orderUnits puts the canary units first, in their order, then the
// others by name.
func orderUnits(units []unitState, canaries []string) []unitState {
	out := slices.Clone(units)
	rank := func(u string) int {
		if i := slices.Index(canaries, u); i >= 0 {
			return i
		}
		return len(canaries)
	}
	slices.SortStableFunc(out, func(a, b unitState) int {
		if ra, rb := rank(a.Unit), rank(b.Unit); ra != rb {
			return ra - rb
		}
		switch {
		case a.Unit < b.Unit:
			return -1
		case a.Unit > b.Unit:
			return 1
		}
		return 0
	})
	return out
}

func sortedOrNil(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}
