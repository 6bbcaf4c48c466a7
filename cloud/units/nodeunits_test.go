package units_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	atollmanager "github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/cloud/units"
	"github.com/atoll-edge/atoll/internal/wellknown"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
	"github.com/atoll-edge/atoll/test/crds"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestNodeUnits: a unit's first node makes its NodeUnit, members and
// counts follow the nodes, the disruption state follows the health
// service's changes (without a Node event, and with no write when a
// change notice brings nothing new or the states are not known yet), a
// label set by hand stays, the last
// node's departure deletes it; and a NodeUnit nobody manages is never
// deleted.
func TestNodeUnits(t *testing.T) {
	cluster := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := crds.Install(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	log := natstest.Logger(t, slog.LevelWarn)
	mcfg := atollmanager.DefaultConfig()
	mcfg.LeaderElect = false
	m, err := atollmanager.New(mcfg, cluster.RESTConfig(), log)
	if err != nil {
		t.Fatal(err)
	}
	states := &changingStates{state: map[string]string{}, asked: map[string]int{}}
	reg := prometheus.NewRegistry()
	if err := units.SetupNodeUnits(m, units.DefaultRule(), states, log, reg); err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Stop(context.Background()) })
	c, err := client.New(cluster.RESTConfig(), client.Options{Scheme: m.GetScheme()})
	if err != nil {
		t.Fatal(err)
	}
	mkNode := func(name, unit string, ready corev1.ConditionStatus) {
		t.Helper()
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{wellknown.LabelUnit: unit}}}
		if err := c.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}
		if err := c.Status().Update(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	disruption := "Normal"
	unit := func(name string, members []string, ready, notReady int32) func() error {
		return func() error {
			var nu appsv1alpha1.NodeUnit
			if err := c.Get(ctx, client.ObjectKey{Name: name}, &nu); err != nil {
				return err
			}
			if !slices.Equal(nu.Status.Members, members) || nu.Status.ReadyNodes != ready || nu.Status.NotReadyNodes != notReady || nu.Status.Disruption != disruption || nu.Spec.UnitLabel != wellknown.LabelUnit {
				return fmt.Errorf("NodeUnit %s: %+v %+v", name, nu.Spec, nu.Status)
			}
			return nil
		}
	}
	mkNode("a-1", "a", corev1.ConditionTrue)
	poll.Eventually(t, 20*time.Second, unit("a", []string{"a-1"}, 1, 0))
	mkNode("a-2", "a", corev1.ConditionFalse)
	poll.Eventually(t, 20*time.Second, unit("a", []string{"a-1", "a-2"}, 1, 1))

	// The health service's state changes, no Node does: the NodeUnit
	// follows.
	disruption = "PartialDisruption"
	states.set("a", disruption)
	poll.Eventually(t, 20*time.Second, unit("a", []string{"a-1", "a-2"}, 1, 1))
	// A change notice that brings nothing new writes nothing, nor does
	// one while the states are not known (as after a restart of the
	// health service): the NodeUnit keeps its state.
	notice := func(unknown bool) {
		states.mu.Lock()
		states.unknown = unknown
		states.mu.Unlock()
		asked := states.askedFor("a")
		states.notify("a")
		poll.Eventually(t, 20*time.Second, func() error {
			if states.askedFor("a") == asked {
				return errors.New("the notice has not been reconciled yet")
			}
			return nil
		})
	}
	// Two notices first: the unit's reconciles run one at a time, so once
	// the second is asked for, the first and every earlier reconcile (of
	// the state change above, or of a Node event from a cache a moment
	// behind) have finished writing.
	notice(false)
	notice(false)
	writes := nodeUnitWrites(t, reg)
	for i := range 4 {
		notice(i == 3)
	}
	if w := nodeUnitWrites(t, reg); w != writes {
		t.Errorf("%v NodeUnit writes after change notices without a change", w-writes)
	}
	if err := unit("a", []string{"a-1", "a-2"}, 1, 1)(); err != nil {
		t.Error(err)
	}
	states.mu.Lock()
	states.unknown = false
	states.mu.Unlock()

	// One transition, one write: a Node turns Ready, and the disruption
	// state the health service derives from it follows a moment later.
	writes = nodeUnitWrites(t, reg)
	var a2 corev1.Node
	if err := c.Get(ctx, client.ObjectKey{Name: "a-2"}, &a2); err != nil {
		t.Fatal(err)
	}
	a2.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	if err := c.Status().Update(ctx, &a2); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	disruption = "Normal"
	states.set("a", disruption)
	poll.Eventually(t, 20*time.Second, unit("a", []string{"a-1", "a-2"}, 2, 0))
	notice(false)
	notice(false)
	if w := nodeUnitWrites(t, reg); w != writes+1 {
		t.Errorf("%v NodeUnit writes for a Node turning Ready and its unit's state following, want 1", w-writes)
	}

	// A label set by hand stays (for unitSelector).
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"labels":{"tier":"gold"}}}`))
	if err := c.Patch(ctx, &appsv1alpha1.NodeUnit{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, patch); err != nil {
		t.Fatal(err)
	}
	mkNode("a-3", "a", corev1.ConditionTrue)
	poll.Eventually(t, 20*time.Second, unit("a", []string{"a-1", "a-2", "a-3"}, 3, 0))
	var nu appsv1alpha1.NodeUnit
	if err := c.Get(ctx, client.ObjectKey{Name: "a"}, &nu); err != nil || nu.Labels["tier"] != "gold" {
		t.Fatalf("hand label lost: %v %v", nu.Labels, err)
	}

	// A NodeUnit atoll-cloud does not manage stays without nodes.
	if err := c.Create(ctx, &appsv1alpha1.NodeUnit{ObjectMeta: metav1.ObjectMeta{Name: "mine"}, Spec: appsv1alpha1.NodeUnitSpec{UnitLabel: "other"}}); err != nil {
		t.Fatal(err)
	}

	// The last nodes go: the NodeUnit goes.
	for _, n := range []string{"a-1", "a-2", "a-3"} {
		if err := c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	poll.Eventually(t, 20*time.Second, func() error {
		err := c.Get(ctx, client.ObjectKey{Name: "a"}, &appsv1alpha1.NodeUnit{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return errors.New("NodeUnit a still there")
	})
	if err := c.Get(ctx, client.ObjectKey{Name: "mine"}, &appsv1alpha1.NodeUnit{}); err != nil {
		t.Errorf("the unmanaged NodeUnit: %v", err)
	}
}

// changingStates is a health service whose unit states the test sets.
type changingStates struct {
	mu    sync.Mutex
	state map[string]string
	asked map[string]int
	fns   []func(string)
	// unknown: the states are not computed yet (a restarted health
	// service).
	unknown bool
}

func (s *changingStates) UnitDisruption(unit string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked[unit]++
	if s.unknown {
		return "", false
	}
	if st := s.state[unit]; st != "" {
		return st, true
	}
	return "Normal", true
}

func (s *changingStates) OnChange(fn func(string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fns = append(s.fns, fn)
}

func (s *changingStates) set(unit, state string) {
	s.mu.Lock()
	s.state[unit] = state
	s.mu.Unlock()
	s.notify(unit)
}

func (s *changingStates) notify(unit string) {
	s.mu.Lock()
	fns := slices.Clone(s.fns)
	s.mu.Unlock()
	for _, fn := range fns {
		fn(unit)
	}
}

func (s *changingStates) askedFor(unit string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asked[unit]
}

// nodeUnitWrites reads atoll_units_nodeunit_writes_total from reg.
func nodeUnitWrites(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "atoll_units_nodeunit_writes_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no atoll_units_nodeunit_writes_total")
	return 0
}
