package chaos

import (
	"fmt"
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

// truth is what the journal says happened, and the stalls of the
// kube-apiserver no fault of the schedule made.
type truth struct {
	mu       sync.Mutex
	start    time.Time
	done     time.Time
	episodes []*episode
	stalls   []*Stall
}

// Stall is a time the kube-apiserver answered kubelets with server
// errors (500 and up; their Lease renewals and status reports) with no
// kube-apiserver restart of the schedule in force: on a machine whose
// cores are all busy it stalls now and then, and the node lifecycle
// controller then loses nodes nobody cut. Such a time is a fault of its
// own: what the installation writes then and after follows real
// transitions.
type Stall struct {
	From   time.Time `json:"from"`
	To     time.Time `json:"to"`
	Errors int       `json:"errors"`
}

// Stall timing: server errors less than StallGap apart are one stall,
// and it counts from StallErrors errors on.
const (
	StallGap    = 10 * time.Second
	StallErrors = 3
)

// serverError records a server error the kube-apiserver answered a
// kubelet with at at, unless a restart of it was in force within the
// minute before.
func (t *truth) serverError(at time.Time) {
	if len(t.overlapping(at.Add(-time.Minute), at, func(f Fault) bool { return f.Kind == APIServerRestart })) > 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if n := len(t.stalls); n > 0 && at.Sub(t.stalls[n-1].To) <= StallGap {
		st := t.stalls[n-1]
		if at.After(st.To) {
			st.To = at
		}
		if at.Before(st.From) {
			st.From = at
		}
		st.Errors++
		return
	}
	t.stalls = append(t.stalls, &Stall{From: at, To: at, Errors: 1})
}

// stalled are the stalls (of StallErrors errors or more) in force at
// some time in [from, to].
func (t *truth) stalled(from, to time.Time) []Stall {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Stall
	for _, st := range t.stalls {
		if st.Errors >= StallErrors && !st.From.After(to) && !st.To.Before(from) {
			out = append(out, *st)
		}
	}
	return out
}

// controlPlaneBack is when the control plane was last back within
// [from, to]: the latest end of a kube-apiserver or KCM restart, or of a
// stall, in force in that time, or from when there was none.
func (t *truth) controlPlaneBack(from, to time.Time) time.Time {
	back := from
	for _, st := range t.stalled(from, to) {
		back = later(back, st.To)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, ep := range t.episodes {
		if ep.f.Kind != APIServerRestart && ep.f.Kind != KCMRestart || ep.begin.After(to) {
			continue
		}
		if ep.end.IsZero() {
			back = later(back, to)
		} else if !ep.end.Before(from) {
			back = later(back, ep.end)
		}
	}
	return back
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (s Stall) String() string {
	return fmt.Sprintf("kube-apiserver stall (no fault of the schedule) %s–%s, %d server errors to kubelets",
		s.From.Format("15:04:05"), s.To.Format("15:04:05"), s.Errors)
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
// schedule started, no fault (nor stall) in force and none ended in that
// time.
func (t *truth) quiet(at time.Time) bool {
	start, ok := t.started()
	if !ok || at.Before(start.Add(QuietAfter)) {
		return false
	}
	return len(t.overlapping(at.Add(-QuietAfter), at, nil)) == 0 && len(t.stalled(at.Add(-QuietAfter), at)) == 0
}

// QuietAfter is how long after the last fault ended the installation
// must write nothing.
const QuietAfter = 2 * time.Minute
