package chaos

import (
	"slices"
	"sync"
	"time"
)

// episode is a fault as it happened: from when it took effect until it
// was undone (end zero: still in force).
type episode struct {
	f          Fault
	begin, end time.Time
	failed     string
}

// truth is what the journal says happened.
type truth struct {
	mu       sync.Mutex
	start    time.Time
	done     time.Time
	episodes []*episode
}

func (t *truth) add(entries []Entry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range entries {
		switch e.Phase {
		case PhaseStart:
			t.start = e.T
		case PhaseDone:
			t.done = e.T
		case PhaseBegin:
			t.episodes = append(t.episodes, &episode{f: e.Fault, begin: e.T})
		case PhaseEnd, PhaseFailed:
			i := slices.IndexFunc(t.episodes, func(ep *episode) bool { return ep.f.ID == e.Fault.ID })
			if i < 0 { // failed before it took effect
				t.episodes = append(t.episodes, &episode{f: e.Fault, begin: e.T, end: e.T, failed: e.Detail})
				continue
			}
			t.episodes[i].end = e.T
			if e.Phase == PhaseFailed {
				t.episodes[i].failed = e.Detail
			}
		}
	}
}

// played are the faults as they happened.
func (t *truth) played() []Played {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Played, 0, len(t.episodes))
	for _, ep := range t.episodes {
		out = append(out, Played{Fault: ep.f, Begin: ep.begin, End: ep.end, Failed: ep.failed})
	}
	return out
}

// started and finished tell where the schedule is.
func (t *truth) started() (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.start, !t.start.IsZero()
}

func (t *truth) finished() (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.done, !t.done.IsZero()
}

// overlapping are the episodes in force at some time in [from, to]
// that match.
func (t *truth) overlapping(from, to time.Time, match func(Fault) bool) []Fault {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Fault
	for _, ep := range t.episodes {
		end := ep.end
		if end.IsZero() {
			end = to
		}
		if !ep.begin.After(to) && !end.Before(from) && (match == nil || match(ep.f)) {
			out = append(out, ep.f)
		}
	}
	return out
}

// active are the faults in force at at.
func (t *truth) active(at time.Time) []Fault { return t.overlapping(at, at, nil) }

// died tells whether node was powered off by a NodeDies at some time in
// [from, to]: the one fault that lets Kubernetes evict its pods.
func (t *truth) died(node string, from, to time.Time) bool {
	return len(t.overlapping(from, to, func(f Fault) bool { return f.Kind == NodeDies && f.Node == node })) > 0
}

// moved tells whether node was relabelled into another unit at some time
// in [from, to].
func (t *truth) moved(node string, from, to time.Time) bool {
	return len(t.overlapping(from, to, func(f Fault) bool { return f.Kind == Relabel && f.Node == node })) > 0
}

// unitCut tells whether unit was cut from the cloud (and not rebooted)
// during the whole of [from, to].
func (t *truth) unitCut(unit string, from, to time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, ep := range t.episodes {
		if ep.f.Kind == UnitCut && ep.f.Unit == unit && ep.failed == "" &&
			!ep.begin.After(from) && (ep.end.IsZero() || ep.end.After(to)) {
			return true
		}
	}
	return false
}

// quiet tells whether nothing happened in [at-QuietAfter, at]: the
// schedule started, no fault in force and none ended in that time.
func (t *truth) quiet(at time.Time) bool {
	start, ok := t.started()
	if !ok || at.Before(start.Add(QuietAfter)) {
		return false
	}
	return len(t.overlapping(at.Add(-QuietAfter), at, nil)) == 0
}

// QuietAfter is how long after the last fault ended the installation
// must write nothing.
const QuietAfter = 2 * time.Minute
