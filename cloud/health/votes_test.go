package health_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/testenv/natstest"
	"github.com/atoll-edge/atoll/internal/testenv/poll"
	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// TestVotesThatDoNotCount: against a real apiserver and hub, votes from a
// node outside the unit, about a node in no unit (a control-plane node),
// dated in the future or asking for an overlong TTL never count; a valid
// vote from a member does (the control that the path works).
func TestVotesThatDoNotCount(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	env := startEnv(t, ctx)
	rc, client, nc, js := env.rc, env.client, env.nc, env.js
	log := natstest.Logger(t, slog.LevelError)

	addNode(t, ctx, client, "edge-1", corev1.ConditionUnknown) // unit u1
	addNode(t, ctx, client, "edge-2", corev1.ConditionTrue)    // unit u1
	other, err := client.CoreV1().Nodes().Get(ctx, "edge-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other = other.DeepCopy()
	other.Name, other.ResourceVersion, other.UID = "other-1", "", ""
	other.Labels = map[string]string{wellknown.LabelUnit: "u2"}
	other.Status = corev1.NodeStatus{}
	if _, err := client.CoreV1().Nodes().Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cp := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-1", Labels: map[string]string{"node-role.kubernetes.io/control-plane": ""}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}}}}
	if _, err := client.CoreV1().Nodes().Create(ctx, cp, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	r := startReplica(t, ctx, rc, hublink.Of(nc, js), log, false)
	poll.Eventually(t, 20*time.Second, func() error { return r.s.Ready(ctx) })

	now := time.Now()
	vote := func(unit, node, voter string, v atollv1.Verdict, at time.Time, ttl time.Duration) {
		t.Helper()
		subj, err := events.VoteSubject(unit, node, voter)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := events.PublishDurable(ctx, js, subj, &atollv1.Vote{Unit: unit, Node: node, Voter: voter, Verdict: v,
			Normal: 1, Checkers: 1, Time: timestamppb.New(at), Since: timestamppb.New(at), Ttl: durationpb.New(ttl)}, ""); err != nil {
			t.Fatal(err)
		}
	}
	healthy, unhealthy := atollv1.Verdict_VERDICT_HEALTHY, atollv1.Verdict_VERDICT_UNHEALTHY
	// Valid-looking votes live a minute (the maximum), so none expires
	// while the test reads them.
	vote("u1", "edge-1", "other-1", healthy, now, time.Minute)                     // voter of another unit
	vote("u1", "cp-1", "edge-2", healthy, now, time.Minute)                        // target in no unit
	vote("u1", "edge-1", "edge-2", unhealthy, now.Add(5*time.Minute), time.Minute) // dated in the future
	vote("u1", "edge-1", "edge-2", unhealthy, now.Add(-time.Second), time.Hour)    // TTL too long
	vote("u1", "edge-2", "edge-2", unhealthy, now, time.Minute)                    // about itself
	vote("u1", "edge-1", "edge-2", healthy, now.Add(-2*time.Second), time.Minute)
	// The last vote is the oldest of edge-2's: had the future-dated or
	// the long-lived one been recorded, it would be ignored as stale.
	// Once it counts, every vote before it in the stream was handled.
	poll.Eventually(t, 20*time.Second, func() error {
		if j := r.s.Judge("edge-1"); j.Healthy == 0 {
			return fmt.Errorf("edge-1 judged %v from %d votes, want edge-2's healthy vote", j.Verdict, j.Votes())
		}
		return nil
	})
	if j := r.s.Judge("edge-1"); j.Verdict != healthy || j.Votes() != 1 {
		t.Errorf("edge-1 judged %v from %d votes (%+v), want healthy from edge-2's one", j.Verdict, j.Votes(), j)
	}
	if !r.s.Protected("edge-1") {
		t.Error("edge-1 not protected by its peer's valid vote")
	}
	if j := r.s.Judge("cp-1"); j.Votes() != 0 || r.s.Protected("cp-1") {
		t.Errorf("cp-1, in no unit, judged from %d votes (protected %v)", j.Votes(), r.s.Protected("cp-1"))
	}
	if j := r.s.Judge("edge-2"); j.Votes() != 0 || j.Verdict != atollv1.Verdict_VERDICT_NONE {
		t.Errorf("edge-2 judged %v from %d votes: its vote about itself counted", j.Verdict, j.Votes())
	}
}

// TestKubeletWordIsNeverOverridden: nodes whose peers all vote healthy are
// still not protected when their Ready condition is the kubelet's own
// (False, or Unknown for another reason than the node lifecycle
// controller's); the control, lost by the cloud, is.
func TestKubeletWordIsNeverOverridden(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	env := startEnv(t, ctx)
	log := natstest.Logger(t, slog.LevelError)
	addNodeReason(t, ctx, env.client, "k-false", corev1.ConditionFalse, "KubeletNotReady")
	addNodeReason(t, ctx, env.client, "k-unknown", corev1.ConditionUnknown, "KubeletNotReady")
	addNode(t, ctx, env.client, "k-lost", corev1.ConditionUnknown)
	r := startReplica(t, ctx, env.rc, hublink.Of(env.nc, env.js), log, false)
	poll.Eventually(t, 20*time.Second, func() error { return r.s.Ready(ctx) })
	nodes := []string{"k-false", "k-unknown", "k-lost"}
	now := time.Now()
	for _, node := range nodes {
		for _, voter := range nodes {
			if voter == node {
				continue
			}
			subj, _ := events.VoteSubject("u1", node, voter)
			if _, err := events.PublishDurable(ctx, env.js, subj, &atollv1.Vote{Unit: "u1", Node: node, Voter: voter,
				Verdict: atollv1.Verdict_VERDICT_HEALTHY, Normal: 2, Checkers: 2, Time: timestamppb.New(now), Since: timestamppb.New(now),
				Ttl: durationpb.New(time.Minute)}, ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	poll.Eventually(t, 20*time.Second, func() error {
		for _, node := range nodes {
			if j := r.s.Judge(node); j.Verdict != atollv1.Verdict_VERDICT_HEALTHY {
				return fmt.Errorf("%s judged %v from %d votes", node, j.Verdict, j.Votes())
			}
		}
		return nil
	})
	if !r.s.Protected("k-lost") {
		t.Error("k-lost, lost by the cloud with healthy peers, not protected")
	}
	for _, node := range []string{"k-false", "k-unknown"} {
		if r.s.Protected(node) {
			t.Errorf("%s protected against its kubelet's own Ready condition", node)
		}
	}
}
