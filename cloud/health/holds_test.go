package health_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestHoldsSurviveRestart: a unit cut off entirely keeps the hold it got
// from the first replica across a restart (same end, nothing re-started);
// a hold recorded for a unit that recovered, or vanished, while no replica
// ran is dropped at start, so the unit's next disruption gets a full hold
// instead of inheriting an expired one.
func TestHoldsSurviveRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	env := startEnv(t, ctx)
	log := natstest.Logger(t, slog.LevelWarn)

	holds, err := env.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: health.HoldBucket, History: 1})
	if err != nil {
		t.Fatal(err)
	}
	stale := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339Nano)
	for _, unit := range []string{"recovered", "vanished"} {
		if _, err := holds.Put(ctx, unit, []byte(stale)); err != nil {
			t.Fatal(err)
		}
	}
	unitNode(t, ctx, env.client, "r-1", "recovered", corev1.ConditionTrue)
	for _, n := range []string{"c-1", "c-2"} {
		unitNode(t, ctx, env.client, n, "cut", corev1.ConditionUnknown)
	}

	first := startReplica(t, ctx, env.rc, hublink.Of(env.nc, env.js), log, false)
	var until time.Time
	poll.Eventually(t, 30*time.Second, func() error {
		st, hold := first.s.UnitState("cut")
		if st != health.FullDisruption || hold.IsZero() {
			return fmt.Errorf("unit cut is %s, hold until %v", st, hold)
		}
		until = hold
		return nil
	})
	poll.Eventually(t, 30*time.Second, func() error {
		for _, unit := range []string{"recovered", "vanished"} {
			if _, err := holds.Get(ctx, unit); !errors.Is(err, jetstream.ErrKeyNotFound) {
				return fmt.Errorf("stale hold of unit %s still recorded (%v)", unit, err)
			}
		}
		return nil
	})

	first.stop()
	second := startReplica(t, ctx, env.rc, hublink.Of(env.nc, env.js), log, false)
	poll.Eventually(t, 30*time.Second, func() error {
		st, hold := second.s.UnitState("cut")
		if st != health.FullDisruption || !hold.Equal(until) {
			return fmt.Errorf("after restart unit cut is %s, hold until %v; want %s until %v", st, hold, health.FullDisruption, until)
		}
		return nil
	})
}

// unitNode creates a node of unit with the given Ready status (Unknown
// with the node lifecycle controller's reason).
func unitNode(t *testing.T, ctx context.Context, client kubernetes.Interface, name, unit string, ready corev1.ConditionStatus) {
	t.Helper()
	n, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{wellknown.LabelUnit: unit}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready,
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "NodeStatusUnknown"}}
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestUnitStateChangesNotified: once the states are known
// (UnitStateKnown), OnUnitState tells of each change of a unit's
// disruption state, with the state UnitState then answers, and of nothing
// while the state stays (the resyncs run every 200 ms).
func TestUnitStateChangesNotified(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	env := startEnv(t, ctx)
	log := natstest.Logger(t, slog.LevelWarn)
	for _, n := range []string{"u-1", "u-2"} {
		unitNode(t, ctx, env.client, n, "u", corev1.ConditionTrue)
	}
	r := startReplica(t, ctx, env.rc, hublink.Of(env.nc, env.js), log, false)
	var mu sync.Mutex
	var seen []string
	r.s.OnUnitState(func(unit string, st health.UnitState) {
		if now, _ := r.s.UnitState(unit); now != st {
			t.Errorf("notified of %s %s while UnitState says %s", unit, st, now)
		}
		if unit == "u" {
			mu.Lock()
			seen = append(seen, string(st))
			mu.Unlock()
		}
	})
	notices := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
	poll.Eventually(t, 30*time.Second, func() error {
		if st, known := r.s.UnitStateKnown("u"); st != health.Normal || !known {
			return fmt.Errorf("unit u is %s (known: %v)", st, known)
		}
		return nil
	})
	setReady := func(name string, ready corev1.ConditionStatus) {
		t.Helper()
		// atoll-cloud writes the Nodes too (annotations, taints): on a
		// conflict, read again.
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := env.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready,
				LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "NodeStatusUnknown"}}
			_, err = env.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	want := func(states ...string) func() error {
		return func() error {
			// A first Normal may come before or after the registration.
			got := notices()
			if len(got) > 0 && got[0] == string(health.Normal) {
				got = got[1:]
			}
			if !slices.Equal(got, states) {
				return fmt.Errorf("notices for unit u %v, want %v", got, states)
			}
			return nil
		}
	}
	setReady("u-1", corev1.ConditionUnknown)
	poll.Eventually(t, 30*time.Second, want(string(health.PartialDisruption)))
	setReady("u-2", corev1.ConditionUnknown)
	poll.Eventually(t, 30*time.Second, want(string(health.PartialDisruption), string(health.FullDisruption)))
	// Ten resyncs and more with the state unchanged: no notice.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if err := want(string(health.PartialDisruption), string(health.FullDisruption))(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestHoldDecidedFromTheWrite: the node lifecycle controller marks the
