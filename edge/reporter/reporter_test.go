package reporter

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// held is a ViewSource whose fingerprints the test sets.
type held struct {
	mu         sync.Mutex
	assignment string
	view       string
	ch         chan struct{}
}

func (h *held) Fingerprints() (string, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.assignment, h.view
}
func (h *held) Changes() <-chan struct{} { return h.ch }
func (h *held) set(a, v string) {
	h.mu.Lock()
	h.assignment, h.view = a, v
	h.mu.Unlock()
	h.ch <- struct{}{}
}

// TestReportsViewsHeld: reports carry the fingerprints of the views the
// agent holds, and a change of them is reported without waiting for the
// period.
func TestReportsViewsHeld(t *testing.T) {
	h := natstest.Hub(t)
	cnc, err := h.Connect("cloud")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cnc.Close)
	cloud, _ := jetstream.NewWithDomain(cnc, h.Domain())
	if err := eventbus.EnsureStreams(context.Background(), cloud, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	edge := natstest.Edge(t, h, "n1", natstest.EdgeOptions{})
	nc, err := edge.Connect("agent")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.NewWithDomain(nc, h.Domain())

	cfg := DefaultConfig()
	cfg.Period = time.Hour
	r, err := New(cfg, edge, hublink.Of(nc, js), nil, natstest.Logger(t, slog.LevelWarn))
	if err != nil {
		t.Fatal(err)
	}
	views := &held{assignment: "a1", view: "v1", ch: make(chan struct{}, 1)}
	r.SetViewSource(views)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	poll.Eventually(t, 10*time.Second, last(t, cloud, "a1", "v1"))
	views.set("a2", "v2")
	poll.Eventually(t, 5*time.Second, last(t, cloud, "a2", "v2"))
}

// last checks the last report of n1 the hub stored.
func last(t *testing.T, js jetstream.JetStream, assignment, view string) func() error {
	return func() error {
		st, err := js.Stream(context.Background(), events.StreamTopology)
		if err != nil {
			return err
		}
		subj, _ := events.TopologySubject("n1")
		raw, err := st.GetLastMsgForSubject(context.Background(), subj)
		if err != nil {
			return err
		}
		u := &atollv1.TopologyUpdate{}
		if err := proto.Unmarshal(raw.Data, u); err != nil {
			t.Fatal(err)
		}
		if u.GetAssignmentFingerprint() != assignment || u.GetUnitViewFingerprint() != view {
			return poll.Errorf("last report holds %q %q, want %q %q", u.GetAssignmentFingerprint(), u.GetUnitViewFingerprint(), assignment, view)
		}
		return nil
	}
}
