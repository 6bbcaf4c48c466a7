package objects

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/objectview"
)

// The layout before the shared view space stored every Service,
// EndpointSlice and Endpoints, and every Node (stripped for other units),
// in every unit's space: (S + N) × U messages. A full pass purges it from
// an existing stream rather than tombstoning each view, which would leave
// as many tombstones: for each current unit, every subject of the kinds
// now shared (one purge per unit and kind, e.g. atoll.view.<unit>.services.>),
// and, for a unit where any was found (the old layout: a real cluster
// always has the kubernetes Service and its Endpoints), its Nodes too
// (atoll.view.<unit>.nodes.>): they held every other unit's Node; the
// pass then publishes the unit's own Nodes in full again. Purging is
// idempotent: a stream in the new layout has nothing to purge, and each
// purge is counted (atoll_objectviews_purged_total) and logged. Edges
// that followed the old layout drop what was purged themselves
// (edge/proxy).

// The layout after it also stored every Node, stripped to its labels, in
// the shared space (N views read by every edge: N × N at a cold start of
// the fleet, and one Node's label change sent to every edge), for the
// edges' topology filter, which now reads the topology the endpoints'
// views carry. The first full pass of a process purges them
// (atoll.view._all.nodes.>). Edges drop the shared Nodes they kept
// (edge/proxy, state layout 2).

// purgeSharedNodes purges the Nodes of the shared space, once per
// process.
func (p *Publisher) purgeSharedNodes(ctx context.Context) error {
	if p.sharedNodesPurged {
		return nil
	}
	if _, err := p.purge(ctx, kindFilter(events.SharedSpace, objectview.KindNodes)); err != nil {
		return err
	}
	p.sharedNodesPurged = true
	return nil
}

// sharedKinds are the kinds stored in the shared space only.
var sharedKinds = []string{objectview.KindServices, objectview.KindEndpointSlices, objectview.KindEndpoints}

// purgeOldLayout purges the views of the old layout from the spaces of
// units not checked yet (once per unit and process), forgetting what the
// LastValue remembers of them.
func (p *Publisher) purgeOldLayout(ctx context.Context, units []string) error {
	var errs []error
	for _, u := range units {
		if p.checked[u] {
			continue
		}
		// Nodes first: a failure leaves the shared kinds, so the next
		// pass finds the old layout again.
		old, err := p.oldLayout(ctx, u)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		failed := false
		if old {
			for _, kind := range append([]string{objectview.KindNodes}, sharedKinds...) {
				if _, err := p.purge(ctx, kindFilter(u, kind)); err != nil {
					errs, failed = append(errs, err), true
					break
				}
			}
		}
		p.checked[u] = !failed
	}
	return errors.Join(errs...)
}

// oldLayout tells whether the space of unit holds views of a shared kind.
func (p *Publisher) oldLayout(ctx context.Context, unit string) (bool, error) {
	for _, kind := range sharedKinds {
		subjects, err := p.subjects(ctx, kindFilter(unit, kind))
		if err != nil {
			return false, err
		}
		if len(subjects) > 0 {
			return true, nil
		}
	}
	return false, nil
}

// purge removes every message on the subjects matching filter, if there
// are any, and returns how many subjects held them.
func (p *Publisher) purge(ctx context.Context, filter string) (int, error) {
	subjects, err := p.subjects(ctx, filter)
	if err != nil || len(subjects) == 0 {
		return 0, err
	}
	if err := p.stream.Purge(ctx, jetstream.WithPurgeSubject(filter)); err != nil {
		return 0, fmt.Errorf("objects: purge %s: %w", filter, err)
	}
	for _, s := range subjects {
		p.views.Forget(s)
	}
	p.metrics.purged.Add(float64(len(subjects)))
	p.log.Info("purged views of an old layout", "filter", filter, "subjects", len(subjects), "shared", events.SharedSpaceSubjects())
	return len(subjects), nil
}
