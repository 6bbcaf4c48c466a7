package events_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/internal/testenv/poll"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/testenv/natstest"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// TestFollowWaitsForTheHub: an edge agent that starts following a view
// while its leaf link is still down gets the view once the link is up.
func TestFollowWaitsForTheHub(t *testing.T) {
	h := natstest.Hub(t)
	hnc, err := h.Connect("cloud")
	if err != nil {
		t.Fatal(err)
	}
	defer hnc.Close()
	cloud, _ := jetstream.New(hnc)
	if err := events.EnsureStreams(context.Background(), cloud, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	proxy := natstest.NewProxy(t, h.LeafURL().Host)
	proxy.Cut()
	edge := natstest.Edge(t, h, "n1", natstest.EdgeOptions{HubURL: "nats-leaf://" + proxy.Addr()})
	nc, err := edge.Connect("agent")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.NewWithDomain(nc, h.Domain())

	var mu sync.Mutex
	var got *atollv1.NodeAssignment
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	subj, _ := events.AssignmentSubject("n1")
	go func() {
		defer close(done)
		spec := events.FollowSpec("assignment", events.StreamViews, subj)
		_ = events.Consume(ctx, js, spec, func(_ context.Context, ev events.Event[*atollv1.NodeAssignment]) error {
			mu.Lock()
			got = ev.Msg
			mu.Unlock()
			return nil
		}, events.ConsumeOptions{Logger: natstest.Logger(t, 0)})
	}()
	defer func() { cancel(); <-done }()

	if _, err := events.PublishDurable(context.Background(), cloud, subj, &atollv1.NodeAssignment{Node: "n1", Unit: "u1", Time: timestamppb.Now()}, ""); err != nil {
		t.Fatal(err)
	}
	proxy.Restore()
	poll.Eventually(t, 20*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		if got.GetUnit() != "u1" {
			return poll.Errorf("assignment not followed yet")
		}
		return nil
	})
}

// pauseAll pauses every consumer of stream on the hub for an hour: they
// stay, heartbeat, and deliver nothing — a stalled consumer, which the
// client cannot tell from a quiet subject.
func pauseAll(t *testing.T, js jetstream.JetStream, stream string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	names := st.ConsumerNames(ctx)
	n := 0
	for name := range names.Name() {
		if _, err := js.PauseConsumer(ctx, stream, name, time.Now().Add(time.Hour)); err != nil {
			t.Fatalf("pause %s: %v", name, err)
		}
		n++
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFollowRestart: a Follow consumer stalled on the server delivers
// nothing new; Restart recreates it, and the new consumer delivers the
// subject's last value at once.
func TestFollowRestart(t *testing.T) {
	h := natstest.Hub(t)
	nc, err := h.Connect("cloud")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := events.EnsureStreams(context.Background(), js, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	subj, _ := events.AssignmentSubject("n1")
	publish := func(unit string) {
		t.Helper()
		if _, err := events.PublishDurable(context.Background(), js, subj, &atollv1.NodeAssignment{Node: "n1", Unit: unit, Time: timestamppb.Now()}, ""); err != nil {
			t.Fatal(err)
		}
	}
	publish("u1")

	var mu sync.Mutex
	var got string
	spec := events.FollowSpec("assignment", events.StreamViews, subj)
	m := events.NewMetrics(nil)
	c, err := events.NewConsumer(js, spec, func(_ context.Context, ev events.Event[*atollv1.NodeAssignment]) error {
		mu.Lock()
		got = ev.Msg.GetUnit()
		mu.Unlock()
		return nil
	}, events.ConsumeOptions{Logger: natstest.Logger(t, 0), Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	unit := func(want string) func() error {
		return func() error {
			mu.Lock()
			defer mu.Unlock()
			if got != want {
				return poll.Errorf("following unit %q, want %q", got, want)
			}
			return nil
		}
	}
	poll.Eventually(t, 10*time.Second, unit("u1"))

	if n := pauseAll(t, js, events.StreamViews); n != 1 {
		t.Fatalf("paused %d consumers, want the follower's one", n)
	}
	publish("u2")
	// Stalled: three check intervals later the follower still holds u1.
	stalled := time.Now().Add(3 * time.Second)
	for time.Now().Before(stalled) {
		if unit("u1")() != nil {
			t.Fatal("a paused consumer delivered: the test does not stall it")
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.Restart()
	poll.Eventually(t, 5*time.Second, unit("u2"))
	if n := m.RestartCount(spec.Name, events.RestartStalled); n != 1 {
		t.Fatalf("restarts{reason=stalled} = %v, want 1", n)
	}
}
