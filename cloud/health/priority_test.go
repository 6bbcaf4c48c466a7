package health_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/protect"
	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestProtectionNotBehindAnnotations: with the informational writes
// throttled to one every two seconds and 40 nodes waiting for their
// verdict annotation (a backlog of over a minute), a lost node whose peers
// vote it healthy loses its unreachable:NoExecute taint within seconds:
// protection writes have their own client, limiter and path, and never
// wait behind the annotations. With one shared limiter (or the
// annotations written inside the reconcile) the taint would wait for the
// backlog.
func TestProtectionNotBehindAnnotations(t *testing.T) {
	ctx := t.Context()
	env := startEnv(t, ctx)
	log := natstest.Logger(t, slog.LevelWarn)
	const fillers = 40
	for i := range fillers {
		addUnitNode(t, ctx, env.client, "busy", fmt.Sprintf("f-%02d", i), corev1.ConditionTrue, "KubeletReady")
	}
	addUnitNode(t, ctx, env.client, "u2", "x", corev1.ConditionUnknown, protect.ReasonNodeStatusUnknown)
	addUnitNode(t, ctx, env.client, "u2", "p1", corev1.ConditionTrue, "KubeletReady")
	addUnitNode(t, ctx, env.client, "u2", "p2", corev1.ConditionTrue, "KubeletReady")

	r := startReplicaWith(t, ctx, env.rc, hublink.Of(env.nc, env.js), log, false, func(c *health.Config) {
		c.Info, c.InfoWorkers = health.Limits{QPS: 0.5, Burst: 1}, 1
	})
	poll.Eventually(t, 20*time.Second, func() error { return r.s.Ready(ctx) })
	annotated := func() (int, error) {
		list, err := env.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: wellknown.LabelUnit + "=busy"})
		if err != nil {
			return 0, err
		}
		n := 0
		for _, node := range list.Items {
			if _, ok := node.Annotations[wellknown.AnnotationVerdict]; ok {
				n++
			}
		}
		return n, nil
	}
	// The backlog has started.
	poll.Eventually(t, 20*time.Second, func() error {
		if n, err := annotated(); err != nil || n == 0 {
			return fmt.Errorf("%d filler nodes annotated (%v)", n, err)
		}
		return nil
	})

	now := time.Now()
	for _, voter := range []string{"p1", "p2"} {
		b := &atollv1.Ballot{Voter: voter, Unit: "u2", Time: timestamppb.New(now), Ttl: durationpb.New(time.Minute), Members: 3}
		for _, node := range []string{"x", "p1", "p2"} {
			if node != voter {
				b.Votes = append(b.Votes, &atollv1.Vote{Node: node, Verdict: atollv1.Verdict_VERDICT_HEALTHY, Normal: 2, Since: timestamppb.New(now)})
			}
		}
		subj, err := events.BallotSubject("u2", voter)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := events.PublishDurable(ctx, env.js, subj, b, ""); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	// With one limiter for both, the taint waited about 10 s here.
	poll.Eventually(t, 5*time.Second, func() error {
		n, err := env.client.CoreV1().Nodes().Get(ctx, "x", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, taint := range n.Spec.Taints {
			if taint.Key == corev1.TaintNodeUnreachable && taint.Effect == corev1.TaintEffectNoExecute {
				return fmt.Errorf("x still tainted unreachable:NoExecute")
			}
		}
		if v := n.Annotations[wellknown.AnnotationVerdict]; v != wellknown.VerdictHealthy {
			return fmt.Errorf("x's verdict annotation %q: it rides with the protection patch", v)
		}
		return nil
	})
	took := time.Since(start)
	n, err := annotated()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("x protected %v after the votes, with %d of %d annotations still waiting", took.Round(time.Millisecond), fillers-n, fillers)
	if fillers-n < fillers/2 {
		t.Fatalf("only %d annotations still waiting when x was protected: the informational queue was not saturated", fillers-n)
	}
}
