package events

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
)

// Follow hands h the last stored message of every subject matching filters
// in stream, then every new one, in stream order, until ctx is done. It is
// for state that each cloud replica or edge agent rebuilds on its own
// (topology, views): nothing is acked and nothing is shared. Undecodable
// messages are dropped, logged and counted under name. While the stream is
// unreachable (the hub is down, the leaf link is cut, or not up yet) Follow
// keeps trying; it never gives up before ctx is done.
func Follow[M any, PM interface {
	*M
	proto.Message
}](ctx context.Context, js jetstream.JetStream, stream string, filters []string, name string, h func(ev Event[PM]), log *slog.Logger, metrics *Metrics) error {
	if log == nil {
		log = slog.Default()
	}
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	log = log.With("follow", name, "stream", stream)
	handle := func(msg jetstream.Msg) {
		ev := Event[PM]{Subject: msg.Subject(), Header: msg.Headers(), Msg: PM(new(M))}
		if md, err := msg.Metadata(); err == nil {
			ev.Sequence, ev.Delivered, ev.Published = md.Sequence.Stream, md.NumDelivered, md.Timestamp
		}
		if err := decodeJS(msg, ev.Msg); err != nil {
			reason := decodeReason(err)
			metrics.dropped.WithLabelValues(name, reason).Inc()
			log.Warn("message dropped", "subject", ev.Subject, "seq", ev.Sequence, "reason", reason, "err", err)
			return
		}
		h(ev)
	}
	// The server-side consumer is made when consuming starts, which fails
	// while the stream is unreachable; start over until ctx is done. A
	// restart redelivers the last message of each subject: handlers are
	// state updates and take it in their stride.
	for attempt := uint64(1); ; attempt++ {
		err := followOnce(ctx, js, stream, filters, handle, log)
		if ctx.Err() != nil {
			return nil
		}
		wait := min(DefaultBackoff(attempt), 5*time.Second)
		log.Debug("stream not reachable; retrying", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// followOnce consumes until ctx is done (nil) or consuming fails or stops.
func followOnce(ctx context.Context, js jetstream.JetStream, stream string, filters []string, handle func(jetstream.Msg), log *slog.Logger) error {
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: filters,
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return err
	}
	cc, err := cons.Consume(handle, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if ctx.Err() == nil {
			log.Debug("follow interrupted; resuming", "err", err)
		}
	}))
	if err != nil {
		return err
	}
	defer cc.Stop()
	select {
	case <-ctx.Done():
		return nil
	case <-cc.Closed():
		return errors.New("consumer closed")
	}
}
