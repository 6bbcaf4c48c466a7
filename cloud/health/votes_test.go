package health_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestVotesThatDoNotCount: against a real apiserver and hub, votes from a
// node outside the unit, about a node in no unit (a control-plane node) or
// about the voter itself, and ballots dated in the future or asking for an
// overlong TTL never count; a valid vote from a member does (the control
// that the path works).
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
	healthy, unhealthy := atollv1.Verdict_VERDICT_HEALTHY, atollv1.Verdict_VERDICT_UNHEALTHY
	// Valid-looking ballots live a minute (the maximum), so none expires
	// while the test reads them.
	publishBallot(t, ctx, js, "u1", "other-1", now, time.Minute, map[string]atollv1.Verdict{"edge-1": healthy})                     // voter of another unit
	publishBallot(t, ctx, js, "u1", "edge-2", now.Add(5*time.Minute), time.Minute, map[string]atollv1.Verdict{"edge-1": unhealthy}) // dated in the future
	publishBallot(t, ctx, js, "u1", "edge-2", now.Add(-time.Second), time.Hour, map[string]atollv1.Verdict{"edge-1": unhealthy})    // TTL too long
	publishBallot(t, ctx, js, "u1", "edge-2", now.Add(-2*time.Second), time.Minute, map[string]atollv1.Verdict{
		"edge-1": healthy,
		"cp-1":   healthy,   // a node in no unit
		"edge-2": unhealthy, // itself
	})
	// The last ballot is the oldest of edge-2's: had the future-dated or
	// the long-lived one been recorded, it would be ignored as stale.
	// Once it counts, every ballot before it in the stream was handled.
	poll.Eventually(t, 20*time.Second, func() error {
		if j := r.s.Tally("edge-1"); j.Healthy == 0 {
			return fmt.Errorf("edge-1 judged %v from %d votes, want edge-2's healthy vote", j.Verdict, j.Votes())
		}
		return nil
	})
	if j := r.s.Tally("edge-1"); j.Verdict != healthy || j.Votes() != 1 {
		t.Errorf("edge-1 judged %v from %d votes (%+v), want healthy from edge-2's one", j.Verdict, j.Votes(), j)
	}
	// Protected decides from the replica's own state once it has
	// computed the units' states (its first resync).
	poll.Eventually(t, 10*time.Second, func() error {
		if !r.s.Protected("edge-1") {
			return fmt.Errorf("edge-1 not protected by its peer's valid vote")
		}
		return nil
	})
	if j := r.s.Tally("cp-1"); j.Votes() != 0 || r.s.Protected("cp-1") {
		t.Errorf("cp-1, in no unit, judged from %d votes (protected %v)", j.Votes(), r.s.Protected("cp-1"))
	}
	if j := r.s.Tally("edge-2"); j.Votes() != 0 || j.Verdict != atollv1.Verdict_VERDICT_NONE {
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
	for _, voter := range nodes {
		publishBallot(t, ctx, env.js, "u1", voter, now, time.Minute, peersHealthy(nodes, voter))
	}
	poll.Eventually(t, 20*time.Second, func() error {
		for _, node := range nodes {
			if j := r.s.Tally(node); j.Verdict != atollv1.Verdict_VERDICT_HEALTHY {
				return fmt.Errorf("%s judged %v from %d votes", node, j.Verdict, j.Votes())
			}
		}
		return nil
	})
	poll.Eventually(t, 10*time.Second, func() error { // after the first resync
		if !r.s.Protected("k-lost") {
			return fmt.Errorf("k-lost, lost by the cloud with healthy peers, not protected")
		}
		return nil
	})
	for _, node := range []string{"k-false", "k-unknown"} {
		if r.s.Protected(node) {
			t.Errorf("%s protected against its kubelet's own Ready condition", node)
		}
	}
}
