package topology

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/events"
)

// stored is what the VIEWS stream holds on one subject: the fingerprint of
// its last message ("" when there is none or it does not decode), that
// message's stream sequence (0 when there is none) and when it was stored.
type stored struct {
	fp  string
	seq uint64
	at  time.Time
}

// put makes m the last value stored on subj, unless it already is. stamp
// sets the fingerprint and time fields, which are left out of the
// fingerprint itself.
//
// A view is never lost, whatever the other replicas, the hub or the
// duplicate window do:
//
//   - The publish expects the subject's last sequence to be the one the
//     service read (Nats-Expected-Last-Subject-Sequence): a value stored
//     meanwhile by another replica, or lost by the hub, fails it with a
//     wrong-last-sequence error, and put reads the stream again.
//   - The message id is <subject>@<fingerprint>@<sequence it replaces>, so
//     replicas making the same change collapse into one message, and a
//     view that goes A → B → A stores A again (it replaces B, not nothing).
//   - A Duplicate ack is checked against the stream: when the subject's
//     last value is not this content (the id matched an earlier copy that
//     was since replaced or purged), put reads the stream again, and when
//     the id would collide again it adds a one-off token.
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
	cached := known
	nonce := ""
	for attempt := 1; ; attempt++ {
		if !known {
			if last, err = s.stored(ctx, subj, m); err != nil {
				return err
			}
		}
		if last.fp == fp {
			s.remember(subj, last)
			return nil
		}
		if attempt > maxPutAttempts {
			s.forget(subj)
			return fmt.Errorf("topology: %s: the stored value kept changing under %d attempts", subj, maxPutAttempts)
		}
		stamp(fp)
		id := subj + "@" + fp + "@" + strconv.FormatUint(last.seq, 10) + nonce
		ack, err := events.PublishDurable(ctx, s.js, subj, m, id, jetstream.WithExpectLastSequencePerSubject(last.seq))
		if isWrongLastSequence(err) {
			// Another replica stored a value, or the hub lost one: read
			// what the stream holds and decide again.
			s.metrics.conflicts.Inc()
			s.log.Debug("stored value changed under the publish; reading it again", "subject", subj, "expected_seq", last.seq)
			known = false
			continue
		}
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
				// The id matched an earlier copy that is no longer the
				// subject's value: nothing was stored.
				s.metrics.duplicates.Inc()
				s.log.Info("view acknowledged as a duplicate of a copy no longer stored; publishing it again", "subject", subj, "fingerprint", fp, "stored_fingerprint", now.fp)
				if now.seq == last.seq {
					var raw [8]byte
					_, _ = rand.Read(raw[:])
					nonce = "@" + hex.EncodeToString(raw[:])
				}
				last, known = now, true
				continue
			}
			ack.Sequence = now.seq
		}
		s.mu.Lock()
		believed, resynced := s.believed[subj]
		s.mu.Unlock()
		if !cached && resynced && believed.fp == fp {
			// The service had published this very content, and the stream
			// no longer held it: the resync repaired a lost view.
			s.metrics.repaired.Inc()
			s.log.Info("view missing or different in the stream; republished", "subject", subj, "fingerprint", fp, "stored_fingerprint", last.fp)
		}
		s.log.Debug("view published", "subject", subj, "fingerprint", fp, "replaces_seq", last.seq)
		s.remember(subj, stored{fp: fp, seq: ack.Sequence, at: time.Now()})
		s.metrics.published.Inc()
		return nil
	}
}

// maxPutAttempts bounds the publishes of one view in one pass; a subject
// that keeps changing under them is retried with the next pass.
const maxPutAttempts = 5

// isWrongLastSequence reports whether err is JetStream's answer to a
// publish whose expected last subject sequence was not the subject's.
func isWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
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
		return stored{seq: raw.Sequence, at: raw.Time}, nil
	}
	type fingerprinted interface{ GetFingerprint() string }
	if f, ok := m.(fingerprinted); ok {
		return stored{fp: f.GetFingerprint(), seq: raw.Sequence, at: raw.Time}, nil
	}
	return stored{seq: raw.Sequence, at: raw.Time}, nil
}
