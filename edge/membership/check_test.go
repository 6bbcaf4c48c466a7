package membership

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/testenv/natstest"
	"github.com/atoll-edge/atoll/internal/testenv/poll"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// agentFixture is one agent's membership on a real edge server leafed to
// a real hub, and the cloud's side of the hub to publish views with.
type agentFixture struct {
	cloud jetstream.JetStream
	edge  interface{ SetLeafEnabled(bool) error }
	m     *Membership
}

const checkPeriod = 500 * time.Millisecond

func newAgent(t *testing.T, logs ...*slog.Logger) *agentFixture {
	t.Helper()
	log := natstest.Logger(t, slog.LevelInfo)
	if len(logs) > 0 {
		log = logs[0]
	}
	h := natstest.Hub(t)
	cnc, err := h.Connect("cloud")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cnc.Close)
	cloud, err := jetstream.NewWithDomain(cnc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	if err := events.EnsureStreams(context.Background(), cloud, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	// The agent moves between units here, which a node's own credentials
	// follow only through renewal (edge/enroll): the edge server links
	// with a service identity. That an agent with its own node's
	// credentials reads back its views is shown in edge/edgeapp.
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	userJWT, err := h.Issuer().Service("n1", pub)
	if err != nil {
		t.Fatal(err)
	}
	edge := natstest.Edge(t, h, "n1", natstest.EdgeOptions{Seed: string(seed), UserJWT: userJWT})
	nc, err := edge.Connect("agent")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{CheckPeriod: checkPeriod}, edge, hublink.Of(nc, js), log, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return &agentFixture{cloud: cloud, edge: edge, m: m}
}

func (f *agentFixture) assign(t *testing.T, unit string) {
	t.Helper()
	subj, _ := events.AssignmentSubject("n1")
	a := &atollv1.NodeAssignment{Node: "n1", Unit: unit, RouteUser: "unit-" + unit, RoutePassword: "pw", Fingerprint: "a-" + unit, Time: timestamppb.Now()}
	if _, err := events.PublishDurable(context.Background(), f.cloud, subj, a, ""); err != nil {
		t.Fatal(err)
	}
}

// view publishes unit's view with n members n1..nn.
func (f *agentFixture) view(t *testing.T, unit string, n int) {
	t.Helper()
	subj, _ := events.UnitViewSubject(unit)
	v := &atollv1.UnitView{Unit: unit, Fingerprint: fmt.Sprintf("v-%s-%d", unit, n), Time: timestamppb.Now()}
	for i := 1; i <= n; i++ {
		v.Members = append(v.Members, &atollv1.UnitMember{Name: fmt.Sprintf("n%d", i), RouteUrl: fmt.Sprintf("nats-route://127.0.0.1:%d", 7000+i)})
	}
	if _, err := events.PublishDurable(context.Background(), f.cloud, subj, v, ""); err != nil {
		t.Fatal(err)
	}
}

// holds polls until the agent holds unit's view with n members and is
// ready, within timeout.
func (f *agentFixture) holds(t *testing.T, unit string, n int, timeout time.Duration) {
	t.Helper()
	poll.Eventually(t, timeout, func() error {
		v := f.m.Current()
		if v.Unit != unit || len(v.Members) != n {
			return poll.Errorf("agent holds unit %q with %d members, want %q with %d", v.Unit, len(v.Members), unit, n)
		}
		return f.m.Ready(context.Background())
	})
}

func (f *agentFixture) consumers(t *testing.T, act func(ctx context.Context, name string) error) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := f.cloud.Stream(ctx, events.StreamViews)
	if err != nil {
		t.Fatal(err)
	}
	names := st.ConsumerNames(ctx)
	n := 0
	for name := range names.Name() {
		if err := act(ctx, name); err != nil {
			t.Fatalf("consumer %s: %v", name, err)
		}
		n++
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFirstViewAfterJoin: the cloud publishes the assignment and at once
// the unit view, as it does for a new node. Joining the unit renames the node's NATS
// cluster, which restarts its leaf link just as the unit view's follower
// is created; its first delivery can be lost on the way, and nothing
// later shows the gap (the view does not change). The agent holds the
// view within two check periods of the link coming back.
func TestFirstViewAfterJoin(t *testing.T) {
	f := newAgent(t)
	f.assign(t, "u1")
	f.view(t, "u1", 3)
	f.holds(t, "u1", 3, 2*checkPeriod+3*time.Second)
}

// stall waits until the agent's two followers exist on the hub and pauses
// every consumer of the stream.
func (f *agentFixture) stall(t *testing.T) {
	t.Helper()
	poll.Eventually(t, 10*time.Second, func() error {
		f.m.mu.Lock()
		a, u := f.m.assignCons, f.m.unitCons
		f.m.mu.Unlock()
		if a == nil || u == nil || a.Ready() != nil || u.Ready() != nil {
			return poll.Errorf("followers not running and caught up yet")
		}
		if n := f.consumers(t, func(context.Context, string) error { return nil }); n < 2 {
			return poll.Errorf("%d consumers on the hub, want the agent's 2 followers", n)
		}
		return nil
	})
	f.consumers(t, func(ctx context.Context, name string) error {
		_, err := f.cloud.PauseConsumer(ctx, events.StreamViews, name, time.Now().Add(time.Hour))
		return err
	})
}

// setupWait bounds a test's first view: the agent's first consumer can take
// a create timeout and a retry while a busy machine restarts the leaf link
// it joined the unit with. What each test asserts has its own, tight bound.
const setupWait = 30 * time.Second

// TestCatchUpStalledFollower: the agent's followers are stalled on the
// hub (paused: they heartbeat and deliver nothing, like a consumer whose
// delivery was lost); a new view is published. The agent notices it is
// behind and holds the new view within two check periods, and counts the
// catch-up.
func TestCatchUpStalledFollower(t *testing.T) {
	f := newAgent(t)
	f.assign(t, "u1")
	f.view(t, "u1", 2)
	f.holds(t, "u1", 2, setupWait)

	f.stall(t)
	before := counter(t, f.m.metrics.catchups.WithLabelValues("unit_view"))
	f.view(t, "u1", 3)
	f.holds(t, "u1", 3, 2*checkPeriod+time.Second)
	if n := counter(t, f.m.metrics.catchups.WithLabelValues("unit_view")) - before; n != 1 {
		t.Fatalf("catchups{view=unit_view} grew by %v, want 1", n)
	}

	// The stalled assignment follower: a move to another unit is caught
	// up too, and the new unit's view followed.
	f.stall(t)
	f.view(t, "u2", 4)
	f.assign(t, "u2")
	f.holds(t, "u2", 4, 2*checkPeriod+2*time.Second)
}

// TestCatchUpAfterLeafFlap: while the agent's leaf link is down, its
// followers are deleted on the hub (the deletion notice cannot reach it)
// and a new view is published. Once the link is back the agent holds the
// new view within two check periods, without waiting for its followers to
// miss heartbeats.
func TestCatchUpAfterLeafFlap(t *testing.T) {
	f := newAgent(t)
	f.assign(t, "u1")
	f.view(t, "u1", 2)
	f.holds(t, "u1", 2, setupWait)

	if err := f.edge.SetLeafEnabled(false); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, func() error {
		if f.m.node.Status().HubConnected {
			return poll.Errorf("leaf link still up")
		}
		return nil
	})
	f.consumers(t, func(ctx context.Context, name string) error {
		return f.cloud.DeleteConsumer(ctx, events.StreamViews, name)
	})
	f.view(t, "u1", 3)
	if err := f.edge.SetLeafEnabled(true); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, func() error {
		if !f.m.node.Status().HubConnected {
			return poll.Errorf("leaf link still down")
		}
		return nil
	})
	f.holds(t, "u1", 3, 2*checkPeriod+time.Second)
}

