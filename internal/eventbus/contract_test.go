package eventbus_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// captured is a logger whose output the test reads; it is printed when
// the test fails.
func captured(t *testing.T) (*slog.Logger, *natstest.Buffer) {
	t.Helper()
	var buf natstest.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), &buf
}

// modes are the two consumer modes, each with a spec of MaxDeliver 3 that
// reads every ballot from the start.
func modes() []events.ConsumerSpec {
	shared := events.BallotConsumer
	shared.Name = "t-shared"
	shared.DeliverPolicy = jetstream.DeliverAllPolicy
	shared.MaxDeliver = 3
	follow := events.FollowSpec("t-follow", events.StreamHealth, events.BallotSubjects)
	follow.DeliverPolicy = jetstream.DeliverAllPolicy
	follow.MaxDeliver = 3
	return []events.ConsumerSpec{shared, follow}
}

// nodes records the voters of the ballots a handler saw, with attempts.
type nodes struct {
	mu       sync.Mutex
	attempts map[string]int
	done     map[string]bool
}

func newNodes() *nodes { return &nodes{attempts: map[string]int{}, done: map[string]bool{}} }

func (n *nodes) attempt(node string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.attempts[node]++
	return n.attempts[node]
}

func (n *nodes) ok(node string) { n.mu.Lock(); n.done[node] = true; n.mu.Unlock() }

func (n *nodes) has(node string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.done[node] {
		return poll.Errorf("ballot of %s not handled yet (handled %v)", node, n.done)
	}
	return nil
}

func (n *nodes) count() int { n.mu.Lock(); defer n.mu.Unlock(); return len(n.done) }

func publishBallot(t *testing.T, js jetstream.JetStream, node string) {
	t.Helper()
	subj, v := ballot("u1", node)
	if _, err := events.PublishDurable(context.Background(), js, subj, v, node+"-"+strconv.FormatInt(time.Now().UnixNano(), 36)); err != nil {
		t.Fatal(err)
	}
}

// start runs c until the test ends.
func start(t *testing.T, c *eventbus.Consumer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
}

// TestConsumeFailingHandler: a handler that keeps failing on one message
// gets it again with backoff until MaxDeliver, then the message ends in
// the terminal state (logged at ERROR, counted) and later messages are
// handled.
func TestConsumeFailingHandler(t *testing.T) {
	for _, spec := range modes() {
		t.Run(spec.Mode.String(), func(t *testing.T) {
			_, js := setup(t)
			log, logs := captured(t)
			metrics := eventbus.NewMetrics(nil)
			seen := newNodes()
			publishBallot(t, js, "hopeless")
			publishBallot(t, js, "after-1")
			c, err := eventbus.NewConsumer(js, spec, func(_ context.Context, ev eventbus.Event[*atollv1.Ballot]) error {
				node := ev.Msg.GetVoter()
				if n := seen.attempt(node); node == "hopeless" {
					if int(ev.Delivered) != n {
						return eventbus.Reject(fmt.Errorf("delivered %d on attempt %d", ev.Delivered, n))
					}
					return errors.New("apiserver says no")
				}
				seen.ok(node)
				return nil
			}, eventbus.ConsumeOptions{Logger: log, Metrics: metrics, Backoff: func(uint64) time.Duration { return 10 * time.Millisecond }})
			if err != nil {
				t.Fatal(err)
			}
			start(t, c)

			poll.Eventually(t, 10*time.Second, func() error {
				if n := metrics.TerminatedCount(spec.Name, eventbus.ReasonMaxDeliveries); n != 1 {
					return poll.Errorf("terminated after max deliveries: %v, want 1", n)
				}
				return seen.has("after-1")
			})
			seen.mu.Lock()
			attempts := seen.attempts["hopeless"]
			seen.mu.Unlock()
			if attempts != 3 {
				t.Fatalf("hopeless attempted %d times, want 3 (MaxDeliver)", attempts)
			}
			if n := metrics.HandledCount(spec.Name, eventbus.OutcomeRetry); n != 2 {
				t.Fatalf("retries counted: %v, want 2", n)
			}
			if n := metrics.TerminatedCount(spec.Name, eventbus.ReasonRejected); n != 0 {
				t.Fatalf("Delivered did not count the attempts (%v rejected)", n)
			}
			if l := logs.String(); !strings.Contains(l, `level=ERROR msg="message terminated"`) || !strings.Contains(l, "reason=max_deliveries") ||
				!strings.Contains(l, "subject=atoll.health.ballot.u1.hopeless") {
				t.Fatalf("no ERROR line for the terminated message in:\n%s", l)
			}

			// The consumer goes on with later messages, and the failed
			// one does not come back.
			publishBallot(t, js, "after-2")
			poll.Eventually(t, 10*time.Second, func() error { return seen.has("after-2") })
			if spec.Mode == events.Shared {
				poll.Eventually(t, 10*time.Second, func() error {
					info, err := js.Consumer(context.Background(), spec.Stream, spec.Name)
					if err != nil {
						return err
					}
					ci := info.CachedInfo()
					if ci.NumAckPending != 0 || ci.NumPending != 0 {
						return poll.Errorf("ack pending %d, pending %d", ci.NumAckPending, ci.NumPending)
					}
					return nil
				})
			}
			seen.mu.Lock()
			defer seen.mu.Unlock()
			if seen.attempts["hopeless"] != 3 {
				t.Fatalf("hopeless came back: %d attempts", seen.attempts["hopeless"])
			}
		})
	}
}

