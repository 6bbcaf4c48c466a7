package members

// Unit lifecycle events for the grid controllers. Kept apart from the
// views: every pass (full or incremental) calls publishUnitEvents with the
// units and their members it computed.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// unitEvents is what the TOPOLOGY stream holds of each unit's lifecycle,
// as last read or written. Only the publishing goroutine uses it.
type unitEvents struct {
	stream    jetstream.Stream
	last      map[string]unitStored // by unit
	published prometheus.Counter
}

// unitStored is a unit's last stored event: its members (nil when gone or
// never seen) and stream sequence (0: none).
type unitStored struct {
	members []string
	seq     uint64
}

// UnitEventCollectors returns the metrics of the unit events
// (atoll_members_unit_events_published_total), to register.
func (s *Service) UnitEventCollectors() []prometheus.Collector {
	return []prometheus.Collector{s.unitEventState().published}
}

// unitEventState returns the unit events' state, made on first use.
func (s *Service) unitEventState() *unitEvents {
	s.unitEventsOnce.Do(func() {
		s.unitEvents = &unitEvents{
			published: prometheus.NewCounter(prometheus.CounterOpts{
				Namespace: "atoll", Subsystem: "members", Name: "unit_events_published_total",
				Help: "Unit lifecycle events (appeared, members changed, gone) stored on the hub by this process.",
			}),
		}
	})
	return s.unitEvents
}

// publishUnitEvents stores an event for every unit whose member set
// differs from the last event the stream holds for it: appeared (first
// members), members changed, or gone (none left). units are the units of
// this pass (with or without members), members their sorted member names;
// all says the pass saw every unit, so a unit with a stored event but not
// in units is gone (an incremental pass compares only its own units).
// The stream is the only state: every replica compares with it and
// publishes expecting the subject's last sequence, so replicas store each
// change once, and a restarted replica publishes nothing already there.
func (s *Service) publishUnitEvents(ctx context.Context, units map[string]bool, members map[string][]string, all bool) error {
	ue := s.unitEventState()
	if ue.stream == nil {
		st, err := s.js.Stream(ctx, events.StreamTopology)
		if err != nil {
			return fmt.Errorf("%w: members: stream %s: %w", errRetry, events.StreamTopology, err)
		}
		// Units with a stored event but no view any more (gone while no
		// replica ran) are compared too.
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(events.UnitEventFamily.Wildcard()))
		if err != nil {
			return fmt.Errorf("%w: members: stream %s: %w", errRetry, events.StreamTopology, err)
		}
		ue.stream, ue.last = st, map[string]unitStored{}
		for subj := range info.State.Subjects {
			if unit, err := events.ParseUnitEventSubject(subj); err == nil {
				if _, err := ue.read(ctx, unit); err != nil {
					ue.stream = nil
					return fmt.Errorf("%w: %w", errRetry, err)
				}
			}
		}
	}
	compare := maps.Clone(units)
	if all {
		for u := range ue.last {
			compare[u] = true
		}
	}
	var errs []error
	for _, unit := range slices.Sorted(maps.Keys(compare)) {
		if err := s.putUnitEvent(ctx, unit, members[unit]); err != nil {
			s.log.Warn("unit event not published; retrying", "unit", unit, "err", err)
			errs = append(errs, fmt.Errorf("%w: %w", errRetry, err))
		}
	}
	return errors.Join(errs...)
}

// read loads unit's last stored event.
func (ue *unitEvents) read(ctx context.Context, unit string) (unitStored, error) {
	subj, err := events.UnitEventSubject(unit)
	if err != nil {
		return unitStored{}, err
	}
	raw, err := ue.stream.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		ue.last[unit] = unitStored{}
		return unitStored{}, nil
	}
	if err != nil {
		return unitStored{}, fmt.Errorf("members: last unit event of %s: %w", unit, err)
	}
	var ev atollv1.UnitEvent
	st := unitStored{seq: raw.Sequence}
	if proto.Unmarshal(raw.Data, &ev) == nil && len(ev.GetMembers()) > 0 {
		st.members = ev.GetMembers()
	}
	ue.last[unit] = st
	return st, nil
}

// putUnitEvent makes the stream's last event of unit describe members.
func (s *Service) putUnitEvent(ctx context.Context, unit string, members []string) error {
	ue := s.unitEvents
	subj, err := events.UnitEventSubject(unit)
	if err != nil {
		return err
	}
	nonce := ""
	for attempt := 1; attempt <= maxPutAttempts; attempt++ {
		last, ok := ue.last[unit]
		if !ok {
			if last, err = ue.read(ctx, unit); err != nil {
				return err
			}
		}
		if slices.Equal(last.members, members) || len(last.members) == 0 && len(members) == 0 {
			return nil
		}
		kind := atollv1.UnitEventKind_UNIT_EVENT_KIND_MEMBERS_CHANGED
		switch {
		case len(last.members) == 0:
			kind = atollv1.UnitEventKind_UNIT_EVENT_KIND_APPEARED
		case len(members) == 0:
			kind = atollv1.UnitEventKind_UNIT_EVENT_KIND_GONE
		}
		sum := sha256.Sum256([]byte(unit + "\n" + s.cfg.Units.Label + "\n" + strings.Join(members, ",")))
		fp := hex.EncodeToString(sum[:16])
		ev := &atollv1.UnitEvent{Unit: unit, Kind: kind, Members: members, UnitLabel: s.cfg.Units.Label, Fingerprint: fp, Time: timestamppb.Now()}
		id := subj + "@" + fp + "@" + strconv.FormatUint(last.seq, 10) + nonce
		ack, err := events.PublishDurable(ctx, s.js, subj, ev, id, jetstream.WithExpectLastSequencePerSubject(last.seq))
		switch {
		case eventbus.IsWrongLastSequence(err):
			// Another replica stored an event: read it and decide again.
			delete(ue.last, unit)
			continue
		case err != nil:
			delete(ue.last, unit)
			return fmt.Errorf("members: publish unit event of %s: %w", unit, err)
		case ack.Duplicate:
			// The id matched a copy stored before: read what the stream
			// holds; if it is not this content, publish with a new id.
			prev := last.seq
			now, err := ue.read(ctx, unit)
			if err != nil {
				return err
			}
			if !slices.Equal(now.members, members) && now.seq == prev {
				var raw [8]byte
				_, _ = rand.Read(raw[:])
				nonce = "@" + hex.EncodeToString(raw[:])
			}
			continue
		}
		ue.last[unit] = unitStored{members: slices.Clone(members), seq: ack.Sequence}
		ue.published.Inc()
		s.log.Info("unit event published", "unit", unit, "kind", kind.String(), "members", len(members))
		return nil
	}
	delete(ue.last, unit)
	return fmt.Errorf("members: unit event of %s: the stored event kept changing under %d attempts", unit, maxPutAttempts)
}
