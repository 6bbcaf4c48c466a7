package eventbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/events"
)

// Event is one decoded message handed to a Handler.
type Event[T proto.Message] struct {
	Subject string
	Msg     T
	Header  nats.Header
	// Data is the payload as received: what a signature covers (Verify).
	Data []byte
	// Sequence is the stream sequence (zero for core NATS messages).
	Sequence uint64
	// Delivered counts the attempts at this message, this one included.
	Delivered uint64
	// Published is when the stream stored the message.
	Published time.Time
}

// Handler applies one event. It returns nil once the event's effect is
// durable, Retry or any other error for a transient failure (tried again
// after a backoff), or Reject when the event can never succeed (ended at
// once, never tried again).
type Handler[T proto.Message] func(ctx context.Context, ev Event[T]) error

type retryError struct {
	err   error
	after time.Duration
}

func (e *retryError) Error() string { return e.err.Error() }
func (e *retryError) Unwrap() error { return e.err }

// Retry marks err as transient: try the message again after the given
// delay (zero: the consumer's backoff).
func Retry(err error, after time.Duration) error { return &retryError{err: err, after: after} }

type rejectError struct{ err error }

func (e *rejectError) Error() string { return e.err.Error() }
func (e *rejectError) Unwrap() error { return e.err }

// Reject marks err as permanent: end the message with err as reason.
func Reject(err error) error { return &rejectError{err: err} }

// ConsumeOptions tune Consume, NewConsumer and Subscribe. The zero value
// works.
type ConsumeOptions struct {
	// Workers handle messages of a Shared consumer concurrently
	// (default 1). Follow consumers and subscriptions handle one at a time.
	Workers int
	Logger  *slog.Logger
	Metrics *Metrics
	// Backoff gives the delay before the n-th retry of a message, and
	// before the n-th attempt to recreate a lost consumer (default
	// DefaultBackoff).
	Backoff func(attempt uint64) time.Duration
	// CheckInterval is how often a consumer asks the server whether it
	// still exists and whether it has caught up (default 5s).
	CheckInterval time.Duration
	// PullExpiry and Heartbeat shape a Follow consumer's pull requests:
	// each request lives PullExpiry and the server sends an idle
	// heartbeat every Heartbeat while nothing is delivered. Zero: the
	// client's defaults for ordered consumers (30 s, 5 s), right for the
	// cloud's few followers, which must notice a lost consumer quickly
	// (two missed heartbeats). Shared consumers heartbeat every
	// SharedHeartbeat.
	PullExpiry, Heartbeat time.Duration
	// Seen, when set, is asked about each message of a Shared or Follow
	// consumer before it is decoded (its subject, and when the stream
	// stored it): true skips it undecoded (a Shared consumer acks it),
	// counted as OutcomeSeen. For messages that another consumer of the
	// same process has handled already: the cloud leader's ballot
	// follower and shared ballot consumer both get every ballot, which
	// is then decoded once.
	Seen func(subject string, stored time.Time) bool
}

// SharedHeartbeat is the heartbeat of the cloud's few shared consumers: a
// pull request held by a hub server that dies, or by a consumer leader
// that moves, is lost without a word, and only missing heartbeats tell
// (two of them); nats.go's default of 15 s left a consumer stalled ~30 s
// after a hub server loss, 5 s makes it ~10 s.
const SharedHeartbeat = 5 * time.Second

