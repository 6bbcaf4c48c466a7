package health_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/protect"
	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestOneWritePerTransition counts, in a real kube-apiserver's audit log,
// atoll-cloud's PATCHes per Node through the transitions of a whole unit
// losing the cloud and coming back, with the resync at its default 2 s:
//
//   - cut: the hub reports every member's leaf link closed, one after
//     the other (as it does when a site's uplink dies). The verdicts turn
//     to none (the votes stop counting) and the unit is held (its hold
//     annotation, which the guard webhook reads): one transition, so one
//     patch per Node carrying both (not the verdicts at once and the hold
//     at the next resync: two patches per Node).
//   - one member then lost by the node lifecycle controller (Ready
//     Unknown, unreachable taints): the hold protects it, one patch
//     removing its NoExecute taint, none on the others.
//   - heal: fresh ballots say healthy again and the hold ends: one patch
//     per Node (verdict and hold annotation together).
//
// Between transitions atoll-cloud writes nothing.
func TestOneWritePerTransition(t *testing.T) {
	auditDir := t.TempDir()
	flags, err := kubetest.Audit(auditDir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	env := startEnv(t, ctx, kubetest.WithAPIServerFlags(flags...))
	log := natstest.Logger(t, slog.LevelWarn)

	const unit = "site"
	nodes := []string{"s-1", "s-2", "s-3"}
	for _, n := range nodes {
		addUnitNode(t, ctx, env.client, unit, n, corev1.ConditionTrue, "KubeletReady")
	}
	r := startReplicaWith(t, ctx, env.rc, hublink.Of(env.nc, env.js), log, false, func(c *health.Config) {
		c.Resync = 2 * time.Second // the default: the gap the double write had
	})
	poll.Eventually(t, 20*time.Second, func() error { return r.s.Ready(ctx) })

	vote := func() {
		t.Helper()
		now := time.Now()
		for _, voter := range nodes {
			b := &atollv1.Ballot{Voter: voter, Unit: unit, Time: timestamppb.New(now), Ttl: durationpb.New(time.Minute), Members: uint32(len(nodes))}
			for _, n := range nodes {
				if n != voter {
					b.Votes = append(b.Votes, &atollv1.Vote{Node: n, Verdict: atollv1.Verdict_VERDICT_HEALTHY, Normal: 2, Since: timestamppb.New(now)})
				}
			}
			subj, err := events.BallotSubject(unit, voter)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := events.PublishDurable(ctx, env.js, subj, b, ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	// state waits until every node's managed annotations are as want says.
	state := func(what string, want func(n *corev1.Node) error) {
		t.Helper()
		poll.Eventually(t, 30*time.Second, func() error {
			for _, name := range nodes {
				n, err := env.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				if err := want(n); err != nil {
					return fmt.Errorf("%s: %s: %w", what, name, err)
				}
			}
			return nil
		})
	}
	annotations := func(verdict string, held bool) func(n *corev1.Node) error {
		return func(n *corev1.Node) error {
			if v := n.Annotations[wellknown.AnnotationVerdict]; v != verdict {
				return fmt.Errorf("verdict %q, want %q", v, verdict)
			}
			if h := n.Annotations[wellknown.AnnotationHoldUntil]; (h != "") != held {
				return fmt.Errorf("hold until %q, want held %v", h, held)
			}
			return nil
		}
	}
	// settle waits until atoll-cloud has written nothing for three
	// resyncs, and returns its writes by object.
	settle := func() map[string]int {
		t.Helper()
		return quietWrites(t, auditDir, 6*time.Second, 60*time.Second)
	}
	check := func(step string, before, after map[string]int, want map[string]int) {
		t.Helper()
		objs := map[string]bool{}
		for o := range after {
			objs[o] = true
		}
		for o := range want {
			objs[o] = true
		}
		for o := range objs {
			if got := after[o] - before[o]; got != want[o] {
				t.Errorf("%s: %s: %d atoll-cloud writes, want %d", step, o, got, want[o])
			}
		}
	}
	each := func(n int) map[string]int {
		m := map[string]int{}
		for _, name := range nodes {
			m["nodes//"+name] = n
		}
		return m
	}

	vote()
	state("healthy", annotations(wellknown.VerdictHealthy, false))
	steady := settle()

	// The whole site loses its uplink: the hub reports each leaf closed.
	links, err := env.js.KeyValue(ctx, health.LinksBucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if _, err := links.Put(ctx, n, []byte(time.Now().UTC().Format(time.RFC3339Nano))); err != nil {
			t.Fatal(err)
		}
	}
	state("cut", annotations(wellknown.VerdictNone, true))
	if st, _ := r.s.UnitState(unit); st != health.FullDisruption {
		t.Fatalf("unit %s is %s, want %s", unit, st, health.FullDisruption)
	}
	cut := settle()
	check("cut", steady, cut, each(1))

	// KCM loses s-1: the hold keeps it (its NoExecute taint removed).
	lose(t, ctx, env, nodes[0])
	poll.Eventually(t, 30*time.Second, func() error {
		n, err := env.client.CoreV1().Nodes().Get(ctx, nodes[0], metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, changed := protect.NodeTaints(n, true); changed {
			return fmt.Errorf("%s still tainted %v", n.Name, n.Spec.Taints)
		}
		return nil
	})
	lost := settle()
	check("lost", cut, lost, map[string]int{"nodes//" + nodes[0]: 1})

	// The site comes back: new ballots, the hold ends.
	for _, n := range nodes[1:] {
		setReady(t, ctx, env, n, corev1.ConditionTrue)
	}
	setReady(t, ctx, env, nodes[0], corev1.ConditionTrue)
	vote()
	state("healed", annotations(wellknown.VerdictHealthy, false))
	healed := settle()
	check("healed", lost, healed, each(1))

	if t.Failed() {
		evs, _ := kubetest.ReadAudit(kubetest.AuditLog(auditDir))
		var b strings.Builder
		for _, e := range evs {
			if e.FieldManager() == wellknown.FieldManager {
				var n corev1.Node
				_ = json.Unmarshal(e.ResponseObject, &n)
				fmt.Fprintf(&b, "%s %s %d verdict=%q hold=%q taints=%d\n", e.Verb, e.Object(), e.ResponseStatus.Code,
					n.Annotations[wellknown.AnnotationVerdict], n.Annotations[wellknown.AnnotationHoldUntil], len(n.Spec.Taints))
			}
		}
		t.Logf("atoll-cloud writes:\n%s", b.String())
	}
}

// lose marks name lost as the node lifecycle controller does: Ready
// Unknown (reason NodeStatusUnknown) and both unreachable taints.
func lose(t *testing.T, ctx context.Context, env testEnv, name string) {
	t.Helper()
	setReady(t, ctx, env, name, corev1.ConditionUnknown)
	n, err := env.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = []corev1.Taint{
		{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute},
	}
	if _, err := env.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// setReady sets name's Ready condition (Unknown with the node lifecycle
// controller's reason); back to True it also drops the unreachable
// taints, as the controller does.
func setReady(t *testing.T, ctx context.Context, env testEnv, name string, ready corev1.ConditionStatus) {
	t.Helper()
	reason := "KubeletReady"
	if ready == corev1.ConditionUnknown {
		reason = protect.ReasonNodeStatusUnknown
	}
	// atoll-cloud writes the Nodes too: on a conflict, read again.
	tainted := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := env.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		tainted = len(n.Spec.Taints) > 0
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready,
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: reason}}
		_, err = env.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if ready != corev1.ConditionTrue || !tainted {
		return
	}
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := env.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Taints = nil
		_, err = env.client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// TestOldLinkClosedAfterRelink replays, against a real apiserver and hub,
// the order of events of a unit whose agents restart while their links are
// cut and then heal: a lost node (Ready Unknown) is protected by its two
// peers' healthy votes; one peer links again (a new leaf connection); the
// hub notices the peer's old link dead only then and reports it closed,
// before the peer's ballot over the new link arrives (CI34) or after it
// (CI29). Neither order may leave the node unprotected: the close of a
// link older than the voter's newest cuts nothing.
func TestOldLinkClosedAfterRelink(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	env := startEnv(t, ctx)
	log := natstest.Logger(t, slog.LevelWarn)
	addNode(t, ctx, env.client, "r-1", corev1.ConditionUnknown)
	addNode(t, ctx, env.client, "r-2", corev1.ConditionTrue)
	addNode(t, ctx, env.client, "r-3", corev1.ConditionTrue)
	const grace = 2 * time.Second
	r := startReplicaWith(t, ctx, env.rc, hublink.Of(env.nc, env.js), log, false, func(c *health.Config) { c.CutGrace = grace })
	poll.Eventually(t, 20*time.Second, func() error { return r.s.Ready(ctx) })

	healthy := atollv1.Verdict_VERDICT_HEALTHY
	oldLink := time.Now().Add(-time.Hour)
	for _, voter := range []string{"r-2", "r-3"} {
		r.s.LeafEvent(ctx, health.LeafLink{Node: voter, Start: oldLink, At: oldLink})
		publishBallot(t, ctx, env.js, "u1", voter, time.Now(), time.Minute, map[string]atollv1.Verdict{"r-1": healthy})
	}
	poll.Eventually(t, 20*time.Second, func() error {
		if !r.s.Protected("r-1") {
			return fmt.Errorf("r-1 not protected: %+v", r.s.Tally("r-1"))
		}
		return nil
	})
	protected := func(when string, healthy int) {
		t.Helper()
		if j := r.s.Tally("r-1"); !r.s.Protected("r-1") || j.Healthy != healthy {
			t.Fatalf("%s: r-1 protected %v, tally %+v", when, r.s.Protected("r-1"), j)
		}
	}

	// r-2: the old link's close comes before its ballot over the new one.
	relinked := time.Now()
	r.s.LeafEvent(ctx, health.LeafLink{Node: "r-2", Start: relinked, At: relinked})
	r.s.LeafEvent(ctx, health.LeafLink{Node: "r-2", Closed: true, Start: oldLink, At: time.Now(), Reason: "Duplicate Remote LeafNode Connection"})
	protected("r-2's old link closed before its new ballot", 2)
	// r-3: after it.
	r.s.LeafEvent(ctx, health.LeafLink{Node: "r-3", Start: relinked, At: relinked})
	publishBallot(t, ctx, env.js, "u1", "r-3", time.Now(), time.Minute, map[string]atollv1.Verdict{"r-1": healthy})
	poll.Eventually(t, 20*time.Second, func() error {
		if last := r.s.LastBallot("r-3"); !last.After(relinked) {
			return fmt.Errorf("r-3's ballot over its new link not recorded (last %v)", last)
		}
		return nil
	})
	r.s.LeafEvent(ctx, health.LeafLink{Node: "r-3", Closed: true, Start: oldLink, At: time.Now(), Reason: "Stale Connection"})
	protected("r-3's old link closed after its new ballot", 2)
	for _, voter := range []string{"r-2", "r-3"} {
		if r.s.LinkDown(voter) {
			t.Fatalf("%s reported cut although it linked again", voter)
		}
	}
	// The newest link closing does cut the voter: its vote counts no
	// more, protects for the cut grace, then not.
	cut := time.Now()
	r.s.LeafEvent(ctx, health.LeafLink{Node: "r-3", Closed: true, Start: relinked, At: cut, Reason: "Stale Connection"})
	if j := r.s.Tally("r-1"); j.Healthy != 1 || j.Graced != 1 || (time.Since(cut) < grace && !r.s.Protected("r-1")) {
		t.Fatalf("r-3's newest link closed: r-1 protected %v, tally %+v", r.s.Protected("r-1"), j)
	}
	poll.Eventually(t, 10*time.Second, func() error {
		if r.s.Protected("r-1") {
			return fmt.Errorf("r-1 still protected %s after r-3's cut: %+v", time.Since(cut).Round(time.Millisecond), r.s.Tally("r-1"))
		}
		return nil
	})
	if since := time.Since(cut); since < grace {
		t.Fatalf("r-1 unprotected %s after r-3's cut, within the cut grace", since)
	}
}
