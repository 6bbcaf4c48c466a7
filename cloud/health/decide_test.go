package health

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/internal/protect"
	"github.com/atoll-edge/atoll/internal/wellknown"

	corev1 "k8s.io/api/core/v1"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

var (
	healthy   = atollv1.Verdict_VERDICT_HEALTHY
	unhealthy = atollv1.Verdict_VERDICT_UNHEALTHY
	none      = atollv1.Verdict_VERDICT_NONE
)

func TestProtect(t *testing.T) {
	T, F, U := corev1.ConditionTrue, corev1.ConditionFalse, corev1.ConditionUnknown
	const lost, kubelet = protect.ReasonNodeStatusUnknown, "KubeletNotReady"
	tests := []struct {
		name    string
		ready   corev1.ConditionStatus
		reason  string
		verdict atollv1.Verdict
		held    bool
		want    bool
	}{
		{"cloud ok", T, "KubeletReady", healthy, false, false},
		{"cloud ok, peers unhealthy", T, "KubeletReady", unhealthy, false, false},
		{"cloud lost, peers healthy", U, lost, healthy, false, true},
		{"cloud lost, peers unhealthy", U, lost, unhealthy, false, false},
		{"cloud lost, no verdict", U, lost, none, false, false},
		{"cloud lost, unit held", U, lost, none, true, true},
		{"kubelet says not ready", F, kubelet, healthy, true, false},
		{"not ready, whatever the reason", F, lost, healthy, true, false},
		{"kubelet says unknown", U, kubelet, healthy, true, false},
		{"never posted status", U, "NodeStatusNeverUpdated", healthy, true, false},
		{"unknown without a reason", U, "", healthy, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: tt.ready, Reason: tt.reason}}}}
			if got := Protect(n, Tally{Verdict: tt.verdict}, tt.held); got != tt.want {
				t.Fatalf("Protect = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDisruption(t *testing.T) {
	// A member: Ready (T) or lost by the controller (U); its agent's link
	// up, down (d) or down for SilentAfter (D), or its close unseen and
	// the agent unheard (h); its Lease renewed or stale (s).
	m := func(spec string) Member {
		return Member{
			Ready:      map[byte]corev1.ConditionStatus{'T': corev1.ConditionTrue, 'U': corev1.ConditionUnknown}[spec[0]],
			LinkDown:   strings.ContainsAny(spec, "dD"),
			Silent:     strings.Contains(spec, "D"),
			Unheard:    strings.Contains(spec, "h"),
			LeaseStale: strings.Contains(spec, "s"),
		}
	}
	unit := func(specs ...string) []Member {
		var out []Member
		for _, s := range specs {
			out = append(out, m(s))
		}
		return out
	}
	tests := []struct {
		name    string
		members []Member
		votes   bool
		want    UnitState
	}{
		{"all ready", unit("T", "T", "T"), true, Normal},
		{"empty unit", nil, false, Normal},
		{"one lost", unit("T", "U", "T"), true, PartialDisruption},
		{"all lost, silent", unit("U", "U", "U"), false, FullDisruption},
		{"all lost, peers still vote", unit("U", "U", "U"), true, PartialDisruption},
		{"most lost, silent", unit("U", "U", "T"), false, PartialDisruption},
		// No agents: nobody votes, no link is reported closed.
		{"one lost, no agents", unit("U", "T", "T"), false, PartialDisruption},
		{"all ready, no agents", unit("T", "T", "T"), false, Normal},
		// The site cut off: links closed, Leases stale: held before the
		// controller loses every node.
		{"site cut, none lost yet", unit("Tds", "Tds", "Tds"), false, FullDisruption},
		{"site cut, one lost", unit("Uds", "Tds", "Tds"), false, FullDisruption},
		{"one link still up", unit("Uds", "Tds", "T"), false, PartialDisruption},
		{"links closed, a fresh vote still counts", unit("Uds", "Tds", "Tds"), true, PartialDisruption},
		{"one link closed, all ready", unit("T", "Td", "T"), true, Normal},
		{"site cut, links down for long", unit("TDs", "TDs", "TDs"), false, FullDisruption},
		// Every agent cut from the hub, kubelets reporting: not held.
		{"agents silent, kubelets report", unit("TD", "TD", "TD"), false, AgentsSilent},
		{"agents silent, one kubelet dead", unit("UDs", "TD", "TD"), false, AgentsSilent},
		{"agents silent, one Lease late", unit("TDs", "TD", "TD"), false, AgentsSilent},
		{"agents cut, not for long yet", unit("Td", "Td", "Td"), false, Normal},
		// A unit forming: its agents' links bounce before their first
		// ballot, their kubelets report.
		{"forming", unit("Td", "Td"), false, Normal},
		{"a stale Lease alone is not lost", unit("Ts", "Ts"), false, Normal},
		// The site cut off while no replica ran: no close reported, its
		// agents unheard.
		{"site cut unseen, none lost yet", unit("Ths", "Ths", "Ths"), false, FullDisruption},
		{"site cut unseen, one lost", unit("Uhs", "Ths", "Tds"), false, FullDisruption},
		{"agents unheard, kubelets report", unit("Uhs", "Th", "Th"), false, PartialDisruption},
		{"agents unheard, all ready", unit("Th", "Th"), false, Normal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Disruption(tt.members, tt.votes); got != tt.want {
				t.Fatalf("Disruption = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestTracker(t *testing.T) {
	now := time.Unix(10_000, 0)
	ttl := 30 * time.Second
	tr := NewTracker(ttl)
	tally := func(node string, at time.Time) Tally { return tr.Tally(node, at, 4, nil) } // x, a, b, c
	tr.ObserveBallot(ballot("a", now, ttl, map[string]atollv1.Verdict{"x": healthy}), now)
	tr.ObserveBallot(ballot("b", now, ttl, map[string]atollv1.Verdict{"x": healthy}), now)
	tr.ObserveBallot(ballot("c", now, ttl, map[string]atollv1.Verdict{"x": unhealthy}), now)
	if j := tally("x", now); j.Verdict != healthy || j.Healthy != 2 || j.Unhealthy != 1 || j.Votes() != 3 || j.Members != 4 {
		t.Fatalf("tally = %+v", j)
	}
	// An older ballot of the same voter does not replace a newer one.
	if got := tr.ObserveBallot(ballot("a", now.Add(-time.Second), ttl, map[string]atollv1.Verdict{"x": unhealthy}), now); got != nil {
		t.Fatalf("older ballot recorded: touched %v", got)
	}
	// Votes expire by the hub's clock plus their ballot's TTL.
	if j := tally("x", now.Add(31*time.Second)); j.Verdict != none || j.Votes() != 0 {
		t.Fatalf("expired votes still count: %+v", j)
	}
	// Split voters decide nothing.
	at := now.Add(time.Second)
	tr.ObserveBallot(ballot("a", at, time.Minute, map[string]atollv1.Verdict{"x": healthy, "y": healthy}), at)
	tr.ObserveBallot(ballot("b", at, time.Minute, map[string]atollv1.Verdict{"x": healthy, "y": unhealthy}), at)
	if j := tally("y", at); j.Verdict != none {
		t.Fatalf("split voters: %+v", j)
	}
	// A voter that changes its mind replaces its vote.
	at = at.Add(time.Second)
	tr.ObserveBallot(ballot("b", at, time.Minute, map[string]atollv1.Verdict{"x": healthy, "y": healthy}), at)
	if j := tally("y", at); j.Verdict != healthy || j.Normal != 2 {
		t.Fatalf("after a new vote: %+v", j)
	}
	// No vote at all.
	if j := tally("z", now); j.Verdict != none || !j.LastVote.IsZero() {
		t.Fatalf("no votes: %+v", j)
	}
	// A node's vote about itself never counts.
	at = at.Add(time.Second)
	tr.ObserveBallot(ballot("w", at, time.Minute, map[string]atollv1.Verdict{"w": healthy}), at)
	tr.ObserveBallot(ballot("a", at, time.Minute, map[string]atollv1.Verdict{"x": healthy, "y": healthy, "w": healthy}), at)
	if j := tr.Tally("w", at, 3, nil); j.Verdict != none || j.Votes() != 1 {
		t.Fatalf("own vote counted: %+v", j)
	}
}

// TestTrackerRule: the cloud's verdict about n1 in units of one to seven
// members, from the ballots of the others — healthy (H), unhealthy (U),
// undecided (N), expired (E), dated in the future (F: rejected before the
// tracker, so never recorded) or missing (-) — while n1 always votes
// itself healthy, which never counts.
func TestTrackerRule(t *testing.T) {
	tests := []struct {
		others string
		want   atollv1.Verdict
	}{
		{"", none},
		{"H", healthy},
		{"U", unhealthy},
		{"E", none},
		{"F", none},
		{"-", none},
		{"N", none},
		{"HH", healthy},
		{"HE", none},
		{"HF", none},
		{"UU", unhealthy},
		{"HU", none},
		{"HN", none},
		{"HH-", healthy},
		{"HEF", none},
		{"HUU", unhealthy},
		{"HNN", none},
		{"HHHE", healthy},
		{"HHEF", none},
		{"HHUU", none},
		{"UUU-", unhealthy},
		{"HHH--", healthy},
		{"HHEEF", none},
		{"HHHN-", healthy},
		{"HHHH--", healthy},
		{"HHHEEF", none},
		{"HHHUUU", none},
		{"UUUUH-", unhealthy},
	}
	now := time.Unix(10_000, 0)
	s := &Service{cfg: DefaultConfig()}
	for _, tt := range tests {
		members := len(tt.others) + 1
		t.Run(fmt.Sprintf("%d members %s", members, tt.others), func(t *testing.T) {
			tr := NewTracker(30 * time.Second)
			observe := func(b *atollv1.Ballot, published time.Time) {
				if err := s.validBallot(b, published); err == nil {
					tr.ObserveBallot(b, published)
				}
			}
			ttl := 15 * time.Second
			n1 := func(v atollv1.Verdict) map[string]atollv1.Verdict { return map[string]atollv1.Verdict{"n1": v} }
			observe(ballot("n1", now, ttl, n1(healthy)), now) // its own: never counts
			for i, state := range tt.others {
				voter := fmt.Sprintf("n%d", i+2)
				switch state {
				case 'H':
					observe(ballot(voter, now, ttl, n1(healthy)), now)
				case 'U':
					observe(ballot(voter, now, ttl, n1(unhealthy)), now)
				case 'N':
					observe(ballot(voter, now, ttl, n1(none)), now)
				case 'E':
					observe(ballot(voter, now.Add(-time.Minute), ttl, n1(healthy)), now.Add(-time.Minute))
				case 'F':
					observe(ballot(voter, now.Add(time.Hour), ttl, n1(healthy)), now)
				}
			}
			if j := tr.Tally("n1", now, members, nil); j.Verdict != tt.want {
				t.Fatalf("verdict on n1 = %v (%+v), want %v", j.Verdict, j, tt.want)
			}
		})
	}
	if err := s.validBallot(ballot("n2", now.Add(time.Hour), 15*time.Second, nil), now); !errors.Is(err, ErrBallotRejected) {
		t.Fatalf("a ballot dated in the future: %v, want rejected", err)
	}
}

// TestTrackerForgets: 10,000 nodes join a unit, vote and are voted on,
// and leave (Forget, as the reconciler does when their Node is deleted);
// then votes about nodes that never had a Node expire and are pruned. The
// tracker returns to its size before them.
func TestTrackerForgets(t *testing.T) {
	now := time.Unix(10_000, 0)
	tr := NewTracker(30 * time.Second)
	base := []string{"a", "b", "c"}
	// others is a voter's ballot on the base members but itself, and on
	// extra.
	others := func(voter string, extra ...string) map[string]atollv1.Verdict {
		m := map[string]atollv1.Verdict{}
		for _, n := range append(base, extra...) {
			if n != voter {
				m[n] = healthy
			}
		}
		return m
	}
	for _, voter := range base {
		tr.ObserveBallot(ballot(voter, now, time.Minute, others(voter)), now)
	}
	n0, v0 := tr.Size()
	if n0 != 3 || v0 != 6 {
		t.Fatalf("baseline: %d nodes, %d votes", n0, v0)
	}
	for i := range 10000 {
		x := fmt.Sprintf("x%d", i)
		at := now.Add(time.Duration(i+1) * time.Millisecond)
		for _, other := range base {
			tr.ObserveBallot(ballot(other, at, time.Minute, others(other, x)), at)
		}
		tr.ObserveBallot(ballot(x, at, time.Minute, others(x)), at)
		tr.Forget(x)
	}
	if n, v := tr.Size(); n != n0 || v != v0 {
		t.Fatalf("after 10000 join/leave cycles: %d nodes, %d votes; want %d, %d", n, v, n0, v0)
	}
	// Votes about nodes nobody forgets (no Node was ever deleted: they
	// never had one) expire and go at the next prune; live ones stay.
	ghosts := map[string]atollv1.Verdict{}
	for i := range 10000 {
		ghosts[fmt.Sprintf("ghost%d", i)] = healthy
	}
	tr.ObserveBallot(ballot("g", now, 10*time.Second, ghosts), now)
	if dropped := tr.Prune(now.Add(11 * time.Second)); dropped != 10000 {
		t.Fatalf("pruned %d votes, want the 10000 expired", dropped)
	}
	if n, v := tr.Size(); n != n0 || v != v0 {
		t.Fatalf("after pruning: %d nodes, %d votes; want %d, %d", n, v, n0, v0)
	}
}

func TestAnnotations(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	j := Tally{Verdict: healthy, Healthy: 3, Normal: 3, Checkers: 3, Since: t0.Add(-time.Hour)}
	a := Annotations(j, time.Time{}, nil, t0)
	if a[wellknown.AnnotationVerdict] != "healthy" || a[wellknown.AnnotationVerdictSince] != "2026-11-22T10:00:00Z" {
		t.Fatalf("annotations = %v", a)
	}
	// Neither the vote counts (they change with every report) nor the
	// unit's disruption state (it would rewrite every node of the unit
	// when one is lost) are written.
	if len(a) != 2 {
		t.Fatalf("annotations = %v, want the verdict and its since only", a)
	}
	if _, ok := a[wellknown.AnnotationHoldUntil]; ok {
		t.Fatal("hold annotation without a hold")
	}
	// Steady state: counts, voters' since and time move, nothing else:
	// the same annotations, so no write.
	j2 := Tally{Verdict: healthy, Healthy: 2, Undecided: 1, Normal: 2, Abnormal: 1, Checkers: 3, Since: t0.Add(time.Minute)}
	if b := Annotations(j2, time.Time{}, a, t0.Add(5*time.Minute)); !maps.Equal(a, b) {
		t.Fatalf("steady annotations changed: %v → %v", a, b)
	}
	// A new verdict takes the cloud's time of the change.
	c := Annotations(Tally{Verdict: unhealthy, Unhealthy: 2}, time.Time{}, a, t0.Add(6*time.Minute))
	if c[wellknown.AnnotationVerdict] != "unhealthy" || c[wellknown.AnnotationVerdictSince] != "2026-11-22T10:06:00Z" {
		t.Fatalf("changed verdict: %v", c)
	}
	// No verdict has no since.
	if d := Annotations(Tally{}, time.Time{}, c, t0); d[wellknown.AnnotationVerdictSince] != "" {
		t.Fatalf("since without a verdict: %v", d)
	}
}