func (o *ConsumeOptions) defaults() {
	if o.Workers < 1 {
		o.Workers = 1
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	if o.Backoff == nil {
		o.Backoff = DefaultBackoff
	}
	if o.CheckInterval <= 0 {
		o.CheckInterval = 5 * time.Second
	}
	if o.PullExpiry > 0 && (o.Heartbeat <= 0 || o.Heartbeat >= o.PullExpiry/2) {
		// nats.go refuses a heartbeat of half the expiry or more.
		o.Heartbeat = o.PullExpiry / 3
	}
}

// DefaultBackoff is 500ms doubling per attempt, capped at 30s.
func DefaultBackoff(attempt uint64) time.Duration {
	d := 500 * time.Millisecond
	for i := uint64(1); i < attempt && d < 30*time.Second; i++ {
		d *= 2
	}
	return min(d, 30*time.Second)
}

// Consume runs h on the messages of spec until ctx is done; it is
// NewConsumer followed by Run. See Consumer for the contract.
func Consume[M any, PM interface {
	*M
	proto.Message
}](ctx context.Context, js jetstream.JetStream, spec events.ConsumerSpec, h Handler[PM], o ConsumeOptions) error {
	c, err := NewConsumer(js, spec, h, o)
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

// Consumer reads a stream through a ConsumerSpec and hands every message,
// decoded as PM, to a Handler. The contract is the same in both modes:
//
//   - A message that does not decode, names another type or whose payload
//     identity disagrees with its subject ends at once (reason undecodable,
//     wrong_type, identity).
//   - A handler error is tried again after a backoff (Shared: Nak with
//     delay, redelivered by the server, possibly to another process;
//     Follow: in place, before the next message). Reject ends the message
//     at once (reason rejected).
//   - The MaxDeliver-th failed attempt ends the message (reason
//     max_deliveries) with an ERROR log line; later messages go on.
//   - Ending a message terminates it on the server (Shared: Term with the
//     reason) and counts it in atoll_events_terminated_total{consumer,reason}.
//   - A consumer that is lost (deleted by an operator, gone with a hub that
//     lost its state, closed) is recreated with backoff; while the stream
//     is unreachable, creation is retried. Every loss of a running
//     consumer is logged at ERROR (a consumer not created yet, at WARN),
//     and every attempt is counted in atoll_events_consumer_restarts_total;
//     the gauge atoll_events_consumer_up is 0 until it is back. A Consumer
//     stops only when ctx is done. A recreated Shared consumer resumes
//     where the server left it; one created anew (and every new Follow
//     consumer) starts at DeliverPolicy again, so handlers must be
//     idempotent.
//
// CaughtUp reports when the consumer has delivered everything the stream
// held when it started, for readiness.
type Consumer struct {
	js     jetstream.JetStream
	spec   events.ConsumerSpec
	o      ConsumeOptions
	log    *slog.Logger
	handle func(ctx context.Context, msg jetstream.Msg) // decodes and calls the handler

	running  atomic.Bool
	head     atomic.Uint64 // the stream's last sequence when consuming started
	caught   chan struct{}
	caughtMu sync.Once
}

// NewConsumer validates spec and returns a Consumer that runs h on its
// messages once Run is called.
func NewConsumer[M any, PM interface {
	*M
	proto.Message
}](js jetstream.JetStream, spec events.ConsumerSpec, h Handler[PM], o ConsumeOptions) (*Consumer, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if js == nil {
		return nil, fmt.Errorf("consumer %s: no JetStream", spec.Name)
	}
	o.defaults()
	c := &Consumer{
		js: js, spec: spec, o: o,
		log:    o.Logger.With("consumer", spec.Name, "stream", spec.Stream, "mode", spec.Mode.String()),
		caught: make(chan struct{}),
	}
	p := pipeline[M, PM]{name: spec.Name, h: h, o: o, log: c.log, maxAttempts: spec.MaxDeliver, timeout: spec.AckWait * 9 / 10}
	if spec.Mode == events.Shared {
		c.handle = func(ctx context.Context, msg jetstream.Msg) { p.shared(ctx, msg); c.delivered(msg) }
	} else {
		c.handle = func(ctx context.Context, msg jetstream.Msg) { p.follow(ctx, msg); c.delivered(msg) }
	}
	o.Metrics.caughtUp.WithLabelValues(spec.Name).Set(0)
	return c, nil
}

// Spec is the consumer's spec.
func (c *Consumer) Spec() events.ConsumerSpec { return c.spec }

// CaughtUp is closed once the consumer has handled every message that
// matched its filter when it first started consuming (or found nothing to
// deliver). It stays closed when the consumer is later lost and recreated.
func (c *Consumer) CaughtUp() <-chan struct{} { return c.caught }

// Ready is nil once the consumer has caught up (see CaughtUp), and an
// error naming the consumer before. It fits a readiness check.
func (c *Consumer) Ready() error {
	select {
	case <-c.caught:
		return nil
	default:
		return fmt.Errorf("consumer %s on %s has not caught up with the stream", c.spec.Name, c.spec.Stream)
	}
}

func (c *Consumer) markCaughtUp(why string) {
	c.caughtMu.Do(func() {
		close(c.caught)
		c.o.Metrics.caughtUp.WithLabelValues(c.spec.Name).Set(1)
		c.log.Info("consumer caught up", "why", why)
	})
}

// delivered notes that msg has been dealt with and checks whether that
// catches the consumer up: nothing was pending after it, or it is at or
// past the stream's last message at start.
func (c *Consumer) delivered(msg jetstream.Msg) {
	select {
	case <-c.caught:
		return
	default:
	}
	md, err := msg.Metadata()
	if err != nil {
		return
	}
	if md.NumPending == 0 || (c.head.Load() > 0 && md.Sequence.Stream >= c.head.Load()) {
		c.markCaughtUp("delivered the stream head")
	}
}

// Restart reasons, the reason label of atoll_events_consumer_restarts_total.
const (
	RestartLost        = "lost"        // deleted on the server, or gone with its state
	RestartClosed      = "closed"      // consuming stopped on the client
	RestartUnreachable = "unreachable" // the stream could not be reached to create it
)

type restartError struct {
	reason string
	err    error
}

func (e *restartError) Error() string { return e.reason + ": " + e.err.Error() }
func (e *restartError) Unwrap() error { return e.err }

const createTimeout = 10 * time.Second

// Run consumes until ctx is done, recreating the consumer whenever it is
// lost. It returns nil when ctx is done, and an error only when the
// Consumer is already running.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return fmt.Errorf("consumer %s: already running", c.spec.Name)
	}
	defer c.running.Store(false)
	up := c.o.Metrics.up.WithLabelValues(c.spec.Name)
	defer up.Set(0)
	failures := uint64(0)
	for {
		established := false
		err := c.session(ctx, func() {
			established = true
			up.Set(1)
			if failures > 0 {
				c.log.Info("consumer recreated", "attempts", failures)
			} else {
				c.log.Info("consuming", "filter", c.spec.FilterSubjects, "workers", c.o.Workers)
			}
			failures = 0
		})
		if ctx.Err() != nil {
			return nil
		}
		up.Set(0)
		failures++
		reason := RestartClosed
		var re *restartError
		if errors.As(err, &re) {
			reason = re.reason
		}
		c.o.Metrics.restarts.WithLabelValues(c.spec.Name, reason).Inc()
		wait := min(c.o.Backoff(failures), 10*time.Second)
		switch {
		case established:
			// A consumer that was running is gone: always worth an ERROR.
			c.log.Error("consumer stopped; recreating it", "reason", reason, "err", err, "retry_in", wait)
		case failures == 1:
			// Not created yet (the hub or the leaf link is not up).
			c.log.Warn("cannot create the consumer; retrying", "reason", reason, "err", err, "retry_in", wait)
		default:
			c.log.Debug("consumer still down; retrying", "reason", reason, "err", err, "attempt", failures, "retry_in", wait)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// session creates the consumer and consumes until ctx is done (nil) or the
// consumer is lost (a *restartError).
func (c *Consumer) session(ctx context.Context, established func()) error {
	cctx, cancel := context.WithTimeout(ctx, createTimeout)
	defer cancel()
	stream, err := c.js.Stream(cctx, c.spec.Stream)
	if err != nil {
		return &restartError{RestartUnreachable, fmt.Errorf("stream %s: %w", c.spec.Stream, err)}
	}
	var cons jetstream.Consumer
	if c.spec.Mode == events.Shared {
		cons, err = c.js.CreateOrUpdateConsumer(cctx, c.spec.Stream, c.spec.DurableConfig())
	} else {
		cons, err = c.js.OrderedConsumer(cctx, c.spec.Stream, c.spec.OrderedConfig())
	}
	if err != nil {
		return &restartError{RestartUnreachable, fmt.Errorf("create consumer: %w", err)}
	}
	if c.head.Load() == 0 {
		c.head.Store(stream.CachedInfo().State.LastSeq)
	}
	if info := cons.CachedInfo(); info != nil && info.NumPending == 0 && info.NumAckPending == 0 {
		c.markCaughtUp("nothing to deliver")
	}

	lost := make(chan error, 1)
	check := make(chan struct{}, 1)
	errHandler := jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		switch {
		case ctx.Err() != nil:
		case errors.Is(err, jetstream.ErrConsumerDeleted):
			select {
			case lost <- err:
			default:
			}
		case errors.Is(err, jetstream.ErrNoHeartbeat), errors.Is(err, nats.ErrNoResponders):
			select {
			case check <- struct{}{}:
			default:
			}
			c.log.Debug("consuming interrupted", "err", err)
		default:
			c.log.Debug("consume error", "err", err)
		}
	})
	workers := 1
	if c.spec.Mode == events.Shared {
		workers = c.o.Workers
	}
	ccs := make([]jetstream.ConsumeContext, 0, workers)
	stopAll := func() {
		for _, cc := range ccs {
			cc.Stop()
		}
	}
	opts := []jetstream.PullConsumeOpt{errHandler}
	if c.spec.Mode == events.Follow {
		if c.o.PullExpiry > 0 {
			opts = append(opts, jetstream.PullExpiry(c.o.PullExpiry), jetstream.PullHeartbeat(c.o.Heartbeat))
		}
	} else {
		opts = append(opts, jetstream.PullHeartbeat(SharedHeartbeat))
	}
	for range workers {
		cc, err := cons.Consume(func(msg jetstream.Msg) { c.handle(ctx, msg) }, opts...)
		if err != nil {
			stopAll()
			return &restartError{RestartUnreachable, fmt.Errorf("consume: %w", err)}
		}
		ccs = append(ccs, cc)
	}
	established()

	closed := make(chan struct{}, 1)
	for _, cc := range ccs {
		go func() {
			select {
			case <-cc.Closed():
				select {
				case closed <- struct{}{}:
				default:
				}
			case <-ctx.Done():
			}
		}()
	}
	t := time.NewTicker(c.o.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			c.drain(ccs)
			return nil
		case err := <-lost:
			stopAll()
			return &restartError{RestartLost, err}
		case <-closed:
			stopAll()
			if ctx.Err() != nil {
				return nil
			}
			return &restartError{RestartClosed, errors.New("consuming stopped")}
		case <-t.C:
		case <-check:
		}
		if err := c.check(ctx, cons); err != nil {
			stopAll()
			return err
		}
	}
}