// TestConsumerRecreatedAfterDelete: an operator deletes the consumer on
// the server; the consumer is recreated, the loss is logged at ERROR and
// counted, and later messages are handled.
func TestConsumerRecreatedAfterDelete(t *testing.T) {
	for _, spec := range modes() {
		t.Run(spec.Mode.String(), func(t *testing.T) {
			_, js := setup(t)
			log, logs := captured(t)
			metrics := eventbus.NewMetrics(nil)
			seen := newNodes()
			c, err := eventbus.NewConsumer(js, spec, func(_ context.Context, ev eventbus.Event[*atollv1.Ballot]) error {
				seen.ok(ev.Msg.GetVoter())
				return nil
			}, eventbus.ConsumeOptions{Logger: log, Metrics: metrics, CheckInterval: 100 * time.Millisecond,
				Backoff: func(uint64) time.Duration { return 10 * time.Millisecond }})
			if err != nil {
				t.Fatal(err)
			}
			start(t, c)
			publishBallot(t, js, "n1")
			poll.Eventually(t, 10*time.Second, func() error { return seen.has("n1") })
			if up := metrics.Up(spec.Name); up != 1 {
				t.Fatalf("consumer_up = %v while consuming", up)
			}

			// Delete every consumer of the stream: the durable by name,
			// the follower's ordered consumer by whatever name it has.
			ctx := context.Background()
			stream, err := js.Stream(ctx, spec.Stream)
			if err != nil {
				t.Fatal(err)
			}
			names := stream.ConsumerNames(ctx)
			var deleted int
			for name := range names.Name() {
				if err := stream.DeleteConsumer(ctx, name); err != nil {
					t.Fatal(err)
				}
				deleted++
			}
			if deleted == 0 {
				t.Fatal("no consumer on the server to delete")
			}
			poll.Eventually(t, 10*time.Second, func() error {
				if n := metrics.RestartCount(spec.Name, eventbus.RestartLost); n < 1 {
					return poll.Errorf("restarts after loss: %v", n)
				}
				if !strings.Contains(logs.String(), `level=ERROR msg="consumer stopped; recreating it"`) {
					return poll.Errorf("no ERROR line for the lost consumer")
				}
				return nil
			})
			publishBallot(t, js, "n2")
			poll.Eventually(t, 10*time.Second, func() error {
				if up := metrics.Up(spec.Name); up != 1 {
					return poll.Errorf("consumer_up = %v", up)
				}
				return seen.has("n2")
			})
		})
	}
}

