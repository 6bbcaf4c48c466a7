package reporter

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/edge/natsnode"
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

// probe is a ProbeSource whose refusals the test sets.
type probe struct {
	mu       sync.Mutex
	refusals []*atollv1.ProbeRefusal
	ch       chan struct{}
}

func (p *probe) RTTs() []*atollv1.PeerRTT { return nil }
func (p *probe) Refusals() []*atollv1.ProbeRefusal {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refusals
}
func (p *probe) RefusalChanges() <-chan struct{} { return p.ch }
func (p *probe) set(r ...*atollv1.ProbeRefusal) {
	p.mu.Lock()
	p.refusals = r
	p.mu.Unlock()
	p.ch <- struct{}{}
}

// TestReportsViewsHeld: reports carry the fingerprints of the views the
// agent holds, and a change of them is reported without waiting for the
// period.
func TestReportsViewsHeld(t *testing.T) {
	cloud, edge, link := setup(t)
	cfg := DefaultConfig()
	cfg.Period = time.Hour
	r, err := New(cfg, edge, link, nil, natstest.Logger(t, slog.LevelWarn))
	if err != nil {
		t.Fatal(err)
	}
	views := &held{assignment: "a1", view: "v1", ch: make(chan struct{}, 1)}
	r.SetViewSource(views)
	run(t, r)

	poll.Eventually(t, 10*time.Second, last(t, cloud, func(u *atollv1.TopologyUpdate) error {
		return holds(u, "a1", "v1")
	}))
	views.set("a2", "v2")
	poll.Eventually(t, 5*time.Second, last(t, cloud, func(u *atollv1.TopologyUpdate) error {
		return holds(u, "a2", "v2")
	}))
}

// TestReportsRefusals: reports carry the prober's refusals, and a change
// of them is reported without waiting for the period.
func TestReportsRefusals(t *testing.T) {
	cloud, edge, link := setup(t)
	cfg := DefaultConfig()
	cfg.Period = time.Hour
	refused := &atollv1.ProbeRefusal{Plugin: "kubelet-healthz", Peer: "n2", Status: "401 Unauthorized"}
	p := &probe{refusals: []*atollv1.ProbeRefusal{refused}, ch: make(chan struct{}, 1)}
	r, err := New(cfg, edge, link, p, natstest.Logger(t, slog.LevelWarn))
	if err != nil {
		t.Fatal(err)
	}
	run(t, r)

	refusals := func(want ...*atollv1.ProbeRefusal) func() error {
		return last(t, cloud, func(u *atollv1.TopologyUpdate) error {
			got := u.GetProbeRefusals()
			if !slices.EqualFunc(got, want, func(a, b *atollv1.ProbeRefusal) bool { return proto.Equal(a, b) }) {
				return poll.Errorf("last report holds refusals %v, want %v", got, want)
			}
			return nil
		})
	}
	poll.Eventually(t, 10*time.Second, refusals(refused))
	p.set()
	poll.Eventually(t, 5*time.Second, refusals())
}

// setup starts a hub with the topology stream and an edge server n1 on
// it; it returns the cloud's JetStream, the edge server and a link of
// n1's agent.
func setup(t *testing.T) (jetstream.JetStream, *natsnode.Node, *hublink.Link) {
	t.Helper()
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
	return cloud, edge, hublink.Of(nc, js)
}

// run runs r until the test ends.
func run(t *testing.T, r *Reporter) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// holds checks the fingerprints a report carries.
func holds(u *atollv1.TopologyUpdate, assignment, view string) error {
	if u.GetAssignmentFingerprint() != assignment || u.GetUnitViewFingerprint() != view {
		return poll.Errorf("last report holds %q %q, want %q %q", u.GetAssignmentFingerprint(), u.GetUnitViewFingerprint(), assignment, view)
	}
	return nil
}

// last checks the last report of n1 the hub stored.
func last(t *testing.T, js jetstream.JetStream, check func(*atollv1.TopologyUpdate) error) func() error {
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
		return check(u)
	}
}
