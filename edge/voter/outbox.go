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

// outbox sends votes to the hub's HEALTH stream and learns from the
// stream's acknowledgement whether each was stored, without holding up
// the voter's evaluation:
//
//   - at most one vote per node waits to be sent: a newer vote about the
//     same node replaces a waiting one (superseded), so what waits is
//     bounded by the unit's size, however long the link is down;
//   - at most Config.MaxInFlight votes are sent and not yet acknowledged
//     (nats.go's asynchronous publish window), so a round of many votes
//     does not wait on one round trip after another;
//   - a vote that fails (no acknowledgement within AckTimeout, no stream
//     answering, no link) waits again and is retried at most Retries times,
//     spaced so that every try falls within one Refresh period of the
//     vote's making; then it is dropped and counted, and the voter's next
//     refresh sends a newer vote anyway. A failed vote is also dropped as
//     soon as a newer one about the same node exists.
//
// A retried vote keeps its Nats-Msg-Id, so a vote that was stored but whose
// acknowledgement was lost is not stored twice.
type outbox struct {
	cfg     Config
	js      jetstream.JetStream
	log     *slog.Logger
	metrics *metrics
	now     func() time.Time

	mu       sync.Mutex
	waiting  map[string]*outVote // node → the vote waiting to be sent
	inFlight map[string]*outVote // Nats-Msg-Id → the vote sent, not yet acknowledged
	newest   map[string]time.Time
	wake     chan struct{}
}

type outVote struct {
	vote      *atollv1.Vote
	msg       *nats.Msg
	made      time.Time // the voter's clock when the vote was made
	tries     int       // sends so far
	notBefore time.Time // not sent again before this
}

// newOutbox publishes over nc. Its JetStream handle is its own, with the
// bounded asynchronous window and the acknowledgement timeout of cfg; a
// publish is a message on the vote's subject that the hub's stream
// captures through the leaf link, so it needs no JetStream domain.
func newOutbox(cfg Config, nc *nats.Conn, log *slog.Logger, m *metrics, now func() time.Time) (*outbox, error) {
	o := &outbox{cfg: cfg, log: log, metrics: m, now: now,
		waiting: map[string]*outVote{}, inFlight: map[string]*outVote{}, newest: map[string]time.Time{}, wake: make(chan struct{}, 1)}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(cfg.MaxInFlight),
		jetstream.WithPublishAsyncTimeout(cfg.AckTimeout),
		jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, msg *nats.Msg, _ *jetstream.PubAck) { o.acked(msg) }),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, msg *nats.Msg, err error) { o.failedMsg(msg, err) }),
	)
	if err != nil {
		return nil, fmt.Errorf("voter: jetstream: %w", err)
	}
	o.js = js
	return o, nil
}

// put queues vote (made at made, with Nats-Msg-Id id) for sending.
func (o *outbox) put(subject string, vote *atollv1.Vote, id string, made time.Time) error {
	msg, err := events.NewMsg(subject, vote, id)
	if err != nil {
		return err
	}
	if err := events.CheckIdentity(subject, vote); err != nil {
		return fmt.Errorf("vote on %s: %w", vote.GetNode(), err)
	}
	o.mu.Lock()
	node := vote.GetNode()
	if old, ok := o.waiting[node]; ok {
		o.metrics.sendFailures.WithLabelValues(reasonSuperseded).Inc()
		o.log.Debug("vote superseded before it was sent", "target", node, "made", old.made)
	}
	o.waiting[node] = &outVote{vote: vote, msg: msg, made: made}
	o.newest[node] = made
	o.mu.Unlock()
	o.signal()
	return nil
}

func (o *outbox) signal() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// forget drops what the outbox keeps about node (it left the unit).
func (o *outbox) forget(node string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.waiting, node)
	delete(o.newest, node)
}

// run sends due votes until ctx is done.
func (o *outbox) run(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := o.sendDue()
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		if !next.IsZero() {
			timer.Reset(max(next.Sub(o.now()), time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return
		case <-o.wake:
		case <-timer.C:
		}
	}
}

// sendDue sends every waiting vote whose time has come and returns when
// the next waiting one is due (zero: none waits).
func (o *outbox) sendDue() time.Time {
	now := o.now()
	var due []*outVote
	var next time.Time
	o.mu.Lock()
	room := o.cfg.MaxInFlight - len(o.inFlight)
	for node, v := range o.waiting {
		if room <= 0 {
			break // an acknowledgement or a failure wakes the loop
		}
		if v.notBefore.After(now) {
			if next.IsZero() || v.notBefore.Before(next) {
				next = v.notBefore
			}
			continue
		}
		delete(o.waiting, node)
		room--
		v.tries++
		o.inFlight[v.msg.Header.Get(jetstream.MsgIDHeader)] = v
		due = append(due, v)
	}
	o.mu.Unlock()
	for _, v := range due {
		// The window has room (inFlight counts what nats.go holds), so
		// this does not stall; a failure here is handled like a missing
		// acknowledgement.
		if _, err := o.js.PublishMsgAsync(v.msg); err != nil {
			o.failedMsg(v.msg, err)
		}
	}
	if len(due) > 0 {
		return o.now() // failures above may have queued retries
	}
	return next
}

// acked: the stream stored the vote (or knew its id already).
func (o *outbox) acked(msg *nats.Msg) {
	o.mu.Lock()
	v, ok := o.inFlight[msg.Header.Get(jetstream.MsgIDHeader)]
	delete(o.inFlight, msg.Header.Get(jetstream.MsgIDHeader))
	o.mu.Unlock()
	if ok {
		o.metrics.published.WithLabelValues(v.vote.GetVerdict().String()).Inc()
	}
	o.signal() // room in the window
}

// failedMsg: the vote was not stored. It is called from nats.go's
// callbacks, which hold the publisher's lock: it must not publish.
func (o *outbox) failedMsg(msg *nats.Msg, err error) {
	id := msg.Header.Get(jetstream.MsgIDHeader)
	o.mu.Lock()
	v, ok := o.inFlight[id]
	delete(o.inFlight, id)
	if !ok {
		o.mu.Unlock()
		return
	}
	node := v.vote.GetNode()
	now := o.now()
	// Retries are spread over the refresh period after the vote was made.
	wait := o.cfg.Refresh / time.Duration(o.cfg.Retries+1)
	reason := reasonRetried
	newest, known := o.newest[node]
	switch {
	case !known || newest.After(v.made):
		reason = reasonSuperseded // by a newer vote, or the node left
	case v.tries > o.cfg.Retries || now.Add(wait).Sub(v.made) > o.cfg.Refresh:
		reason = reasonDropped
	default:
		if _, newer := o.waiting[node]; !newer {
			v.notBefore = now.Add(wait)
			o.waiting[node] = v
		}
	}
	o.mu.Unlock()
	o.metrics.sendFailures.WithLabelValues(reason).Inc()
	level := slog.LevelDebug
	if reason == reasonDropped {
		level = slog.LevelWarn
	}
	o.log.Log(context.Background(), level, "vote not stored", "target", node, "try", v.tries, "outcome", reason, "err", err)
	o.signal() // room in the window, and maybe a retry
}

// pending is the number of votes waiting or in flight.
func (o *outbox) pending() (waiting, inFlight int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.waiting), len(o.inFlight)
}
