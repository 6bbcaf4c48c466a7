package events

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
)

// Publish sends m on subject over core NATS, with Atoll's headers and id as
// Nats-Msg-Id. Edge agents use it: the hub stream covering the subject
// captures the message through the node's leaf link, and unit peers receive
// it over the unit's routes even while the leaf link is down. It fails when
// m's identity disagrees with subject.
func Publish[T proto.Message](nc *nats.Conn, subject string, m T, id string) error {
	msg, err := newCheckedMsg(subject, m, id)
	if err != nil {
		return err
	}
	if err := nc.PublishMsg(msg); err != nil {
		return fmt.Errorf("publish %s: %w", subject, err)
	}
	return nil
}

// PublishDurable sends m on subject to JetStream and waits until a stream
// has stored it (or recognised id as a duplicate). opts add expectations
// (jetstream.WithExpectLastSequencePerSubject for optimistic concurrency).
func PublishDurable[T proto.Message](ctx context.Context, js jetstream.JetStream, subject string, m T, id string, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return PublishDurableSigned(ctx, js, subject, m, id, nil, opts...)
}

// PublishAsync queues m for JetStream and returns at once; the future
// resolves with the stream's ack. Use it for high-rate producers.
func PublishAsync[T proto.Message](js jetstream.JetStream, subject string, m T, id string) (jetstream.PubAckFuture, error) {
	msg, err := newCheckedMsg(subject, m, id)
	if err != nil {
		return nil, err
	}
	f, err := js.PublishMsgAsync(msg)
	if err != nil {
		return nil, fmt.Errorf("publish %s: %w", subject, err)
	}
	return f, nil
}

func newCheckedMsg(subject string, m proto.Message, id string) (*nats.Msg, error) {
	if err := CheckIdentity(subject, m); err != nil {
		return nil, fmt.Errorf("publish %s: %w", TypeName(m), err)
	}
	return NewMsg(subject, m, id)
}