// check asks the server about a Shared consumer: gone means lost; nothing
// pending or unacked means caught up. Follow consumers recreate themselves
// (nats.go's ordered consumer) and catch up message by message.
func (c *Consumer) check(ctx context.Context, cons jetstream.Consumer) error {
	if c.spec.Mode != events.Shared {
		return nil
	}
	ictx, cancel := context.WithTimeout(ctx, createTimeout)
	defer cancel()
	info, err := cons.Info(ictx)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		return &restartError{RestartLost, err}
	case err != nil:
		c.log.Debug("consumer info", "err", err)
	case info.NumPending == 0 && info.NumAckPending == 0:
		c.markCaughtUp("nothing pending")
	}
	return nil
}

// drain lets the handlers in flight finish, bounded by AckWait. Without a
// connection there is nothing to drain (and draining would wait for one).
func (c *Consumer) drain(ccs []jetstream.ConsumeContext) {
	if nc := c.js.Conn(); nc != nil && !nc.IsConnected() {
		for _, cc := range ccs {
			cc.Stop()
		}
		return
	}
	for _, cc := range ccs {
		cc.Drain()
	}
	timeout := time.After(c.spec.AckWait)
	for _, cc := range ccs {
		select {
		case <-cc.Closed():
		case <-timeout:
			cc.Stop()
		}
	}
}

