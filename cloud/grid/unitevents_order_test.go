package grid

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/wellknown"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
)

// TestUnitEventEnqueuesAfterTheCache: a unit event enqueues the grids of
// the unit label only once the node cache shows its members, never
// before (a reconcile run on the old cache, with the event then acked,
// would leave the grid without the unit's copy: the flake TestGrids
// had); a superseded event is acked without enqueuing; one still ahead
// of the cache after maxCacheLagTries enqueues anyway; another unit
// label's event is rejected, naming the label.
func TestUnitEventEnqueuesAfterTheCache(t *testing.T) {
	ctx := t.Context()
	h := natstest.Hub(t)
	nc, err := h.Connect("grid-order-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	if err := eventbus.EnsureStreams(ctx, js, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := appsv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	grid := &appsv1alpha1.DeploymentGrid{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"}}
	other := &appsv1alpha1.DeploymentGrid{ObjectMeta: metav1.ObjectMeta{Name: "zoned", Namespace: "default"},
		Spec: appsv1alpha1.DeploymentGridSpec{GridPlacement: appsv1alpha1.GridPlacement{GridUniqKey: "zone"}}}
	cl := fake.NewClientBuilder().WithScheme(scheme).WithObjects(grid, other).Build()
	met, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &Controllers{cfg: DefaultConfig(), log: slog.New(slog.DiscardHandler), metrics: met,
		units: map[string]chan event.GenericEvent{
			DeploymentGridController:  make(chan event.GenericEvent, 16),
			StatefulSetGridController: make(chan event.GenericEvent, 16),
		}}
	queued := func() []string {
		var out []string
		for {
			select {
			case e := <-c.units[DeploymentGridController]:
				out = append(out, e.Object.GetName())
			default:
				return out
			}
		}
	}
	publish := func(unit string, members ...string) eventbus.Event[*atollv1.UnitEvent] {
		t.Helper()
		subj, err := events.UnitEventSubject(unit)
		if err != nil {
			t.Fatal(err)
		}
		ev := &atollv1.UnitEvent{Unit: unit, Kind: atollv1.UnitEventKind_UNIT_EVENT_KIND_APPEARED, Members: members, UnitLabel: wellknown.LabelUnit}
		ack, err := events.PublishDurable(ctx, js, subj, ev, fmt.Sprintf("%s@%v", subj, members))
		if err != nil {
			t.Fatal(err)
		}
		return eventbus.Event[*atollv1.UnitEvent]{Subject: subj, Msg: ev, Sequence: ack.Sequence, Delivered: 1}
	}
	addNode := func(name, unit string) {
		t.Helper()
		if err := cl.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{wellknown.LabelUnit: unit}}}); err != nil {
			t.Fatal(err)
		}
	}

	// Ahead of the cache: retried, nothing enqueued.
	ev := publish("d", "d-1")
	if err := c.handleUnitEvent(ctx, cl, js, ev); err == nil {
		t.Fatal("an event ahead of the cache was acked")
	}
	if q := queued(); len(q) != 0 {
		t.Fatalf("grids enqueued before the cache shows the event's members: %v", q)
	}
	// The cache caught up: the grid of the unit label is enqueued (not
	// the one of another key), and the event acked.
	addNode("d-1", "d")
	ev.Delivered++
	if err := c.handleUnitEvent(ctx, cl, js, ev); err != nil {
		t.Fatal(err)
	}
	if q := queued(); len(q) != 1 || q[0] != "web" {
		t.Fatalf("enqueued %v, want [web]", q)
	}

	// Superseded: a later event of the unit is in the stream.
	old := publish("e", "e-1")
	publish("e", "e-1", "e-2")
	if err := c.handleUnitEvent(ctx, cl, js, old); err != nil {
		t.Fatalf("a superseded event: %v", err)
	}
	if q := queued(); len(q) != 0 {
		t.Fatalf("a superseded event enqueued %v", q)
	}

	// Still ahead after the last try: enqueued anyway.
	late := publish("f", "f-1")
	late.Delivered = maxCacheLagTries
	if err := c.handleUnitEvent(ctx, cl, js, late); err != nil {
		t.Fatal(err)
	}
	if q := queued(); len(q) != 1 {
		t.Fatalf("the last try enqueued %v", q)
	}

	// Another unit label: rejected, naming it.
	foreign := publish("g", "g-1")
	foreign.Msg.UnitLabel = "zone"
	if err := c.handleUnitEvent(ctx, cl, js, foreign); err == nil || !strings.Contains(err.Error(), `"zone"`) {
		t.Fatalf("another label's event: %v", err)
	}
}
