package events

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
)

// Follow hands h the last stored message of every subject matching filters
// in stream, then every new one, in stream order, until ctx is done. It is
// for state that each cloud replica or edge agent rebuilds on its own
// (topology, views): nothing is acked and nothing is shared. Undecodable
// messages are dropped, logged and counted under name. If the stream is
// unreachable (the hub is down, the leaf link is cut) Follow keeps trying;
// once following, the ordered consumer resumes after the last message it
// delivered.
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
	var cons jetstream.Consumer
	for attempt := uint64(1); ; attempt++ {
		var err error
		cons, err = js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
			FilterSubjects: filters,
			DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		wait := min(DefaultBackoff(attempt), 5*time.Second)
		log.Debug("stream not reachable yet", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	cc, err := cons.Consume(func(msg jetstream.Msg) {
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
	}, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		if ctx.Err() == nil {
			log.Debug("follow interrupted; resuming", "err", err)
		}
	}))
	if err != nil {
		return fmt.Errorf("follow %s on %s: %w", name, stream, err)
	}
	<-ctx.Done()
	cc.Stop()
	return nil
}
