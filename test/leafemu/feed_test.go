package leafemu_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/edge/viewfeed"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/test/natstest"
)

// linked is the emulated node's leaf link for a feed: one connection,
// never replaced.
type linked struct{}

func (linked) HubLink() natsnode.HubLink { return natsnode.HubLink{ID: 1} }

// TestFeedOverTheLink: atoll-edge's own view feed (edge/viewfeed), run
// over an emulated node's link with the node's credentials, catches up
// with the view stored before it started (a JetStream delivery, whose
// stream subject rides on its ack reply) and applies the view published
// after (the hub's republished copy).
func TestFeedOverTheLink(t *testing.T) {
	h, cfg := tlsHub(t)
	_, cjs := natstest.CloudStreams(t, h)
	ctx := t.Context()
	l, nc := linkNode(t, h, cfg, "emu-1")
	js, err := jetstream.NewWithDomain(nc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	assign, err := events.AssignmentSubject("emu-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cjs.Publish(ctx, assign, []byte("first")); err != nil {
		t.Fatal(err)
	}
	applied := make(chan string, 4)
	f, err := viewfeed.New(viewfeed.DefaultConfig(), hublink.Of(nc, js), linked{}, viewfeed.Options{Name: "assignment", Filter: assign,
		Apply: func(_ context.Context, m viewfeed.Msg) error {
			if m.Subject != assign {
				t.Errorf("view applied under %q, want %q", m.Subject, assign)
			}
			applied <- string(m.Data)
			return nil
		}}, natstest.Logger(t, slog.LevelWarn), nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = f.Run(ctx) }()
	for _, want := range []string{"first", "second"} {
		select {
		case got := <-applied:
			if got != want {
				t.Fatalf("applied %q, want %q", got, want)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("view %q not applied; the hub's interest on the link: %v", want, l.Interest())
		}
		if want == "first" {
			<-f.CaughtUp()
			if _, err := cjs.Publish(ctx, assign, []byte("second")); err != nil {
				t.Fatal(err)
			}
		}
	}
}