// pipeline decodes messages as PM and runs the handler under the retry
// contract; it is shared by both consumer modes and core subscriptions.
type pipeline[M any, PM interface {
	*M
	proto.Message
}] struct {
	name        string
	h           Handler[PM]
	o           ConsumeOptions
	log         *slog.Logger
	maxAttempts int
	timeout     time.Duration
}

func (p *pipeline[M, PM]) decode(msg *nats.Msg, ev *Event[PM]) error {
	ev.Subject, ev.Header, ev.Data, ev.Msg = msg.Subject, msg.Header, msg.Data, PM(new(M))
	return events.DecodeMsg(msg, ev.Msg)
}

func jsEvent[PM proto.Message](msg jetstream.Msg) (*nats.Msg, Event[PM]) {
	var ev Event[PM]
	if md, err := msg.Metadata(); err == nil {
		ev.Sequence, ev.Delivered, ev.Published = md.Sequence.Stream, md.NumDelivered, md.Timestamp
	}
	return &nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()}, ev
}

func (p *pipeline[M, PM]) call(ctx context.Context, ev Event[PM]) error {
	if p.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.timeout)
		defer cancel()
	}
	return p.h(ctx, ev)
}

// retryAfter is the delay before the next attempt after err at attempt.
func (p *pipeline[M, PM]) retryAfter(err error, attempt uint64) time.Duration {
	var retry *retryError
	if errors.As(err, &retry) && retry.after > 0 {
		return retry.after
	}
	return p.o.Backoff(attempt)
}

