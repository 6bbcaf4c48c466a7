package eventbus_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/test/poll"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/events"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
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
	if err := eventbus.EnsureStreams(context.Background(), cloud, events.DefaultStreamOptions()); err != nil {
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
		_ = eventbus.Consume(ctx, js, spec, func(_ context.Context, ev eventbus.Event[*atollv1.NodeAssignment]) error {
			mu.Lock()
			got = ev.Msg
			mu.Unlock()
			return nil
		}, eventbus.ConsumeOptions{Logger: natstest.Logger(t, 0)})
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
