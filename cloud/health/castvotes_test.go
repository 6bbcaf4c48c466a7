package health

import (
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// TestTrackerVotes: Votes lists exactly the votes Tally counts (fresh,
// not the node's own, accepted by counts), sorted by voter, with the
// voter's time and the hub's.
func TestTrackerVotes(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	tr := NewTracker(30 * time.Second)
	on := func(v atollv1.Verdict) map[string]atollv1.Verdict { return map[string]atollv1.Verdict{"n": v} }
	tr.ObserveBallot(ballot("b", t0, 30*time.Second, on(atollv1.Verdict_VERDICT_HEALTHY)), t0.Add(time.Second))
	tr.ObserveBallot(ballot("a", t0, 30*time.Second, on(atollv1.Verdict_VERDICT_UNHEALTHY)), t0.Add(2*time.Second))
	tr.ObserveBallot(ballot("n", t0, 30*time.Second, on(atollv1.Verdict_VERDICT_HEALTHY)), t0)  // its own
	tr.ObserveBallot(ballot("old", t0, 5*time.Second, on(atollv1.Verdict_VERDICT_HEALTHY)), t0) // expired at t0+10s
	tr.ObserveBallot(ballot("x", t0, 30*time.Second, on(atollv1.Verdict_VERDICT_HEALTHY)), t0)  // rejected by counts
	counts := func(voter, _ string) bool { return voter != "x" }

	got := tr.Votes("n", t0.Add(10*time.Second), counts)
	want := []Vote{
		{Voter: "a", Verdict: atollv1.Verdict_VERDICT_UNHEALTHY, Made: t0, Stored: t0.Add(2 * time.Second)},
		{Voter: "b", Verdict: atollv1.Verdict_VERDICT_HEALTHY, Made: t0, Stored: t0.Add(time.Second)},
	}
	if !slices.EqualFunc(got, want, func(a, b Vote) bool {
		return a.Voter == b.Voter && a.Verdict == b.Verdict && a.Made.Equal(b.Made) && a.Stored.Equal(b.Stored)
	}) {
		t.Fatalf("Votes = %+v, want %+v", got, want)
	}
	j := tr.Tally("n", t0.Add(10*time.Second), 4, counts)
	if j.Votes() != len(got) {
		t.Fatalf("Tally counts %d votes, Votes lists %d", j.Votes(), len(got))
	}
	if got := tr.Votes("n", t0.Add(time.Minute), nil); len(got) != 0 {
		t.Fatalf("a minute later: %+v, want none (expired)", got)
	}
}

// TestPatcherReportsWrites: the write hook hears of each patch the
// apiserver accepted, and of nothing when there is nothing to write.
func TestPatcherReportsWrites(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	c := fake.NewClientBuilder().WithObjects(n).Build()
	var got []Write
	p := &patcher{client: c, fresh: c, metrics: newMetrics(prometheus.NewRegistry()), wrote: func(w Write) { got = append(got, w) }}
	if err := p.node(t.Context(), n, func(*corev1.Node) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Fatalf("writes %+v for an empty patch", got)
	}
	patch := []byte(`[{"op":"add","path":"/metadata/annotations","value":{"a":"b"}}]`)
	if err := p.node(t.Context(), n, func(*corev1.Node) ([]byte, error) { return patch, nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Kind != "node" || got[0].Name != "n1" || got[0].Time.IsZero() {
		t.Fatalf("writes %+v, want one of node n1", got)
	}
}
