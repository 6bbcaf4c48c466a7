package members

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// lastValues returns the stores of s's unit views and node assignments
// on the VIEWS stream (eventbus.LastValue: compared by fingerprint, message
// id <subject>@<fingerprint>@<sequence replaced>, expected last subject
// sequence, Duplicate acks checked, at most maxPutAttempts publishes).
func lastValues(s *Service) (*eventbus.LastValue[*atollv1.UnitView], *eventbus.LastValue[*atollv1.NodeAssignment]) {
	js := func() jetstream.JetStream { return s.js } // set by open, before the first put
	return eventbus.NewLastValue(js, events.StreamViews, eventbus.LastValueOptions[*atollv1.UnitView]{MaxAttempts: maxPutAttempts}),
		eventbus.NewLastValue(js, events.StreamViews, eventbus.LastValueOptions[*atollv1.NodeAssignment]{MaxAttempts: maxPutAttempts})
}

// put makes m the last value stored on subj with lv, unless it already
// is. stamp sets the fingerprint and time fields, which are left out of
// the fingerprint itself. It counts and logs what lv did: conflicts,
// duplicates of lost copies published again, views a resync found
// missing from the stream (repaired) and views published.
func put[T eventbus.Fingerprinted](ctx context.Context, s *Service, lv *eventbus.LastValue[T], subj string, m T, stamp func(fp string)) error {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return fmt.Errorf("members: encode %s: %w", subj, err)
	}
	sum := sha256.Sum256(b)
	fp := hex.EncodeToString(sum[:16])
	stamp(fp)
	res, err := lv.Put(ctx, subj, m)
	if res.Conflicts > 0 {
		// Another replica stored a value, or the hub lost one: lv read
		// what the stream holds and decided again.
		s.metrics.conflicts.Add(float64(res.Conflicts))
		s.log.Debug("stored value changed under the publish; read it again", "subject", subj, "conflicts", res.Conflicts)
	}
	if res.Republished > 0 {
		s.metrics.duplicates.Add(float64(res.Republished))
		s.log.Info("view acknowledged as a duplicate of a copy no longer stored; published it again", "subject", subj, "fingerprint", fp)
	}
	if err != nil || !res.Changed {
		return err
	}
	s.mu.Lock()
	believed, resynced := s.believed[subj]
	s.mu.Unlock()
	if !res.Remembered && resynced && believed.Fingerprint == fp {
		// The service had published this very content, and the stream
		// no longer held it: the resync repaired a lost view.
		s.metrics.repaired.Inc()
		s.log.Info("view missing or different in the stream; republished", "subject", subj, "fingerprint", fp, "stored_fingerprint", res.Replaced.Fingerprint)
	}
	s.log.Debug("view published", "subject", subj, "fingerprint", fp, "replaces_seq", res.Replaced.Seq)
	s.metrics.published.Inc()
	return nil
}

// maxPutAttempts bounds the publishes of one view in one pass; a subject
// that keeps changing under them is retried with the next pass.
const maxPutAttempts = eventbus.DefaultLastValueAttempts