// TestConsumeSurvivesHubRestart: the hub goes away and comes back (same
// address, same store); both kinds of consumer go on with new messages.
func TestConsumeSurvivesHubRestart(t *testing.T) {
	dir := t.TempDir()
	operators := func(c *natstest.HubConfig) {
		c.StoreDir = dir
	}
	h := natstest.Hub(t, operators)
	creds := natstest.OperatorCreds(t, h.Issuer())
	u, err := url.Parse(h.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	nc, err := nats.Connect(h.ClientURL(), nats.UserCredentials(creds), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	if err := eventbus.EnsureStreams(context.Background(), js, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	log, _ := captured(t)
	metrics := eventbus.NewMetrics(nil)
	seen := map[string]*nodes{}
	for _, spec := range modes() {
		s := newNodes()
		seen[spec.Name] = s
		c, err := eventbus.NewConsumer(js, spec, func(_ context.Context, ev eventbus.Event[*atollv1.Ballot]) error {
			s.ok(ev.Msg.GetVoter())
			return nil
		}, eventbus.ConsumeOptions{Logger: log, Metrics: metrics, CheckInterval: 200 * time.Millisecond,
			Backoff: func(uint64) time.Duration { return 50 * time.Millisecond }})
		if err != nil {
			t.Fatal(err)
		}
		start(t, c)
	}
	publishBallot(t, js, "before")
	poll.Eventually(t, 10*time.Second, func() error {
		for _, s := range seen {
			if err := s.has("before"); err != nil {
				return err
			}
		}
		return nil
	})

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, func() error {
		if nc.IsConnected() {
			return poll.Errorf("still connected")
		}
		return nil
	})
	natstest.Hub(t, operators, func(c *natstest.HubConfig) { c.ClientPort = port })

	// Publish until the client is back; then both consumers get it.
	poll.Eventually(t, 30*time.Second, func() error {
		subj, v := ballot("u1", "after")
		pctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := events.PublishDurable(pctx, js, subj, v, "after"); err != nil {
			return err
		}
		for name, s := range seen {
			if err := s.has("after"); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		return nil
	})
}

// TestCaughtUp: CaughtUp fires once the backlog present at start has been
// handled, not before; a consumer with nothing to read is caught up at once.
func TestCaughtUp(t *testing.T) {
	for _, spec := range modes() {
		t.Run(spec.Mode.String(), func(t *testing.T) {
			_, js := setup(t)
			log, _ := captured(t)
			const backlog = 20
			for i := range backlog {
				publishBallot(t, js, "n"+strconv.Itoa(i))
			}
			gate, entered := make(chan struct{}), make(chan struct{}, backlog)
			seen := newNodes()
			c, err := eventbus.NewConsumer(js, spec, func(ctx context.Context, ev eventbus.Event[*atollv1.Ballot]) error {
				entered <- struct{}{}
				select {
				case <-gate:
				case <-ctx.Done():
					return ctx.Err()
				}
				seen.ok(ev.Msg.GetVoter())
				return nil
			}, eventbus.ConsumeOptions{Logger: log, CheckInterval: 50 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Ready(); err == nil || !strings.Contains(err.Error(), spec.Name) {
				t.Fatalf("Ready before running = %v", err)
			}
			start(t, c)
			// Held at the first message: not caught up.
			select {
			case <-entered:
			case <-time.After(10 * time.Second):
				t.Fatal("no message handed to the handler")
			}
			if err := c.Ready(); err == nil {
				t.Fatal("caught up before handling the backlog")
			}
			close(gate)
			select {
			case <-c.CaughtUp():
			case <-time.After(10 * time.Second):
				t.Fatalf("not caught up after the backlog (handled %d)", seen.count())
			}
			if n := seen.count(); n != backlog {
				t.Fatalf("caught up after %d of %d messages", n, backlog)
			}
			if err := c.Ready(); err != nil {
				t.Fatal(err)
			}

			// Nothing to read: caught up at once.
			empty := spec
			empty.Name += "-empty"
			empty.FilterSubjects = []string{"atoll.health.ballot.nobody.>"}
			e, err := eventbus.NewConsumer(js, empty, func(context.Context, eventbus.Event[*atollv1.Ballot]) error { return nil }, eventbus.ConsumeOptions{Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			start(t, e)
			select {
			case <-e.CaughtUp():
			case <-time.After(10 * time.Second):
				t.Fatal("a consumer with nothing to read never caught up")
			}
		})
	}
}
