package voter

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atoll-edge/atoll/events"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// sender sends the voter's ballots to the hub's HEALTH stream, one at a
// time, and retries each until the stream acknowledges it:
//
//   - at most one ballot waits: a newer ballot replaces a waiting or
//     failing one (it carries every verdict, so nothing is lost), and what
//     waits is one message however long the link is down;
//   - a ballot not acknowledged within AckTimeout (no link, no stream
//     answering) is sent again after a backoff that doubles from
//     RetryMin up to RetryMax, until acknowledged or replaced;
//   - a retried ballot keeps its Nats-Msg-Id, so one that was stored but
//     whose acknowledgement was lost is not stored twice.
type sender struct {
	cfg     Config
	js      jetstream.JetStream
	log     *slog.Logger
	metrics *metrics
	now     func() time.Time

	mu      sync.Mutex
	waiting *outBallot // the newest ballot not yet acknowledged
	wake    chan struct{}
	acked   time.Time // when the last acknowledged ballot was made
}

type outBallot struct {
	ballot *atollv1.Ballot
	msg    *nats.Msg
	made   time.Time
	tries  int
}

// newSender publishes over nc: a message on the ballot's subject, which
// the hub's stream captures through the leaf link (no JetStream domain).
func newSender(cfg Config, nc *nats.Conn, log *slog.Logger, m *metrics, now func() time.Time) (*sender, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("voter: jetstream: %w", err)
	}
	return &sender{cfg: cfg, js: js, log: log, metrics: m, now: now, wake: make(chan struct{}, 1)}, nil
}

// put queues b (made at made) for sending, replacing any ballot still
// waiting.
func (s *sender) put(b *atollv1.Ballot, made time.Time) error {
	subj, err := events.BallotSubject(b.GetUnit(), b.GetVoter())
	if err != nil {
		return err
	}
	if err := events.CheckIdentity(subj, b); err != nil {
		return fmt.Errorf("ballot: %w", err)
	}
	msg, err := events.NewMsg(subj, b, ballotID(b.GetVoter(), made))
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.waiting != nil {
		s.metrics.sendFailures.WithLabelValues(reasonSuperseded).Inc()
	}
	s.waiting = &outBallot{ballot: b, msg: msg, made: made}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return nil
}

// ballotID is the Nats-Msg-Id of voter's ballot made at made.
func ballotID(voter string, made time.Time) string {
	return voter + "@" + fmt.Sprintf("%x", made.UnixNano())
}

// run sends until ctx is done.
func (s *sender) run(ctx context.Context) {
	backoff := s.cfg.RetryMin
	for {
		s.mu.Lock()
		b := s.waiting
		if b != nil {
			b.tries++
		}
		s.mu.Unlock()
		if b == nil {
			select {
			case <-ctx.Done():
				return
			case <-s.wake:
				continue
			}
		}
		pctx, cancel := context.WithTimeout(ctx, s.cfg.AckTimeout)
		_, err := s.js.PublishMsg(pctx, b.msg)
		cancel()
		if err == nil {
			s.mu.Lock()
			if s.waiting == b {
				s.waiting = nil
			}
			if b.made.After(s.acked) {
				s.acked = b.made
			}
			s.mu.Unlock()
			kind := "change"
			if b.ballot.GetKeepalive() {
				kind = "keepalive"
			}
			s.metrics.published.WithLabelValues(kind).Inc()
			backoff = s.cfg.RetryMin
			continue
		}
		if ctx.Err() != nil {
			return
		}
		s.metrics.sendFailures.WithLabelValues(reasonRetried).Inc()
		s.log.Debug("ballot not stored; retrying", "try", b.tries, "backoff", backoff, "err", err)
		if b.tries == 3 {
			s.log.Warn("ballot not stored after 3 tries; retrying until it is", "made", b.made, "err", err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-s.wake: // a newer ballot: send it now
			t.Stop()
		}
		backoff = min(2*backoff, s.cfg.RetryMax)
	}
}

// waitingSince reports whether a ballot waits to be stored, and when it
// was made.
func (s *sender) waitingSince() (bool, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiting == nil {
		return false, time.Time{}
	}
	return true, s.waiting.made
}

// pending reports whether a ballot waits to be acknowledged, and when the
// last acknowledged one was made.
func (s *sender) pending() (waiting bool, acked time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waiting != nil, s.acked
}
