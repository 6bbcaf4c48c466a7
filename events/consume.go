package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
)

// Event is one decoded message handed to a Handler.
type Event[T proto.Message] struct {
	Subject string
	Msg     T
	Header  nats.Header
	// Stream sequence and delivery count; zero for core NATS messages.
	Sequence  uint64
	Delivered uint64
	Published time.Time
}

// Handler applies one event. It returns nil once the event's effect is
// durable (the message is then acked), Retry or any other error for a
// transient failure (redelivered later), or Reject when the event can never
// succeed (terminated, never redelivered).
type Handler[T proto.Message] func(ctx context.Context, ev Event[T]) error

type retryError struct {
	err   error
	after time.Duration
}

func (e *retryError) Error() string { return e.err.Error() }
func (e *retryError) Unwrap() error { return e.err }

// Retry marks err as transient: redeliver the message after the given delay
// (zero: the consumer's backoff).
func Retry(err error, after time.Duration) error { return &retryError{err: err, after: after} }

type rejectError struct{ err error }

func (e *rejectError) Error() string { return e.err.Error() }
func (e *rejectError) Unwrap() error { return e.err }

// Reject marks err as permanent: terminate the message with err as reason.
func Reject(err error) error { return &rejectError{err: err} }

// ConsumeOptions tune Consume. The zero value works.
type ConsumeOptions struct {
	// Workers pull and handle messages concurrently (default 1).
	Workers int
	Logger  *slog.Logger
	Metrics *Metrics
	// Backoff gives the redelivery delay for the n-th failed delivery
	// (default: 500ms doubling up to 30s).
	Backoff func(delivered uint64) time.Duration
}

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
}

// DefaultBackoff is 500ms doubling per delivery, capped at 30s.
func DefaultBackoff(delivered uint64) time.Duration {
	d := 500 * time.Millisecond
	for i := uint64(1); i < delivered && d < 30*time.Second; i++ {
		d *= 2
	}
	return min(d, 30*time.Second)
}

// Consume creates or updates the durable consumer spec and runs h on its
// messages until ctx is done. Replicas running the same spec share the work.
// Undecodable messages and messages whose payload identity disagrees with
// their subject are terminated with a reason and counted; the consumer
// carries on with the next message.
func Consume[M any, PM interface {
	*M
	proto.Message
}](ctx context.Context, js jetstream.JetStream, spec ConsumerSpec, h Handler[PM], o ConsumeOptions) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	o.defaults()
	cons, err := js.CreateOrUpdateConsumer(ctx, spec.Stream, spec.config())
	if err != nil {
		return fmt.Errorf("ensure consumer %s on %s: %w", spec.Durable, spec.Stream, err)
	}
	log := o.Logger.With("consumer", spec.Durable, "stream", spec.Stream)
	c := &consumer[M, PM]{spec: spec, h: h, o: o, log: log}

	var wg sync.WaitGroup
	ccs := make([]jetstream.ConsumeContext, 0, o.Workers)
	for range o.Workers {
		wg.Add(1)
		cc, err := cons.Consume(func(msg jetstream.Msg) { c.handle(ctx, msg) },
			jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
				if ctx.Err() == nil && !errors.Is(err, jetstream.ErrNoHeartbeat) {
					log.Debug("pull error", "err", err)
				}
			}))
		if err != nil {
			wg.Done()
			for _, cc := range ccs {
				cc.Stop()
			}
			return fmt.Errorf("consume %s: %w", spec.Durable, err)
		}
		ccs = append(ccs, cc)
		go func() {
			defer wg.Done()
			<-cc.Closed()
		}()
	}
	log.Info("consuming", "workers", o.Workers, "filter", spec.FilterSubjects)
	<-ctx.Done()
	for _, cc := range ccs {
		cc.Drain()
	}
	wg.Wait()
	return nil
}

type consumer[M any, PM interface {
	*M
	proto.Message
}] struct {
	spec ConsumerSpec
	h    Handler[PM]
	o    ConsumeOptions
	log  *slog.Logger
}

