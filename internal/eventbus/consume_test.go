package eventbus_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/test/poll"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/events"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
)

func ballot(unit, voter string) (string, *atollv1.Ballot) {
	subj, err := events.BallotSubject(unit, voter)
	if err != nil {
		panic(err)
	}
	return subj, &atollv1.Ballot{Unit: unit, Voter: voter, Time: timestamppb.Now()}
}

// run starts Consume in the background and returns a stop function that
// waits for it to return.
func run(t *testing.T, js jetstream.JetStream, spec events.ConsumerSpec, h eventbus.Handler[*atollv1.Ballot], o eventbus.ConsumeOptions) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- eventbus.Consume(ctx, js, spec, h, o) }()
	stop := func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("consume: %v", err)
		}
	}
	t.Cleanup(func() {
		select {
		case <-ctx.Done():
		default:
			stop()
		}
	})
	return stop
}

func setup(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	h := natstest.Hub(t)
	nc, err := h.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := eventbus.EnsureStreams(ctx, js, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	// Idempotent: a second replica starting does not fail.
	if err := eventbus.EnsureStreams(ctx, js, events.DefaultStreamOptions()); err != nil {
		t.Fatalf("second EnsureStreams: %v", err)
	}
	return nc, js
}

// consumerInfo is what the server says of the HEALTH consumer name.
func consumerInfo(js jetstream.JetStream, name string) (*jetstream.ConsumerInfo, error) {
	c, err := js.Consumer(context.Background(), events.StreamHealth, name)
	if err != nil {
		return nil, err
	}
	return c.Info(context.Background())
}

// received collects what a handler saw.
type received struct {
	mu  sync.Mutex
	got []string
}

func (r *received) add(s string) { r.mu.Lock(); r.got = append(r.got, s); r.mu.Unlock() }
func (r *received) count() int   { r.mu.Lock(); defer r.mu.Unlock(); return len(r.got) }

// TestConsumePoison: undecodable payloads, wrong type headers and payloads
// that lie about their identity are terminated with a reason and counted,
// and the consumer goes on with the next messages.
func TestConsumePoison(t *testing.T) {
	nc, js := setup(t)
	metrics := eventbus.NewMetrics(nil)
	spec := events.BallotConsumer
	spec.Name = "poison-test"
	spec.DeliverPolicy = jetstream.DeliverAllPolicy

	publishRaw := func(subject string, header nats.Header, data []byte) {
		t.Helper()
		if _, err := js.PublishMsg(context.Background(), &nats.Msg{Subject: subject, Header: header, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	good := func(node string) {
		t.Helper()
		subj, v := ballot("u1", node)
		if _, err := events.PublishDurable(context.Background(), js, subj, v, "good-"+node); err != nil {
			t.Fatal(err)
		}
	}
	subjA, _ := ballot("u1", "a")
	good("n1")
	publishRaw(subjA, nats.Header{events.HeaderType: {"atoll.v1.Ballot"}}, []byte{0xff, 0xff, 0xff}) // undecodable
	good("n2")
	publishRaw(subjA, nats.Header{events.HeaderType: {"atoll.v1.ProbeReport"}}, nil) // wrong type
	_, liar := ballot("u1", "b")                                                     // says node b ...
	liarMsg, _ := events.NewMsg(subjA, liar, "")                                     // ... on a's subject
	if _, err := js.PublishMsg(context.Background(), liarMsg); err != nil {
		t.Fatal(err)
	}
	good("n3")

	var got received
	run(t, js, spec, func(_ context.Context, ev eventbus.Event[*atollv1.Ballot]) error {
		got.add(ev.Msg.GetVoter())
		return nil
	}, eventbus.ConsumeOptions{Metrics: metrics, Logger: natstest.Logger(t, 0)})

	poll.Eventually(t, 10*time.Second, func() error {
		if got.count() != 3 {
			return fmt.Errorf("handled %d good ballots, want 3", got.count())
		}
		for reason, want := range map[string]float64{eventbus.ReasonUndecodable: 1, eventbus.ReasonWrongType: 1, eventbus.ReasonIdentity: 1} {
			if n := metrics.TerminatedCount(spec.Name, reason); n != want {
				return fmt.Errorf("terminated for %s: %v, want %v", reason, n, want)
			}
		}
		return nil
	})
	// Nothing left pending: the poison is not coming back.
	poll.Eventually(t, 10*time.Second, func() error {
		ci, err := consumerInfo(js, spec.Name)
		if err != nil {
			return err
		}
		if ci.NumAckPending != 0 || ci.NumRedelivered != 0 || ci.NumPending != 0 {
			return fmt.Errorf("consumer has ack pending %d, redelivered %d, pending %d", ci.NumAckPending, ci.NumRedelivered, ci.NumPending)
		}
		return nil
	})
	_ = nc
}

// TestConsumeRetryAndReject: a transient failure is redelivered until it
// succeeds; a rejected message and one that keeps failing past MaxDeliver
// are terminated and counted instead of redelivered forever.
func TestConsumeRetryAndReject(t *testing.T) {
	_, js := setup(t)
	metrics := eventbus.NewMetrics(nil)
	spec := events.BallotConsumer
	spec.Name = "retry-test"
	spec.DeliverPolicy = jetstream.DeliverAllPolicy
	spec.MaxDeliver = 3

	for _, node := range []string{"flaky", "bad", "hopeless"} {
		subj, v := ballot("u1", node)
		if _, err := events.PublishDurable(context.Background(), js, subj, v, node); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	attempts := map[string]int{}
	run(t, js, spec, func(_ context.Context, ev eventbus.Event[*atollv1.Ballot]) error {
		mu.Lock()
		defer mu.Unlock()
		node := ev.Msg.GetVoter()
		attempts[node]++
		switch node {
		case "flaky":
			if attempts[node] < 2 {
				return eventbus.Retry(errors.New("apiserver unavailable"), 10*time.Millisecond)
			}
			return nil
		case "bad":
			return eventbus.Reject(errors.New("node name not in cluster"))
		default:
			return errors.New("always failing")
		}
	}, eventbus.ConsumeOptions{Metrics: metrics, Logger: natstest.Logger(t, 0), Backoff: func(uint64) time.Duration { return 10 * time.Millisecond }})

	poll.Eventually(t, 10*time.Second, func() error {
		if n := metrics.HandledCount(spec.Name, eventbus.OutcomeAck); n != 1 {
			return fmt.Errorf("acked %v, want 1", n)
		}
		if n := metrics.TerminatedCount(spec.Name, eventbus.ReasonRejected); n != 1 {
			return fmt.Errorf("rejected %v, want 1", n)
		}
		if n := metrics.TerminatedCount(spec.Name, eventbus.ReasonMaxDeliveries); n != 1 {
			return fmt.Errorf("terminated after max deliveries %v, want 1", n)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	if attempts["flaky"] != 2 || attempts["bad"] != 1 || attempts["hopeless"] != 3 {
		t.Fatalf("attempts = %v, want flaky 2, bad 1, hopeless 3", attempts)
	}
}

// TestPublishRejectsIdentityMismatch: the publisher refuses to send a
// payload on another node's subject.
func TestPublishRejectsIdentityMismatch(t *testing.T) {
	nc, _ := setup(t)
	subj, _ := ballot("u1", "a")
	_, v := ballot("u1", "b")
	if err := events.Publish(nc, subj, v, ""); !errors.Is(err, events.ErrIdentity) {
		t.Fatalf("Publish = %v, want ErrIdentity", err)
	}
	probeSubj, _ := events.ProbeSubject("u1", "a")
	if err := events.Publish(nc, probeSubj, v, ""); err == nil {
		t.Fatal("published a Ballot on a probe subject")
	}
}

// TestConsumeSeen: a Shared or Follow consumer asks Seen before
// decoding; a message Seen claims is skipped undecoded (even one that
// would not decode: it was handled elsewhere; a Shared consumer acks it)
// and counted as seen, the others are decoded and handled; Seen is given
// the subject and the stored time.
func TestConsumeSeen(t *testing.T) {
	for _, spec := range modes() {
		t.Run(spec.Mode.String(), func(t *testing.T) {
			_, js := setup(t)
			metrics := eventbus.NewMetrics(nil)
			before := time.Now().Add(-time.Second)
			seenSubj, _ := ballot("u1", "seen")
			for _, node := range []string{"n1", "seen", "n2"} {
				publishBallot(t, js, node)
			}
			if _, err := js.PublishMsg(context.Background(), &nats.Msg{Subject: seenSubj, Header: nats.Header{events.HeaderType: {"atoll.v1.Ballot"}}, Data: []byte{0xff}}); err != nil {
				t.Fatal(err)
			}
			var got received
			var badTime sync.Once
			c, err := eventbus.NewConsumer(js, spec, func(_ context.Context, ev eventbus.Event[*atollv1.Ballot]) error {
				got.add(ev.Msg.GetVoter())
				return nil
			}, eventbus.ConsumeOptions{Metrics: metrics, Logger: natstest.Logger(t, 0), Seen: func(subject string, stored time.Time) bool {
				if stored.Before(before) || stored.After(time.Now()) {
					badTime.Do(func() { t.Errorf("Seen given stored time %v", stored) })
				}
				return subject == seenSubj
			}})
			if err != nil {
				t.Fatal(err)
			}
			start(t, c)
			poll.Eventually(t, 10*time.Second, func() error {
				if got.count() != 2 || metrics.HandledCount(spec.Name, eventbus.OutcomeSeen) != 2 {
					return fmt.Errorf("handled %d, %v seen; want n1, n2 and 2 seen", got.count(), metrics.HandledCount(spec.Name, eventbus.OutcomeSeen))
				}
				if spec.Mode != events.Shared {
					return nil
				}
				info, err := consumerInfo(js, spec.Name)
				if err != nil {
					return err
				}
				if info.NumAckPending != 0 || info.NumPending != 0 {
					return fmt.Errorf("ack pending %d, pending %d", info.NumAckPending, info.NumPending)
				}
				return nil
			})
			if n := metrics.TerminatedCount(spec.Name, eventbus.ReasonUndecodable); n != 0 {
				t.Fatalf("a message Seen claimed was decoded and terminated (%v)", n)
			}
		})
	}
}
