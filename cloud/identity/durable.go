package identity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// markDirty asks keepDurable to save the snapshot again (no-op without a
// Durable, or with a request pending).
func (s *Service) markDirty() {
	if s.dirty == nil {
		return
	}
	select {
	case s.dirty <- struct{}{}:
	default:
	}
}

// durableSettle gathers the changes of a burst (a revocation writes the
// list, then the record) into one save; durableRetry spaces failed saves.
const (
	durableSettle = 500 * time.Millisecond
	durableRetry  = 5 * time.Second
)

// keepDurable saves the snapshot after each change of the registry until
// ctx ends; Save writes nothing when it is unchanged.
func (s *Service) keepDurable(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.dirty:
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(durableSettle):
		}
		sctx, cancel := context.WithTimeout(ctx, gateTimeout)
		err := s.saveDurable(sctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			s.log.Warn("identity registry: cannot keep revocations outside the hub; retrying", "in", durableRetry, "err", err)
			time.AfterFunc(durableRetry, s.markDirty)
		}
	}
}

// snapshot is the durable part of the registry as this replica holds it.
func (s *Service) snapshot(ctx context.Context) (Snapshot, error) {
	list, _, err := s.revoker.registered(ctx)
	if err != nil {
		return Snapshot{}, err
	}
	s.mu.RLock()
	var recs []Record
	for _, r := range s.nodes {
		if r.Revoked || r.Suspended {
			recs = append(recs, r)
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(recs, func(a, b Record) int { return strings.Compare(a.Node, b.Node) })
	if len(list) == 0 {
		list = nil
	}
	return Snapshot{Revocations: list, Records: recs}, nil
}

func (s *Service) saveDurable(ctx context.Context) error {
	snap, err := s.snapshot(ctx)
	if err != nil {
		return err
	}
	return s.durable.Save(ctx, snap)
}

// restoreDurable puts the snapshot back into a registry that lost it:
// the records of revoked and suspended nodes it does not hold, and, when
// it holds no revocation list, the resolver's joined with the snapshot's
// (pushed to the resolver before the service answers). A registry that
// holds a list is the truth: the snapshot was saved from it. It retries
// until ctx ends (the apiserver may be starting too).
func (s *Service) restoreDurable(ctx context.Context) error {
	var snap Snapshot
	delay := 250 * time.Millisecond
	for {
		var err error
		if snap, err = s.durable.Load(ctx); err == nil {
			break
		}
		if errors.Is(err, ErrCorruptSnapshot) {
			return err
		}
		s.log.Warn("identity registry: cannot read the revocations kept outside the hub; retrying", "in", delay, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("identity: restore the registry: %w", err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
	restored := 0
	for _, r := range snap.Records {
		if _, ok := s.Record(r.Node); ok || (!r.Revoked && !r.Suspended) {
			continue
		}
		data, err := json.Marshal(r)
		if err != nil {
			return err
		}
		if _, err := s.kv.Create(ctx, nodeKey(r.Node), data); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("identity: restore the record of %s: %w", r.Node, err)
		}
		s.set(r.Node, r, true)
		restored++
	}
	revocations := 0
	if _, err := s.kv.Get(ctx, revocationsKey); errors.Is(err, jetstream.ErrKeyNotFound) && len(snap.Revocations) > 0 {
		list, _, err := s.revoker.registered(ctx) // the resolver's
		if err != nil {
			return fmt.Errorf("identity: restore the revocations: %w", err)
		}
		for k, at := range snap.Revocations {
			list[k] = max(list[k], at)
		}
		data, err := json.Marshal(list)
		if err != nil {
			return err
		}
		if _, err := s.kv.Create(ctx, revocationsKey, data); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return fmt.Errorf("identity: restore the revocations: %w", err)
		}
		revocations = len(list)
	} else if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("identity: read the revocations: %w", err)
	}
	if restored == 0 && revocations == 0 {
		return nil
	}
	if err := s.revoker.Sync(ctx); err != nil {
		return fmt.Errorf("identity: push the restored revocations: %w", err)
	}
	s.log.Warn("identity registry restored from outside the hub (was the hub's store lost?)",
		"revocations", revocations, "records", restored, "nodes", slices.Sorted(maps.Keys(recordNodes(snap.Records))))
	return nil
}

func recordNodes(rs []Record) map[string]bool {
	out := make(map[string]bool, len(rs))
	for _, r := range rs {
		out[r.Node] = true
	}
	return out
}
