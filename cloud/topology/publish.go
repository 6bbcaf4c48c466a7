package topology

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/events"
)

// stored is what the VIEWS stream holds on one subject: the fingerprint of
// its last message ("" when there is none or it does not decode) and that
// message's stream sequence (0 when there is none).
type stored struct {
	fp  string
	seq uint64
}

// put makes m the last value stored on subj, unless it already is. stamp
// sets the fingerprint and time fields, which are left out of the
// fingerprint itself.
//
// The message id is <subject>@<fingerprint>@<sequence of the value it
// replaces>. Two replicas that publish the same view over the same stored
// value send the same id, so the hub keeps one message; a legitimate
// republish of earlier content (a view that goes A → B → A within the
// duplicate window) replaces a different message, so its id is new and it
// is stored. A content-only id would be dropped as a duplicate of the first
// A, leaving agents on B. An ack that still says Duplicate is checked
// against the stream: if the subject's last value is not this content (it
// was purged, or replaced after the first copy), the view is published
// again under a one-off id.
func (s *Service) put(ctx context.Context, subj string, m proto.Message, stamp func(fp string)) error {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return fmt.Errorf("topology: encode %s: %w", subj, err)
	}
	sum := sha256.Sum256(b)
	fp := hex.EncodeToString(sum[:16])
	s.mu.Lock()
	last, known := s.published[subj]
	s.mu.Unlock()
	if !known {
		if last, err = s.stored(ctx, subj, m); err != nil {
			return err
		}
	}
	if last.fp == fp {
		s.remember(subj, last)
		return nil
	}
	stamp(fp)
	id := subj + "@" + fp + "@" + strconv.FormatUint(last.seq, 10)
	ack, err := events.PublishDurable(ctx, s.js, subj, m, id)
	if err != nil {
		s.forget(subj)
		return err
	}
	if ack.Duplicate {
		now, err := s.stored(ctx, subj, m)
		if err != nil {
			s.forget(subj)
			return err
		}
		if now.fp != fp {
			var nonce [8]byte
			_, _ = rand.Read(nonce[:])
			if ack, err = events.PublishDurable(ctx, s.js, subj, m, id+"@"+hex.EncodeToString(nonce[:])); err != nil {
				s.forget(subj)
				return err
			}
			s.metrics.duplicates.Inc()
			s.log.Info("view was a duplicate of a copy no longer stored; published again", "subject", subj, "fingerprint", fp)
		}
	}
	s.mu.Lock()
	believed, resynced := s.believed[subj]
	s.mu.Unlock()
	if !known && resynced && believed.fp == fp {
		// The service had published this very content, and the stream
		// no longer held it: the resync repaired a lost view.
		s.metrics.repaired.Inc()
		s.log.Info("view missing or different in the stream; republished", "subject", subj, "fingerprint", fp, "stored_fingerprint", last.fp)
	}
	s.log.Debug("view published", "subject", subj, "fingerprint", fp, "replaces_seq", last.seq)
	s.remember(subj, stored{fp: fp, seq: ack.Sequence})
	s.metrics.published.Inc()
	return nil
}

func (s *Service) remember(subj string, st stored) {
	s.mu.Lock()
	s.published[subj] = st
	s.mu.Unlock()
}

// forget drops what is known of subj, so the next put reads the stream.
func (s *Service) forget(subj string) {
	s.mu.Lock()
	delete(s.published, subj)
	s.mu.Unlock()
}

// stored reads the last message the VIEWS stream holds on subj (JetStream
// get-last-message-for-subject). A subject with no message is the zero
// stored; a message that does not decode as like has an empty fingerprint,
// so it is replaced.
func (s *Service) stored(ctx context.Context, subj string, like proto.Message) (stored, error) {
	if s.views == nil { // only the publishing goroutine calls stored
		st, err := s.js.Stream(ctx, events.StreamViews)
		if err != nil {
			return stored{}, fmt.Errorf("topology: stream %s: %w", events.StreamViews, err)
		}
		s.views = st
	}
	raw, err := s.views.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return stored{}, nil
	}
	if err != nil {
		return stored{}, fmt.Errorf("topology: last value of %s: %w", subj, err)
	}
	m := like.ProtoReflect().New().Interface()
	if err := proto.Unmarshal(raw.Data, m); err != nil {
		return stored{seq: raw.Sequence}, nil
	}
	type fingerprinted interface{ GetFingerprint() string }
	if f, ok := m.(fingerprinted); ok {
		return stored{fp: f.GetFingerprint(), seq: raw.Sequence}, nil
	}
	return stored{seq: raw.Sequence}, nil
}