// shared handles one message of a durable consumer: ack, Nak with delay,
// or Term.
func (p *pipeline[M, PM]) shared(ctx context.Context, msg jetstream.Msg) {
	start := time.Now()
	defer p.observe(start)
	nm, ev := jsEvent[PM](msg)
	if p.o.Seen != nil && !ev.Published.IsZero() && p.o.Seen(nm.Subject, ev.Published) {
		if aerr := msg.Ack(); aerr != nil {
			p.log.Warn("ack failed; message will be redelivered", "subject", nm.Subject, "seq", ev.Sequence, "err", aerr)
		}
		p.o.Metrics.handled.WithLabelValues(p.name, OutcomeSeen).Inc()
		return
	}
	if err := p.decode(nm, &ev); err != nil {
		p.end(ev, decodeReason(err), err, msg.TermWithReason)
		return
	}
	err := p.call(ctx, ev)
	var rej *rejectError
	switch {
	case err == nil:
		if aerr := msg.Ack(); aerr != nil {
			p.log.Warn("ack failed; message will be redelivered", "subject", ev.Subject, "seq", ev.Sequence, "err", aerr)
		}
		p.o.Metrics.handled.WithLabelValues(p.name, OutcomeAck).Inc()
	case errors.As(err, &rej):
		p.end(ev, ReasonRejected, err, msg.TermWithReason)
	case ctx.Err() != nil:
		// Shutting down: hand the message back at once to another process.
		_ = msg.Nak()
	case int(ev.Delivered) >= p.maxAttempts:
		p.end(ev, ReasonMaxDeliveries, err, msg.TermWithReason)
	default:
		after := p.retryAfter(err, ev.Delivered)
		p.log.Info("handler failed; will retry", "subject", ev.Subject, "seq", ev.Sequence,
			"delivered", ev.Delivered, "after", after, "err", err)
		if nerr := msg.NakWithDelay(after); nerr != nil {
			p.log.Warn("nak failed; message will be redelivered after the ack wait", "subject", ev.Subject, "seq", ev.Sequence, "err", nerr)
		}
		p.o.Metrics.handled.WithLabelValues(p.name, OutcomeRetry).Inc()
	}
}

// follow handles one message of an ordered consumer: nothing to ack, so
// failed attempts are retried in place before the next message.
func (p *pipeline[M, PM]) follow(ctx context.Context, msg jetstream.Msg) {
	start := time.Now()
	defer p.observe(start)
	nm, ev := jsEvent[PM](msg)
	if p.o.Seen != nil && !ev.Published.IsZero() && p.o.Seen(nm.Subject, ev.Published) {
		p.o.Metrics.handled.WithLabelValues(p.name, OutcomeSeen).Inc()
		return
	}
	if err := p.decode(nm, &ev); err != nil {
		p.end(ev, decodeReason(err), err, nil)
		return
	}
	for attempt := uint64(1); ; attempt++ {
		ev.Delivered = attempt
		err := p.call(ctx, ev)
		var rej *rejectError
		switch {
		case err == nil:
			p.o.Metrics.handled.WithLabelValues(p.name, OutcomeAck).Inc()
			return
		case errors.As(err, &rej):
			p.end(ev, ReasonRejected, err, nil)
			return
		case ctx.Err() != nil:
			return
		case int(attempt) >= p.maxAttempts:
			p.end(ev, ReasonMaxDeliveries, err, nil)
			return
		}
		after := p.retryAfter(err, attempt)
		p.log.Info("handler failed; will retry", "subject", ev.Subject, "seq", ev.Sequence,
			"delivered", attempt, "after", after, "err", err)
		p.o.Metrics.handled.WithLabelValues(p.name, OutcomeRetry).Inc()
		select {
		case <-ctx.Done():
			return
		case <-time.After(after):
		}
	}
}