// last member of a unit the cloud still heard Unknown and taints it at
// once; its taint can reach the webhook before the informer's event has
// moved the unit's state. The decision for that write holds the unit
// already: with the node as it is written, the cloud hears none of its
// members (no agent links it, no Lease renews). It records nothing: the
// unit's state moves on the event path.
func TestHoldDecidedFromTheWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	env := startEnv(t, ctx)
	unitNode(t, ctx, env.client, "w-1", "w", corev1.ConditionUnknown)
	unitNode(t, ctx, env.client, "w-2", "w", corev1.ConditionTrue)
	r := startReplica(t, ctx, env.rc, hublink.Of(env.nc, env.js), natstest.Logger(t, slog.LevelWarn), false)
	var w2 *corev1.Node
	poll.Eventually(t, 30*time.Second, func() error {
		if st, known := r.s.UnitStateKnown("w"); st != health.PartialDisruption || !known {
			return fmt.Errorf("unit w is %s (known: %v), want %s", st, known, health.PartialDisruption)
		}
		var err error
		w2, err = env.client.CoreV1().Nodes().Get(ctx, "w-2", metav1.GetOptions{})
		return err
	})
	// w-2 as the controller writes it: Unknown, and the taint.
	lost := w2.DeepCopy()
	lost.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown,
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "NodeStatusUnknown"}}
	lost.Spec.Taints = []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}}
	if !r.s.ProtectedNode(lost) {
		t.Fatal("w-2, the last member the cloud heard, is not protected when the controller loses it")
	}
	if st, _ := r.s.UnitState("w"); st != health.PartialDisruption {
		t.Errorf("the decision recorded unit w as %s", st)
	}
	// w-1 lost, w-2 still heard: no hold.
	w1, err := env.client.CoreV1().Nodes().Get(ctx, "w-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r.s.ProtectedNode(w1) {
		t.Error("w-1 protected while the cloud hears w-2")
	}
}