func (c *consumer[M, PM]) handle(ctx context.Context, msg jetstream.Msg) {
	start := time.Now()
	defer func() { c.o.Metrics.duration.WithLabelValues(c.spec.Durable).Observe(time.Since(start).Seconds()) }()

	ev := Event[PM]{Subject: msg.Subject(), Header: msg.Headers(), Msg: PM(new(M))}
	if md, err := msg.Metadata(); err == nil {
		ev.Sequence, ev.Delivered, ev.Published = md.Sequence.Stream, md.NumDelivered, md.Timestamp
	}
	if err := decodeJS(msg, ev.Msg); err != nil {
		c.term(msg, ev, decodeReason(err), err)
		return
	}

	hctx, cancel := context.WithTimeout(ctx, c.spec.AckWait*9/10)
	err := c.h(hctx, ev)
	cancel()

	var rej *rejectError
	var retry *retryError
	switch {
	case err == nil:
		if aerr := msg.Ack(); aerr != nil {
			c.log.Warn("ack failed; message will be redelivered", "subject", ev.Subject, "seq", ev.Sequence, "err", aerr)
		}
		c.o.Metrics.handled.WithLabelValues(c.spec.Durable, OutcomeAck).Inc()
	case errors.As(err, &rej):
		c.term(msg, ev, ReasonRejected, err)
	case ctx.Err() != nil:
		// Shutting down: hand the message back at once to another replica.
		_ = msg.Nak()
	case int(ev.Delivered) >= c.spec.MaxDeliver:
		c.term(msg, ev, ReasonMaxDeliveries, err)
	default:
		after := c.o.Backoff(ev.Delivered)
		if errors.As(err, &retry) && retry.after > 0 {
			after = retry.after
		}
		c.log.Info("handler failed; will retry", "subject", ev.Subject, "seq", ev.Sequence,
			"delivered", ev.Delivered, "after", after, "err", err)
		_ = msg.NakWithDelay(after)
		c.o.Metrics.handled.WithLabelValues(c.spec.Durable, OutcomeRetry).Inc()
	}
}

func (c *consumer[M, PM]) term(msg jetstream.Msg, ev Event[PM], reason string, err error) {
	text := reason + ": " + err.Error()
	const maxReason = 256
	if len(text) > maxReason {
		text = text[:maxReason]
	}
	if terr := msg.TermWithReason(text); terr != nil {
		c.log.Warn("term failed", "subject", ev.Subject, "seq", ev.Sequence, "err", terr)
	}
	c.o.Metrics.terminated.WithLabelValues(c.spec.Durable, reason).Inc()
	c.o.Metrics.handled.WithLabelValues(c.spec.Durable, OutcomeTerm).Inc()
	c.log.Warn("message terminated", "subject", ev.Subject, "seq", ev.Sequence,
		"delivered", ev.Delivered, "reason", reason, "err", err)
}

func decodeJS(msg jetstream.Msg, into proto.Message) error {
	return DecodeMsg(&nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()}, into)
}

// decodeReason maps a DecodeMsg error to a termination reason.
func decodeReason(err error) string {
	switch {
	case errors.Is(err, ErrTypeMismatch):
		return ReasonWrongType
	case errors.Is(err, ErrIdentity), errors.Is(err, ErrWrongSubject),
		errors.Is(err, ErrInvalidToken), errors.Is(err, ErrEmptyToken):
		return ReasonIdentity
	default:
		return ReasonUndecodable
	}
}

// Subscribe decodes every core NATS message on subject as PM and calls h
// from the subscription's goroutine. Messages that do not decode, or whose
// identity disagrees with their subject, are dropped, logged and counted
// under name. Use it for unit-local traffic that needs no persistence.
func Subscribe[M any, PM interface {
	*M
	proto.Message
}](nc *nats.Conn, subject, name string, h func(ev Event[PM]), log *slog.Logger, metrics *Metrics) (*nats.Subscription, error) {
	if log == nil {
		log = slog.Default()
	}
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	sub, err := nc.Subscribe(subject, func(msg *nats.Msg) {
		ev := Event[PM]{Subject: msg.Subject, Header: msg.Header, Msg: PM(new(M))}
		if err := DecodeMsg(msg, ev.Msg); err != nil {
			reason := decodeReason(err)
			metrics.dropped.WithLabelValues(name, reason).Inc()
			log.Warn("message dropped", "subscription", name, "subject", msg.Subject, "reason", reason, "err", err)
			return
		}
		h(ev)
	})
	if err != nil {
		return nil, fmt.Errorf("subscribe %s to %s: %w", name, subject, err)
	}
	return sub, nil
}