// core handles one core NATS message: there is no redelivery, so a
// handler error other than Reject ends the message with reason failed.
func (p *pipeline[M, PM]) core(ctx context.Context, msg *nats.Msg) {
	start := time.Now()
	defer p.observe(start)
	var ev Event[PM]
	if err := p.decode(msg, &ev); err != nil {
		p.end(ev, decodeReason(err), err, nil)
		return
	}
	ev.Delivered = 1
	err := p.call(ctx, ev)
	var rej *rejectError
	switch {
	case err == nil:
		p.o.Metrics.handled.WithLabelValues(p.name, OutcomeAck).Inc()
	case errors.As(err, &rej):
		p.end(ev, ReasonRejected, err, nil)
	default:
		p.end(ev, ReasonFailed, err, nil)
	}
}

func (p *pipeline[M, PM]) observe(start time.Time) {
	p.o.Metrics.duration.WithLabelValues(p.name).Observe(time.Since(start).Seconds())
}

// end puts a message in its terminal state: terminated on the server when
// term is set, counted and logged (at ERROR when retries ran out).
func (p *pipeline[M, PM]) end(ev Event[PM], reason string, err error, term func(string) error) {
	if term != nil {
		text := reason + ": " + err.Error()
		const maxReason = 256
		if len(text) > maxReason {
			text = text[:maxReason]
		}
		if terr := term(text); terr != nil {
			p.log.Warn("term failed", "subject", ev.Subject, "seq", ev.Sequence, "err", terr)
		}
	}
	p.o.Metrics.terminated.WithLabelValues(p.name, reason).Inc()
	p.o.Metrics.handled.WithLabelValues(p.name, OutcomeTerm).Inc()
	level := slog.LevelWarn
	if reason == ReasonMaxDeliveries || reason == ReasonFailed {
		level = slog.LevelError
	}
	p.log.Log(context.Background(), level, "message terminated", "subject", ev.Subject, "seq", ev.Sequence,
		"delivered", ev.Delivered, "reason", reason, "err", err)
}

// decodeReason maps a DecodeMsg error to a termination reason.
func decodeReason(err error) string {
	switch {
	case errors.Is(err, events.ErrTypeMismatch):
		return ReasonWrongType
	case errors.Is(err, events.ErrIdentity), errors.Is(err, events.ErrWrongSubject),
		errors.Is(err, events.ErrInvalidToken), errors.Is(err, events.ErrEmptyToken):
		return ReasonIdentity
	default:
		return ReasonUndecodable
	}
}

// Subscribe runs h on every core NATS message on subject, decoded as PM,
// from the subscription's goroutine, with the decode, terminal-state and
// metrics path of Consume under the consumer label name. Core NATS keeps
// nothing and redelivers nothing: a handler error ends the message (reason
// failed, logged at ERROR). Use it for unit-local traffic that needs no
// persistence (probe reports between peers); use Consume for streams.
func Subscribe[M any, PM interface {
	*M
	proto.Message
}](nc *nats.Conn, subject, name string, h Handler[PM], o ConsumeOptions) (*nats.Subscription, error) {
	o.defaults()
	p := pipeline[M, PM]{name: name, h: h, o: o, log: o.Logger.With("subscription", name), maxAttempts: 1}
	sub, err := nc.Subscribe(subject, func(msg *nats.Msg) { p.core(context.Background(), msg) })
	if err != nil {
		return nil, fmt.Errorf("subscribe %s to %s: %w", name, subject, err)
	}
	return sub, nil
}
