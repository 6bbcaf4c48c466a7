package e2e

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/atoll-edge/atoll/cloud/cloudapp"
	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/poll"
	"github.com/atoll-edge/atoll/test/testbed"
)

// noExecuteBound is the longest a protected node may carry the
// unreachable:NoExecute taint while atoll-cloud crashes, restarts or
// loses the apiserver (docs/health.md states it): far below the shortest
// toleration, so the taint manager evicts nothing.
const noExecuteBound = 5 * time.Second

// crashHold outlasts the crash scenarios: a held unit must stay held
// through them.
const crashHold = 5 * time.Minute

// crashMatrix runs atoll-cloud as deployed (test/testbed replicas: the
// binary in processes of its own, production flags) while it protects a
// node cut from the cloud whose peers see it healthy (k1) and a unit cut
// whole, held (k2), and fails it, watching every event and polling
// every 200 ms what clients see of those nodes (observer): no protected
// pod evicted, no endpoint of one not ready, no NoExecute taint carried
// longer than noExecuteBound.
//   - crash: the leader is killed (SIGKILL). With one replica it is
//     restarted 10 s later, as the kubelet restarts a container; with two
//     the other takes over, and the killed one comes back later.
//   - apiserver hang: kube-apiserver is stopped (SIGSTOP) for 20 s while a
//     node of k3 is cut: every replica stays up, one leads again, and the
//     new cut is protected as any other (nothing was lost).
func crashMatrix(t *testing.T, e *env, replicas int) {
	var k1, k2, k3 []string
	t.Run("sites", func(t *testing.T) {
		t.Run("k1", func(t *testing.T) { t.Parallel(); k1 = e.site(t, "k1", 3, true) })
		t.Run("k2", func(t *testing.T) { t.Parallel(); k2 = e.site(t, "k2", 3, true) })
		t.Run("k3", func(t *testing.T) { t.Parallel(); k3 = e.site(t, "k3", 3, true) })
	})
	if t.Failed() {
		return
	}
	ctx := t.Context()
	reps, err := e.bed.StartReplicas(ctx, replicas, func(c *cloudapp.Config) { c.Health.HoldTime = crashHold })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, r := range reps {
				t.Logf("%s log: %s\n%s", r.Name, r.LogPath(), r.LogTail(20))
			}
		}
	})
	leader := waitLeader(t, reps, time.Minute)
	t.Logf("%d replicas of atoll-cloud run; %s leads", len(reps), leader.Name)
	// With the embedded hub the agents lost their leaf links when the
	// hub moved into the replica: a link cut before it is back is never
	// reported (there is no connection to close), and the node's votes
	// count until their TTL. Cut links that are up, as in a real site.
	poll.Eventually(t, 30*time.Second, func() error {
		for _, n := range append(append(append([]string{}, k1...), k2...), k3...) {
			node, err := e.bed.Sites.Node(n)
			if err != nil {
				return err
			}
			if !node.NATS().Status().HubConnected {
				return fmt.Errorf("the leaf link of %s is not up yet", n)
			}
		}
		return nil
	})

	cut := k1[0]
	protected := map[string]string{cut: "k1"}
	for _, n := range append([]string{cut}, k2...) {
		e.partition(t, n)
	}
	for _, n := range k2 {
		protected[n] = "k2"
	}
	for n := range protected {
		e.waitUnknown(t, n)
	}
	holds := map[string]string{}
	poll.Eventually(t, time.Minute, func() error {
		if err := e.verdict(cut, wellknown.VerdictHealthy); err != nil {
			return err
		}
		for _, n := range k2 {
			node, err := e.node(n)
			if err != nil {
				return err
			}
			v := node.Annotations[wellknown.AnnotationHoldUntil]
			if until, err := time.Parse(time.RFC3339, v); err != nil || until.Before(time.Now()) {
				return fmt.Errorf("%s carries no hold in force (%q)", n, v)
			}
			holds[n] = v
		}
		return e.protected(protected)
	})

	t.Run("crash", func(t *testing.T) {
		obs := e.observe(t, protected)
		time.Sleep(3 * time.Second) // steady, as seen
		leader := waitLeader(t, reps, 10*time.Second)
		if err := leader.Kill(); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		t.Logf("killed %s (SIGKILL)", leader.Name)
		if len(reps) == 1 {
			time.Sleep(10 * time.Second)
			if err := leader.Restart(); err != nil {
				t.Fatal(err)
			}
			if err := leader.WaitReady(ctx); err != nil {
				t.Fatal(err)
			}
			next := waitLeader(t, reps, time.Minute)
			t.Logf("%s restarted, ready and leading %s after the kill", next.Name, time.Since(killed).Round(100*time.Millisecond))
		} else {
			next := waitLeader(t, reps, time.Minute)
			t.Logf("%s leads %s after the kill", next.Name, time.Since(killed).Round(100*time.Millisecond))
		}
		time.Sleep(time.Until(killed.Add(3 * toleration)))
		obs.check(t, noExecuteBound)
		for _, n := range k2 {
			if node, err := e.node(n); err != nil || node.Annotations[wellknown.AnnotationHoldUntil] != holds[n] {
				t.Errorf("hold of %s changed across the crash: %v (%v)", n, node.Annotations[wellknown.AnnotationHoldUntil], err)
			}
		}
		if len(reps) > 1 {
			if err := leader.Restart(); err != nil {
				t.Fatal(err)
			}
			if err := leader.WaitReady(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
	if t.Failed() {
		return
	}

	t.Run("apiserver hang", func(t *testing.T) {
		late := k3[0]
		obs := e.observe(t, protected)
		resume, err := e.bed.Cluster.PauseAPIServer()
		if err != nil {
			t.Fatal(err)
		}
		paused := time.Now()
		e.partition(t, late)
		for time.Since(paused) < 20*time.Second {
			for _, r := range reps {
				if !r.Running() {
					_ = resume()
					t.Fatalf("%s exited while the apiserver hung:\n%s", r.Name, r.LogTail(20))
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err := resume(); err != nil {
			t.Fatal(err)
		}
		t.Log("kube-apiserver resumed after 20 s")
		for _, r := range reps {
			if err := r.WaitReady(ctx); err != nil {
				t.Fatal(err)
			}
		}
		next := waitLeader(t, reps, time.Minute)
		lost := 0
		for _, r := range reps {
			n, err := metricValue(t, r, "atoll_manager_leases_lost_total")
			if err != nil {
				t.Fatal(err)
			}
			lost += n
		}
		// The leader's renewal missed its deadline in the hang: its
		// term ended (and it led again after), the process did not.
		if lost == 0 {
			t.Error("no replica counts a term lost to a 20 s apiserver hang (atoll_manager_leases_lost_total)")
		}
		t.Logf("%s leads; terms lost to the hang: %d", next.Name, lost)
		e.waitUnknown(t, late)
		protected[late] = "k3"
		poll.Eventually(t, 30*time.Second, func() error { return e.protected(map[string]string{late: "k3"}) })
		obs.check(t, noExecuteBound)
		holdsFor(t, 2*toleration, func() error { return e.protected(protected) })
	})
}

// protected checks that each node (→ its web pod's namespace) is
// protected as clients see it: no NoExecute taint, its pod not evicted
// and its endpoint ready.
func (e *env) protected(nodes map[string]string) error {
	for n, ns := range nodes {
		node, err := e.node(n)
		if err != nil {
			return err
		}
		if hasTaint(node, corev1.TaintEffectNoExecute) {
			return fmt.Errorf("%s tainted unreachable:NoExecute", n)
		}
		if ev, err := e.evicted(ns, "web-"+n); err != nil || ev {
			return fmt.Errorf("web-%s evicted (%v)", n, err)
		}
		if ok, err := e.endpointReady(ns, "web-"+n); err != nil || !ok {
			return fmt.Errorf("endpoint of web-%s not ready (%v)", n, err)
		}
	}
	return nil
}

// waitLeader waits for exactly one running replica to lead and returns it.
func waitLeader(t *testing.T, reps []*testbed.Replica, within time.Duration) *testbed.Replica {
	t.Helper()
	var leader *testbed.Replica
	poll.Eventually(t, within, func() error {
		leader = nil
		var leading []string
		for _, r := range reps {
			if !r.Running() {
				continue
			}
			n, err := metricValue(t, r, "atoll_manager_leading")
			if err != nil {
				return err
			}
			if n == 1 {
				leader = r
				leading = append(leading, r.Name)
			}
		}
		switch len(leading) {
		case 0:
			return errors.New("no replica leads")
		case 1:
			return nil
		default:
			return fmt.Errorf("%v lead at once", leading)
		}
	})
	return leader
}

// metricValue reads an unlabelled metric of r (0: absent).
func metricValue(t *testing.T, r *testbed.Replica, name string) (int, error) {
	t.Helper()
	m, err := r.Metrics(t.Context())
	if err != nil {
		return 0, fmt.Errorf("%s: %w", r.Name, err)
	}
	for line := range strings.SplitSeq(m, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return int(f), nil
			}
		}
	}
	return 0, nil
}
