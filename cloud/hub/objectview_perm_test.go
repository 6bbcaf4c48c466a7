package hub_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestEdgeObjectViewPermissions: an edge reads the object views of its own
// unit (the endpoints proxy's consumer on atoll.view.<unit>.>, or one kind
// of it, and direct gets of one object) and the shared views
// (atoll.view._all.>), and none of another unit's: in particular not its
// Nodes in full. The same goes for the views as the hub republishes them
// (atoll.viewpub.>): the hub sends a leaf only its own spaces'.
func TestEdgeObjectViewPermissions(t *testing.T) {
	h := natstest.Hub(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cloud, err := h.Connect("cloud")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cloud.Close)
	cjs, err := jetstream.NewWithDomain(cloud, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	if err := eventbus.EnsureStreams(ctx, cjs, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	own := []string{"atoll.view.u1.endpointslices.default.web-1", "atoll.view.u1.services.default.web", "atoll.view.u1.nodes._.a",
		"atoll.view._all.services.default.web", "atoll.view._all.nodes._.c"}
	other := []string{"atoll.view.u2.endpointslices.default.web-1", "atoll.view.u2.nodes._.c"}
	for _, s := range append(own, other...) {
		if _, err := cjs.Publish(ctx, s, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	u1 := natstest.Unit(t, h, "u1", natstest.EdgeOptions{}, "a")
	poll.Eventually(t, 20*time.Second, func() error {
		if !u1[0].Status().HubConnected {
			return fmt.Errorf("a not linked")
		}
		return nil
	})
	a, err := u1[0].Connect("proxy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	ajs, err := jetstream.NewWithDomain(a, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 3*time.Second) }

	// The republished views (edge/viewfeed): the hub sends the leaf the
	// views of its own spaces only, however wide the agent subscribes.
	heard := make(chan string, 64)
	for _, f := range []string{"atoll.viewpub.u1.>", "atoll.viewpub._all.>", "atoll.viewpub.u2.>", "atoll.viewpub.>"} {
		if _, err := a.Subscribe(f, func(m *nats.Msg) { heard <- m.Subject }); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	republished := map[string]bool{}
	poll.Eventually(t, 20*time.Second, func() error {
		// Publish again until the leaf's interest has reached the hub.
		for _, s := range append(other, own...) {
			if _, err := cjs.Publish(ctx, s, []byte("v")); err != nil {
				return err
			}
		}
		for {
			select {
			case s := <-heard:
				republished[s] = true
				continue
			case <-time.After(200 * time.Millisecond):
			}
			break
		}
		for _, s := range own {
			if pub, _ := events.Republished(s); !republished[pub] {
				return fmt.Errorf("a has not heard %s", pub)
			}
		}
		return nil
	})
	for _, s := range other {
		if pub, _ := events.Republished(s); republished[pub] {
			t.Errorf("a heard another unit's %s", pub)
		}
	}

	// Its unit's views, all kinds and one kind; the shared views.
	for _, filter := range []string{"atoll.view.u1.>", "atoll.view.u1.endpointslices.>", "atoll.view._all.>"} {
		var cons jetstream.Consumer
		poll.Eventually(t, 20*time.Second, func() error {
			cctx, cancel := short()
			defer cancel()
			cons, err = ajs.OrderedConsumer(cctx, events.StreamViews, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
			return err
		})
		batch, err := cons.Fetch(10, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			if !strings.HasPrefix(m.Subject(), strings.TrimSuffix(filter, ">")) {
				t.Errorf("%s: got %s", filter, m.Subject())
			}
		}
		if n == 0 {
			t.Errorf("%s: no view delivered", filter)
		}
	}
	// Another unit's: no consumer, no direct get.
	// Nor another unit's Nodes in full, nor every unit's, nor a filter
	// that takes in the shared space with others.
	for _, filter := range []string{"atoll.view.u2.>", "atoll.view.u2.endpointslices.>", "atoll.view.*.endpointslices.>",
		"atoll.view.u2.nodes.>", "atoll.view.u2.nodes._.c", "atoll.view.*.nodes._.c", "atoll.view.>"} {
		cctx, cancel := short()
		if _, err := ajs.OrderedConsumer(cctx, events.StreamViews, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}}); err == nil {
			t.Errorf("a created a consumer on %s", filter)
		}
		cancel()
	}
	views, err := ajs.Stream(ctx, events.StreamViews)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range own {
		cctx, cancel := short()
		if _, err := views.GetLastMsgForSubject(cctx, s); err != nil {
			t.Errorf("a cannot read %s: %v", s, err)
		}
		cancel()
	}
	for _, s := range other {
		cctx, cancel := short()
		if _, err := views.GetLastMsgForSubject(cctx, s); err == nil {
			t.Errorf("a read %s", s)
		}
		cancel()
	}
}
