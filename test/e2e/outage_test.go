package e2e

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"

	"github.com/atoll-edge/atoll/cloud/cloudapp"
	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/poll"
	"github.com/atoll-edge/atoll/test/testbed"
)

// TestCloudOutage stops atoll-cloud (every replica) for 60 s while it
// protects nodes, then starts it again, on the hub cluster (the shape
// that runs atoll-cloud apart from its hub). Through the outage every
// watch event and every 200 ms poll of the protected nodes' pods and
// endpoints is checked (observer): the pod readiness policy keeps their
// pods, hence their endpoints, ready with no replica answering.
//   - o1: a node cut from the cloud, its peers see it healthy: never
//     evicted, its endpoint ready throughout;
//   - o4: a node cut during the outage (its peers saw it healthy): never
//     evicted, its endpoint ready throughout;
//   - o2: a whole unit cut, held: the hold survives the restart with the
//     same end, nothing is evicted, and it is released when the unit comes
//     back;
//   - o3: a protected node dies during the outage: evicted within the
//     toleration + 15 s after atoll-cloud returns.
func TestCloudOutage(t *testing.T) {
	const (
		outage = time.Minute
		hold   = 3 * time.Minute // outlasts the outage and the checks after it
	)
	e := startShape(t, hubCluster, func(o *testbed.Options) {
		o.Cloud = func(c *cloudapp.Config) { c.Health.HoldTime = hold }
	})
	// Before the bed stops: nothing refused (and what was used counts
	// for TestLeastPrivilege).
	t.Cleanup(func() { e.checkLeastPrivilege(t) })
	var o1, o2, o3, o4 []string
	t.Run("sites", func(t *testing.T) {
		t.Run("o1", func(t *testing.T) { t.Parallel(); o1 = e.site(t, "o1", 3, true) })
		t.Run("o2", func(t *testing.T) { t.Parallel(); o2 = e.site(t, "o2", 3, true) })
		t.Run("o3", func(t *testing.T) { t.Parallel(); o3 = e.site(t, "o3", 3, true) })
		t.Run("o4", func(t *testing.T) { t.Parallel(); o4 = e.site(t, "o4", 3, true) })
	})
	if t.Failed() {
		return
	}
	cut, dying, late := o1[0], o3[0], o4[0]
	for _, n := range append([]string{cut, dying}, o2...) {
		e.partition(t, n)
	}
	for _, n := range append([]string{cut, dying}, o2...) {
		e.waitUnknown(t, n)
	}
	poll.Eventually(t, 20*time.Second, func() error {
		if err := e.verdict(cut, wellknown.VerdictHealthy); err != nil {
			return err
		}
		return e.verdict(dying, wellknown.VerdictHealthy)
	})
	// o2's voters' leaf links are cut: the hub reports it and their
	// ballots stop counting.
	var holdUntil time.Time
	poll.Eventually(t, 45*time.Second, func() error {
		st, until := e.bed.Health.UnitState("o2")
		if st != health.FullDisruption || until.IsZero() {
			return fmt.Errorf("unit o2 is %s", st)
		}
		holdUntil = until
		return nil
	})
	kept := func() error {
		for _, p := range []struct{ ns, node string }{{"o1", cut}, {"o2", o2[0]}, {"o2", o2[1]}, {"o2", o2[2]}, {"o3", dying}, {"o4", late}} {
			n, err := e.node(p.node)
			if err != nil {
				return err
			}
			if hasTaint(n, corev1.TaintEffectNoExecute) {
				return fmt.Errorf("%s tainted unreachable:NoExecute", p.node)
			}
			if ev, err := e.evicted(p.ns, "web-"+p.node); err != nil || ev {
				return fmt.Errorf("web-%s evicted (%v)", p.node, err)
			}
		}
		return nil
	}
	poll.Eventually(t, 10*time.Second, kept)

	ctx := t.Context()
	protected := map[string]string{cut: "o1", late: "o4"}
	for _, n := range o2 {
		protected[n] = "o2"
	}
	obs := e.observe(t, protected)
	if err := e.bed.StopCloud(ctx); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	e.kill(t, dying)
	e.partition(t, late)
	e.waitUnknown(t, late)
	holdsFor(t, time.Until(down.Add(outage)), kept)
	obs.check(t, noExecuteBound)
	if err := e.bed.StartCloud(ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	t.Logf("atoll-cloud was down %s", back.Sub(down).Round(100*time.Millisecond))

	t.Run("nodes protected after the return", func(t *testing.T) {
		poll.Eventually(t, 20*time.Second, func() error {
			for _, p := range []struct{ ns, node string }{{"o1", cut}, {"o4", late}} {
				if ok, err := e.endpointReady(p.ns, "web-"+p.node); err != nil || !ok {
					return fmt.Errorf("endpoint of web-%s not ready (%v)", p.node, err)
				}
				if err := e.verdict(p.node, wellknown.VerdictHealthy); err != nil {
					return err
				}
			}
			return nil
		})
		t.Logf("endpoint ready again %s after atoll-cloud started", time.Since(back).Round(100*time.Millisecond))
	})
	t.Run("hold kept across the restart", func(t *testing.T) {
		poll.Eventually(t, 20*time.Second, func() error {
			st, until := e.bed.Health.UnitState("o2")
			if st != health.FullDisruption || !until.Equal(holdUntil) {
				return fmt.Errorf("unit o2 is %s until %v, want %s until %v", st, until, health.FullDisruption, holdUntil)
			}
			return nil
		})
	})
	t.Run("dead node evicted after the return", func(t *testing.T) {
		evicted := e.waitEvicted(t, "o3", "web-"+dying, toleration+15*time.Second)
		t.Logf("evicted %s after atoll-cloud started", evicted.Sub(back).Round(100*time.Millisecond))
	})
	t.Run("held unit released when it returns", func(t *testing.T) {
		for _, n := range o2 {
			e.heal(t, n)
		}
		poll.Eventually(t, 45*time.Second, func() error {
			if st, until := e.bed.Health.UnitState("o2"); st != health.Normal || !until.IsZero() {
				return fmt.Errorf("unit o2 is %s until %v", st, until)
			}
			for _, n := range o2 {
				node, err := e.node(n)
				if err != nil {
					return err
				}
				if v, ok := node.Annotations[wellknown.AnnotationHoldUntil]; ok {
					return fmt.Errorf("%s still carries %s=%s", n, wellknown.AnnotationHoldUntil, v)
				}
			}
			kv, err := e.bed.HubLink.JetStream().KeyValue(ctx, health.HoldBucket)
			if err != nil {
				return err
			}
			if _, err := kv.Get(ctx, "o2"); !errors.Is(err, jetstream.ErrKeyNotFound) {
				return fmt.Errorf("hold of o2 still recorded (%v)", err)
			}
			return nil
		})
		for _, n := range o2 {
			if ev, err := e.evicted("o2", "web-"+n); err != nil || ev {
				t.Errorf("web-%s evicted (%v)", n, err)
			}
		}
	})
}