// TestCatchUpRecreatedStream: the hub loses the VIEWS stream and it is
// created again (a hub restarted without its store): sequences start
// over below the ones the agent holds, where its ordered followers would
// wait. The agent takes the recreated stream's values.
func TestCatchUpRecreatedStream(t *testing.T) {
	f := newAgent(t)
	f.assign(t, "u1")
	for n := 1; n <= 5; n++ { // push the sequences up
		f.view(t, "u1", n)
	}
	f.holds(t, "u1", 5, setupWait)

	ctx := context.Background()
	if err := f.cloud.DeleteStream(ctx, events.StreamViews); err != nil {
		t.Fatal(err)
	}
	if err := events.EnsureStreams(ctx, f.cloud, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	f.assign(t, "u1")
	f.view(t, "u1", 2)
	f.holds(t, "u1", 2, 3*checkPeriod+2*time.Second)
}

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestCheckFailureWarnsOnce: with the leaf link up, checks that cannot
// read the stream (here: it was deleted) are counted and logged at WARN
// once, not once per check; a check that works again says so.
func TestCheckFailureWarnsOnce(t *testing.T) {
	var logs natstest.Buffer
	f := newAgent(t, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	f.assign(t, "u1")
	f.view(t, "u1", 2)
	f.holds(t, "u1", 2, setupWait)

	ctx := context.Background()
	if err := f.cloud.DeleteStream(ctx, events.StreamViews); err != nil {
		t.Fatal(err)
	}
	const warning = "cannot compare the views held with the stream"
	poll.Eventually(t, 10*time.Second, func() error {
		if !strings.Contains(logs.String(), warning) {
			return poll.Errorf("no WARN about failing checks yet")
		}
		return nil
	})
	errs := counter(t, f.m.metrics.checkErrors)
	poll.Eventually(t, 10*time.Second, func() error {
		if n := counter(t, f.m.metrics.checkErrors); n < errs+3 {
			return poll.Errorf("%v more failed checks, want 3", n-errs)
		}
		return nil
	})
	if n := strings.Count(logs.String(), warning); n != 1 {
		t.Fatalf("%d WARN lines about failing checks, want 1", n)
	}
	if err := events.EnsureStreams(ctx, f.cloud, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	f.assign(t, "u1")
	f.view(t, "u1", 3)
	f.holds(t, "u1", 3, 5*time.Second)
	poll.Eventually(t, 5*time.Second, func() error {
		if !strings.Contains(logs.String(), "works again") {
			return poll.Errorf("no line saying the check works again")
		}
		return nil
	})
}
