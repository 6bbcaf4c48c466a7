package grid

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// cacheLagRetry is how soon an event the node cache does not show yet is
// tried again; maxCacheLagTries bounds how often.
const (
	cacheLagRetry    = 500 * time.Millisecond
	maxCacheLagTries = 10
)

// ConsumeUnitEvents makes the unit lifecycle events of cloud/views/members
// (the shared durable consumer events.UnitEventConsumer) drive the grids
// of the unit label: each event enqueues them, and Node events no longer
// do for that key (they still do for other keys). It runs for each term
// this replica leads, like the controllers. Call it before the manager starts.
func (c *Controllers) ConsumeUnitEvents(m *manager.Manager, link *hublink.Link, evm *eventbus.Metrics) {
	c.unitEventsOn.Store(true)
	cl := m.GetClient()
	m.OnTerm(func(ctx context.Context) {
		js := link.JetStream() // connected by the time the manager runs
		err := eventbus.Consume(ctx, js, events.UnitEventConsumer, func(ctx context.Context, ev eventbus.Event[*atollv1.UnitEvent]) error {
			return c.handleUnitEvent(ctx, cl, js, ev)
		}, eventbus.ConsumeOptions{Workers: 2, Logger: c.log, Metrics: evm})
		if err != nil && ctx.Err() == nil {
			c.log.Error("consuming unit events stopped", "err", err)
		}
	})
}

// handleUnitEvent enqueues the grids of the unit label once this
// replica's node cache shows the event's members, and acks. The cache is
// read first: a reconcile enqueued before the cache caught up could run
// on the old nodes, and with the event acked nothing would bring the
// grid back (TestGrids flaked on that). An event ahead of the cache is
// retried; one superseded by a later event of its unit is acked without
// enqueuing (the later one does); after maxCacheLagTries the grids are
// enqueued anyway (the Node events of a cache that lags that long still
// reach the reconciles through the grids' children and the resync).
func (c *Controllers) handleUnitEvent(ctx context.Context, cl client.Reader, js jetstream.JetStream, ev eventbus.Event[*atollv1.UnitEvent]) error {
	e := ev.Msg
	if e.GetUnitLabel() != "" && e.GetUnitLabel() != c.cfg.UnitLabel {
		return eventbus.Reject(fmt.Errorf("unit event of %s for label %q; this cloud groups by %q", e.GetUnit(), e.GetUnitLabel(), c.cfg.UnitLabel))
	}
	var nodes corev1.NodeList
	if err := cl.List(ctx, &nodes, client.MatchingLabels{c.cfg.UnitLabel: e.GetUnit()}); err != nil {
		return fmt.Errorf("list nodes of unit %s: %w", e.GetUnit(), err)
	}
	var have []string
	for _, n := range nodes.Items {
		have = append(have, n.Name)
	}
	slices.Sort(have)
	want := slices.Sorted(slices.Values(e.GetMembers()))
	switch {
	case slices.Equal(have, want):
	case superseded(ctx, js, ev):
		c.log.Info("unit event superseded", "unit", e.GetUnit(), "kind", e.GetKind().String(), "delivered", ev.Delivered)
		c.metrics.unitEvents.WithLabelValues(e.GetKind().String()).Inc()
		return nil
	case ev.Delivered < maxCacheLagTries:
		return eventbus.Retry(fmt.Errorf("unit %s: the node cache shows %v, the event %v", e.GetUnit(), have, want), cacheLagRetry)
	default:
		c.log.Warn("unit event: the node cache still differs; enqueuing the grids anyway", "unit", e.GetUnit(), "cache", have, "event", want)
	}
	n, err := c.enqueueUnitGrids(ctx, cl)
	if err != nil {
		return err
	}
	c.log.Info("unit event", "unit", e.GetUnit(), "kind", e.GetKind().String(), "members", len(want), "grids", n, "delivered", ev.Delivered)
	c.metrics.unitEvents.WithLabelValues(e.GetKind().String()).Inc()
	return nil
}

// superseded reports whether the stream holds a later event of ev's unit.
func superseded(ctx context.Context, js jetstream.JetStream, ev eventbus.Event[*atollv1.UnitEvent]) bool {
	st, err := js.Stream(ctx, events.StreamTopology)
	if err != nil {
		return false
	}
	last, err := st.GetLastMsgForSubject(ctx, ev.Subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return true
	}
	return err == nil && last.Sequence > ev.Sequence
}

// enqueueUnitGrids sends every DeploymentGrid and StatefulSetGrid of the
// unit label to its controller.
func (c *Controllers) enqueueUnitGrids(ctx context.Context, cl client.Reader) (int, error) {
	n := 0
	lists := map[string]client.ObjectList{
		DeploymentGridController:  &appsv1alpha1.DeploymentGridList{},
		StatefulSetGridController: &appsv1alpha1.StatefulSetGridList{},
	}
	for name, list := range lists {
		if err := cl.List(ctx, list); err != nil {
			return n, fmt.Errorf("list grids: %w", err)
		}
		var grids []client.Object
		switch l := list.(type) {
		case *appsv1alpha1.DeploymentGridList:
			for i := range l.Items {
				if keyOr(l.Items[i].Spec.GridUniqKey, c.cfg.UnitLabel) == c.cfg.UnitLabel {
					grids = append(grids, &l.Items[i])
				}
			}
		case *appsv1alpha1.StatefulSetGridList:
			for i := range l.Items {
				if keyOr(l.Items[i].Spec.GridUniqKey, c.cfg.UnitLabel) == c.cfg.UnitLabel {
					grids = append(grids, &l.Items[i])
				}
			}
		}
		for _, g := range grids {
			select {
			case c.units[name] <- event.GenericEvent{Object: g}:
				n++
			case <-ctx.Done():
				return n, ctx.Err()
			}
		}
	}
	return n, nil
}