// TestHoldOutlastsTheFirstBallot: a unit cut off entirely is held; when it
// comes back, its agents' ballots arrive one by one. The first one (about
// the other two members, still lost) must not end the hold while a member
// still lost has no verdict of its peers: the hold lasts until every lost
// member has one (then its verdict protects it), and no longer than the
// rejoin grace when some never gets one.
func TestHoldOutlastsTheFirstBallot(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	env := startEnv(t, ctx)
	log := natstest.Logger(t, slog.LevelWarn)
	healthy := atollv1.Verdict_VERDICT_HEALTHY
	const grace = 10 * time.Second
	for _, unit := range []string{"back", "half"} {
		for i := 1; i <= 3; i++ {
			unitNode(t, ctx, env.client, fmt.Sprintf("%s-%d", unit, i), unit, corev1.ConditionUnknown)
		}
	}
	r := startReplicaWith(t, ctx, env.rc, hublink.Of(env.nc, env.js), log, false, func(c *health.Config) { c.RejoinGrace = grace })
	for _, unit := range []string{"back", "half"} {
		poll.Eventually(t, 30*time.Second, func() error {
			if st, hold := r.s.UnitState(unit); st != health.FullDisruption || hold.IsZero() {
				return fmt.Errorf("unit %s is %s, hold until %v", unit, st, hold)
			}
			return nil
		})
	}
	// vote has voter's ballot say the other two members of its unit
	// healthy, and waits until the replica recorded it.
	vote := func(unit string, voter int) {
		t.Helper()
		name := fmt.Sprintf("%s-%d", unit, voter)
		verdicts := map[string]atollv1.Verdict{}
		for i := 1; i <= 3; i++ {
			if i != voter {
				verdicts[fmt.Sprintf("%s-%d", unit, i)] = healthy
			}
		}
		sent := time.Now()
		publishBallot(t, ctx, env.js, unit, name, sent, time.Minute, verdicts)
		poll.Eventually(t, 10*time.Second, func() error {
			if !r.s.LastBallot(name).After(sent.Add(-time.Second)) {
				return fmt.Errorf("%s's ballot not recorded", name)
			}
			return nil
		})
	}
	protected := func(unit string) error {
		for i := 1; i <= 3; i++ {
			if n := fmt.Sprintf("%s-%d", unit, i); !r.s.Protected(n) {
				st, _ := r.s.UnitState(unit)
				return fmt.Errorf("%s not protected: unit %s, tally %+v", n, st, r.s.Tally(n))
			}
		}
		return nil
	}

	// Every ballot of unit back comes: the hold lasts until the last one,
	// every member protected throughout, then by its verdict.
	start := time.Now()
	for voter := 1; voter <= 3; voter++ {
		vote("back", voter)
		if err := protected("back"); err != nil {
			t.Fatalf("after back-%d's ballot: %v", voter, err)
		}
		st, _ := r.s.UnitState("back")
		if voter < 3 && st != health.FullDisruption {
			t.Fatalf("after back-%d's ballot unit back is %s: its hold ended while a member had no verdict", voter, st)
		}
	}
	if time.Since(start) > grace {
		t.Fatalf("the ballots took %s, longer than the rejoin grace: this run shows nothing", time.Since(start))
	}
	poll.Eventually(t, 10*time.Second, func() error {
		if st, _ := r.s.UnitState("back"); st == health.FullDisruption {
			return fmt.Errorf("unit back still held with every member's verdict in")
		}
		return protected("back")
	})

	// Only half-1 comes back: no member gets a verdict (one peer's vote
	// each, or none), so once the grace has passed the hold ends and they
	// are left to Kubernetes.
	// The cloud can hear the ballot no sooner than it is sent: the grace
	// is measured from before the vote (after it, a slow publish made the
	// hold look 48 ms short of it on a loaded machine).
	heard := time.Now()
	vote("half", 1)
	if err := protected("half"); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, grace+10*time.Second, func() error {
		if st, _ := r.s.UnitState("half"); st == health.FullDisruption {
			return fmt.Errorf("unit half still held %s after it was heard", time.Since(heard).Round(time.Second))
		}
		return nil
	})
	if since := time.Since(heard); since < grace {
		t.Fatalf("unit half's hold ended %s after it was heard, before the grace", since)
	}
	for i := 1; i <= 3; i++ {
		if n := fmt.Sprintf("half-%d", i); r.s.Protected(n) {
			t.Errorf("%s protected after the grace with no verdict: %+v", n, r.s.Tally(n))
		}
	}
}

