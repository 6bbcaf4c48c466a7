package grid_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/atoll-edge/atoll/cloud/grid"
	atollmanager "github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestUnitEventsDriveGrids: with the unit events consumed, a Node joining
// a new unit does not by itself reach the grids of the unit label (no
// resync either); the unit's "appeared" event on the hub makes its copy.
// An event that runs ahead of the node cache is retried until the cache
// shows the node.
func TestUnitEventsDriveGrids(t *testing.T) {
	cluster := kubetest.Start(t)
	installCRDs(t, cluster)
	h := natstest.Hub(t)
	nc, err := h.Connect("grid-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := eventbus.EnsureStreams(ctx, js, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	log := natstest.Logger(t, slog.LevelWarn)
	mcfg := atollmanager.DefaultConfig()
	mcfg.LeaderElect = false
	m, err := atollmanager.New(mcfg, cluster.RESTConfig(), log)
	if err != nil {
		t.Fatal(err)
	}
	cfg := grid.DefaultConfig()
	cfg.Resync = 0
	ctrls, err := grid.New(cfg, m, log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctrls.ConsumeUnitEvents(m, hublink.Of(nc, js), eventbus.NewMetrics(nil))
	startCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := m.Start(startCtx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Stop(context.Background()) })
	c, err := client.New(cluster.RESTConfig(), client.Options{Scheme: m.GetScheme()})
	if err != nil {
		t.Fatal(err)
	}
	publish := func(unit string, kind atollv1.UnitEventKind, members ...string) {
		t.Helper()
		subj, err := events.UnitEventSubject(unit)
		if err != nil {
			t.Fatal(err)
		}
		ev := &atollv1.UnitEvent{Unit: unit, Kind: kind, Members: members, UnitLabel: wellknown.LabelUnit}
		if _, err := events.PublishDurable(ctx, js, subj, ev, fmt.Sprintf("%s@%v", subj, members)); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(name string) error {
		var d appsv1.Deployment
		return c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &d)
	}
	if err := c.Create(ctx, node("n1", map[string]string{wellknown.LabelUnit: "a"})); err != nil {
		t.Fatal(err)
	}
	// The grid's creation reconciles it: unit a's copy; the copy's
	// creation reconciles it once more. Then nothing moves.
	before := reconciles(t)
	if err := c.Create(ctx, webGrid("default")); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, func() error { return exists("web-a") })
	poll.Eventually(t, 30*time.Second, func() error {
		if n := reconciles(t) - before; n < 2 {
			return fmt.Errorf("%v reconciles of the grid", n)
		}
		return nil
	})

	// A node of a new unit: the controllers' cache has it, no copy comes.
	if err := c.Create(ctx, node("n2", map[string]string{wellknown.LabelUnit: "b"})); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, func() error {
		return m.GetClient().Get(ctx, client.ObjectKey{Name: "n2"}, &corev1.Node{})
	})
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if err := exists("web-b"); !apierrors.IsNotFound(err) {
			t.Fatalf("web-b without a unit event: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // watching for an unwanted copy, not waiting for a state
	}
	// The unit's event makes it.
	publish("b", atollv1.UnitEventKind_UNIT_EVENT_KIND_APPEARED, "n2")
	poll.Eventually(t, 10*time.Second, func() error { return exists("web-b") })

	// An event ahead of the cache: c's node is created after its event.
	publish("c", atollv1.UnitEventKind_UNIT_EVENT_KIND_APPEARED, "n3")
	if err := c.Create(ctx, node("n3", map[string]string{wellknown.LabelUnit: "c"})); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, func() error { return exists("web-c") })

	// Gone: b's node leaves, the event deletes its copy.
	if err := c.Delete(ctx, node("n2", nil)); err != nil {
		t.Fatal(err)
	}
	publish("b", atollv1.UnitEventKind_UNIT_EVENT_KIND_GONE)
	poll.Eventually(t, 10*time.Second, func() error {
		var d appsv1.Deployment
		err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "web-b"}, &d)
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		case d.DeletionTimestamp != nil:
			return nil
		}
		return errors.New("web-b still there")
	})
}
