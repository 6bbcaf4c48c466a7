package health

import (
	"maps"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/internal/wellknown"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
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
	tests := []struct {
		name    string
		ready   corev1.ConditionStatus
		verdict atollv1.Verdict
		held    bool
		want    bool
	}{
		{"cloud ok", T, healthy, false, false},
		{"cloud ok, peers unhealthy", T, unhealthy, false, false},
		{"cloud lost, peers healthy", U, healthy, false, true},
		{"cloud lost, peers unhealthy", U, unhealthy, false, false},
		{"cloud lost, no verdict", U, none, false, false},
		{"cloud lost, unit held", U, none, true, true},
		{"kubelet says not ready", F, healthy, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Protect(tt.ready, Judgement{Verdict: tt.verdict}, tt.held); got != tt.want {
				t.Fatalf("Protect = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestDisruption(t *testing.T) {
	T, U := corev1.ConditionTrue, corev1.ConditionUnknown
	tests := []struct {
		name  string
		ready []corev1.ConditionStatus
		votes bool
		want  UnitState
	}{
		{"all ready", []corev1.ConditionStatus{T, T, T}, true, Normal},
		{"empty unit", nil, false, Normal},
		{"one lost", []corev1.ConditionStatus{T, U, T}, true, PartialDisruption},
		{"all lost, silent", []corev1.ConditionStatus{U, U, U}, false, FullDisruption},
		{"all lost, peers still vote", []corev1.ConditionStatus{U, U, U}, true, PartialDisruption},
		{"most lost, silent", []corev1.ConditionStatus{U, U, T}, false, PartialDisruption},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Disruption(tt.ready, tt.votes); got != tt.want {
				t.Fatalf("Disruption = %v, want %v", got, tt.want)
			}
		})
	}
}

func vote(voter, node string, v atollv1.Verdict, at time.Time, ttl time.Duration) *atollv1.Vote {
	return &atollv1.Vote{Voter: voter, Node: node, Unit: "u1", Verdict: v, Normal: 2, Checkers: 2,
		Time: timestamppb.New(at), Since: timestamppb.New(at.Add(-time.Minute)), Ttl: durationpb.New(ttl)}
}

func TestTracker(t *testing.T) {
	now := time.Unix(10_000, 0)
	tr := NewTracker(30 * time.Second)
	tr.Observe(vote("a", "x", healthy, now, 30*time.Second), now)
	tr.Observe(vote("b", "x", healthy, now, 30*time.Second), now)
	tr.Observe(vote("c", "x", unhealthy, now, 30*time.Second), now)
	if j := tr.Judge("x", now); j.Verdict != healthy || j.Healthy != 2 || j.Unhealthy != 1 || j.Votes() != 3 {
		t.Fatalf("judge = %+v", j)
	}
	// An older vote of the same voter does not replace a newer one.
	if tr.Observe(vote("a", "x", unhealthy, now.Add(-time.Second), 30*time.Second), now) {
		t.Fatal("older vote recorded")
	}
	// Votes expire by the hub's clock plus their TTL.
	if j := tr.Judge("x", now.Add(31*time.Second)); j.Verdict != none || j.Votes() != 0 {
		t.Fatalf("expired votes still count: %+v", j)
	}
	// Split voters decide nothing.
	tr.Observe(vote("a", "y", healthy, now, time.Minute), now)
	tr.Observe(vote("b", "y", unhealthy, now, time.Minute), now)
	if j := tr.Judge("y", now); j.Verdict != none {
		t.Fatalf("split voters: %+v", j)
	}
	// A voter that changes its mind replaces its vote.
	tr.Observe(vote("b", "y", healthy, now.Add(time.Second), time.Minute), now.Add(time.Second))
	if j := tr.Judge("y", now.Add(time.Second)); j.Verdict != healthy || j.Normal != 2 {
		t.Fatalf("after a new vote: %+v", j)
	}
	// No vote at all.
	if j := tr.Judge("z", now); j.Verdict != none || !j.LastVote.IsZero() {
		t.Fatalf("no votes: %+v", j)
	}
}

func TestAnnotations(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	j := Judgement{Verdict: healthy, Healthy: 3, Normal: 3, Checkers: 3, Since: t0.Add(-time.Hour)}
	a := Annotations(j, PartialDisruption, time.Time{}, nil, t0)
	if a[wellknown.AnnotationVerdict] != "healthy" || a[wellknown.AnnotationVerdictSince] != "2026-11-22T10:00:00Z" ||
		a[wellknown.AnnotationDisruption] != "PartialDisruption" {
		t.Fatalf("annotations = %v", a)
	}
	if _, ok := a[wellknown.AnnotationVotes]; ok {
		t.Fatal("vote counts written: they change with every report")
	}
	if _, ok := a[wellknown.AnnotationHoldUntil]; ok {
		t.Fatal("hold annotation without a hold")
	}
	// Steady state: counts, voters' since and time move, nothing else:
	// the same annotations, so no write.
	j2 := Judgement{Verdict: healthy, Healthy: 2, Undecided: 1, Normal: 2, Abnormal: 1, Checkers: 3, Since: t0.Add(time.Minute)}
	if b := Annotations(j2, PartialDisruption, time.Time{}, a, t0.Add(5*time.Minute)); !maps.Equal(a, b) {
		t.Fatalf("steady annotations changed: %v → %v", a, b)
	}
	// A new verdict takes the cloud's time of the change.
	c := Annotations(Judgement{Verdict: unhealthy, Unhealthy: 2}, PartialDisruption, time.Time{}, a, t0.Add(6*time.Minute))
	if c[wellknown.AnnotationVerdict] != "unhealthy" || c[wellknown.AnnotationVerdictSince] != "2026-11-22T10:06:00Z" {
		t.Fatalf("changed verdict: %v", c)
	}
	// No verdict has no since.
	if d := Annotations(Judgement{}, Normal, time.Time{}, c, t0); d[wellknown.AnnotationVerdictSince] != "" {
		t.Fatalf("since without a verdict: %v", d)
	}
}