// TestUnitUnheardIsHeld: a site goes dark while the cloud knows nothing of
// its links (they closed while no replica ran, or before the hub
// restarted), so only its votes' TTLs and the node lifecycle controller
// tell. Its voters' last ballots were sent up to a keep-alive apart and
// run out as far apart; the node lifecycle controller has lost every
// member before the first runs out. Every member must stay protected
// throughout: the unit is held once no ballot has come for UnheardAfter,
// before the first vote runs out, not after the last.
func TestUnitUnheardIsHeld(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	env := startEnv(t, ctx)
	names := []string{"dark-1", "dark-2", "dark-3"}
	for _, n := range names {
		unitNode(t, ctx, env.client, n, "dark", corev1.ConditionTrue)
	}
	const ttl, apart = 8 * time.Second, time.Second
	r := startReplicaWith(t, ctx, env.rc, hublink.Of(env.nc, env.js), natstest.Logger(t, slog.LevelWarn), false,
		func(c *health.Config) { c.UnheardAfter = 3 * time.Second })
	poll.Eventually(t, 30*time.Second, func() error {
		if st, known := r.s.UnitStateKnown("dark"); st != health.Normal || !known {
			return fmt.Errorf("unit dark is %s (known: %v), want %s", st, known, health.Normal)
		}
		return nil
	})
	// Each voter's last ballot, a second apart: the first runs out at
	// first+ttl, taking dark-2's and dark-3's quorum; the last at
	// first+ttl+2s.
	first := time.Now()
	for i, voter := range names {
		if wait := time.Until(first.Add(time.Duration(i) * apart)); wait > 0 {
			time.Sleep(wait)
		}
		sent := time.Now()
		publishBallot(t, ctx, env.js, "dark", voter, sent, ttl, peersHealthy(names, voter))
		poll.Eventually(t, 5*time.Second, func() error {
			if !r.s.LastBallot(voter).After(sent.Add(-time.Second)) {
				return fmt.Errorf("%s's ballot not recorded", voter)
			}
			return nil
		})
	}
	for _, n := range names {
		setReady(t, ctx, env, n, corev1.ConditionUnknown)
	}
	protected := func() error {
		for _, n := range names {
			if !r.s.Protected(n) {
				st, _ := r.s.UnitState("dark")
				return fmt.Errorf("%s not protected: unit dark %s, tally %+v", n, st, r.s.Tally(n))
			}
		}
		return nil
	}
	poll.Eventually(t, 5*time.Second, protected)
	if time.Since(first) > ttl {
		t.Fatalf("the setup took %s, past the first vote's TTL: this run shows nothing", time.Since(first))
	}
	// Past the last vote's TTL, every 50 ms.
	for end := first.Add(ttl + 2*apart + 2*time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if err := protected(); err != nil {
			t.Fatalf("%s after the first ballot: %v", time.Since(first).Round(time.Millisecond), err)
		}
	}
	if st, hold := r.s.UnitState("dark"); st != health.FullDisruption || hold.IsZero() {
		t.Fatalf("unit dark is %s, hold until %v; want held", st, hold)
	}
}

// TestUnitCutUnseenIsHeld: a site cut off while no atoll-cloud replica
// ran (with an embedded hub, the same SIGKILL ends both): the new replica
// never hears its links close. Its agents' last ballots ran out, its
// kubelets' Leases go stale, and the node lifecycle controller loses its
// nodes one at a time (slowly, on a loaded apiserver). The unit is held
// from its silence, before the controller loses its last node: the first
// node lost is protected though its peers' votes expired and the others
// are still Ready. While the kubelets still report, unheard agents alone
// hold nothing.
func TestUnitCutUnseenIsHeld(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	env := startEnv(t, ctx)
	names := []string{"unseen-1", "unseen-2", "unseen-3"}
	for _, n := range names {
		unitNode(t, ctx, env.client, n, "unseen", corev1.ConditionTrue)
		renewLease(t, ctx, env.client, n, time.Now())
	}
	const unheard, ttl = 3 * time.Second, 2 * time.Second
	r := startReplicaWith(t, ctx, env.rc, hublink.Of(env.nc, env.js), natstest.Logger(t, slog.LevelWarn), false,
		func(c *health.Config) { c.UnheardAfter = unheard })
	poll.Eventually(t, 30*time.Second, func() error {
		if st, known := r.s.UnitStateKnown("unseen"); st != health.Normal || !known {
			return fmt.Errorf("unit unseen is %s (known: %v), want %s", st, known, health.Normal)
		}
		return nil
	})
	last := time.Now()
	for _, voter := range names {
		publishBallot(t, ctx, env.js, "unseen", voter, time.Now(), ttl, peersHealthy(names, voter))
	}
	poll.Eventually(t, 5*time.Second, func() error {
		for _, voter := range names {
			if r.s.LastBallot(voter).Before(last.Add(-time.Second)) {
				return fmt.Errorf("%s's ballot not recorded", voter)
			}
		}
		return nil
	})
	// The agents go quiet; the kubelets still renew: not held.
	for end := time.Now().Add(unheard + time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		for _, n := range names {
			renewLease(t, ctx, env.client, n, time.Now())
		}
		if st, _ := r.s.UnitState("unseen"); st == health.FullDisruption {
			t.Fatal("unit unseen held while its kubelets renew their Leases")
		}
	}
	// The site is cut: the Leases stop (stale), the controller loses
	// unseen-1 first.
	for _, n := range names {
		renewLease(t, ctx, env.client, n, time.Now().Add(-time.Minute))
	}
	setReady(t, ctx, env, "unseen-1", corev1.ConditionUnknown)
	// (Protected may decide from the node as the informer has it before
	// the unit's state is recorded: holdsWith.)
	poll.Eventually(t, 10*time.Second, func() error {
		st, hold := r.s.UnitState("unseen")
		if !r.s.Protected("unseen-1") {
			return fmt.Errorf("unseen-1 not protected: unit unseen %s, tally %+v", st, r.s.Tally("unseen-1"))
		}
		if st != health.FullDisruption || hold.IsZero() {
			return fmt.Errorf("unit unseen is %s, hold until %v; want held", st, hold)
		}
		return nil
	})
}

// renewLease sets node's kubelet Lease (40 s, as the kubelet's) renewed
// at at, creating it.
func renewLease(t *testing.T, ctx context.Context, client kubernetes.Interface, node string, at time.Time) {
	t.Helper()
	leases := client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	renew, d := metav1.NewMicroTime(at), int32(40)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := leases.Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			_, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: node},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: &node, LeaseDurationSeconds: &d, RenewTime: &renew}}, metav1.CreateOptions{})
			return err
		}
		l.Spec.RenewTime = &renew
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestReturnedNodeKeepsEndpoints: a node protected while lost comes back
// (its kubelet reports Ready again). The node lifecycle controller marked
// its pods not ready meanwhile, and its kubelet posts their status only
// after the node's: its endpoints stay ready for ReturnGrace, and no
// longer. A node that was lost unprotected gets nothing of it.
func TestReturnedNodeKeepsEndpoints(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	env := startEnv(t, ctx)
	for i := 1; i <= 3; i++ {
		unitNode(t, ctx, env.client, fmt.Sprintf("back-%d", i), "back", corev1.ConditionTrue)
	}
	const grace = 3 * time.Second
	r := startReplicaWith(t, ctx, env.rc, hublink.Of(env.nc, env.js), natstest.Logger(t, slog.LevelWarn), false,
		func(c *health.Config) { c.ReturnGrace = grace })
	poll.Eventually(t, 30*time.Second, func() error {
		if st, known := r.s.UnitStateKnown("back"); st != health.Normal || !known {
			return fmt.Errorf("unit back is %s (known: %v), want %s", st, known, health.Normal)
		}
		return nil
	})
	for _, voter := range []string{"back-2", "back-3"} {
		sent := time.Now()
		publishBallot(t, ctx, env.js, "back", voter, sent, time.Minute, map[string]atollv1.Verdict{"back-1": atollv1.Verdict_VERDICT_HEALTHY})
		poll.Eventually(t, 5*time.Second, func() error {
			if !r.s.LastBallot(voter).After(sent.Add(-time.Second)) {
				return fmt.Errorf("%s's ballot not recorded", voter)
			}
			return nil
		})
	}
	// back-1 lost with its peers' verdict, back-2 without one.
	setReady(t, ctx, env, "back-1", corev1.ConditionUnknown)
	setReady(t, ctx, env, "back-2", corev1.ConditionUnknown)
	poll.Eventually(t, 5*time.Second, func() error {
		if !r.s.Protected("back-1") || !r.s.KeepsEndpoints("back-1") {
			return fmt.Errorf("back-1 not protected: tally %+v", r.s.Tally("back-1"))
		}
		return nil
	})
	if r.s.Protected("back-2") || r.s.KeepsEndpoints("back-2") {
		t.Fatal("back-2 protected without a verdict")
	}
	back := time.Now() // the grace runs from the informer's event, later
	setReady(t, ctx, env, "back-1", corev1.ConditionTrue)
	setReady(t, ctx, env, "back-2", corev1.ConditionTrue)
	poll.Eventually(t, 5*time.Second, func() error {
		if r.s.Protected("back-1") {
			return errors.New("back-1 still lost in the cache")
		}
		return nil
	})
	// The cache holds the node before its informer's handlers see it.
	poll.Eventually(t, time.Second, func() error {
		if !r.s.KeepsEndpoints("back-1") {
			return fmt.Errorf("back-1 back %s ago: its endpoints are not kept", time.Since(back).Round(time.Millisecond))
		}
		return nil
	})
	if r.s.KeepsEndpoints("back-2") {
		t.Error("back-2, lost unprotected, keeps its endpoints once back")
	}
	poll.Eventually(t, grace+5*time.Second, func() error {
		if r.s.KeepsEndpoints("back-1") {
			return errors.New("back-1's endpoints still kept")
		}
		return nil
	})
	if d := time.Since(back); d < grace {
		t.Errorf("back-1's endpoints kept %s, less than the grace %s", d, grace)
	}
}
