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
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/edge/viewfeed"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// agentFixture is one agent's membership on a real edge server leafed to
// a real hub, and the cloud's side of the hub to publish views with.
type agentFixture struct {
	cloud jetstream.JetStream
	edge  interface {
		SetLeafEnabled(bool) error
		Status() natsnode.Status
		HubLink() natsnode.HubLink
	}
	m   *Membership
	reg *prometheus.Registry
}

const checkPeriod = 500 * time.Millisecond

// newAgent starts an agent whose feeds catch up every period.
func newAgent(t *testing.T, period time.Duration) *agentFixture {
	t.Helper()
	log := natstest.Logger(t, slog.LevelInfo)
	h := natstest.Hub(t)
	_, cloud := natstest.CloudJetStream(t, h)
	if err := eventbus.EnsureStreams(context.Background(), cloud, events.DefaultStreamOptions()); err != nil {
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
	link := hublink.Of(nc, js)
	fc := viewfeed.DefaultConfig()
	fc.CheckPeriod, fc.CatchUpLinger = period, time.Second
	reg := prometheus.NewRegistry()
	feeds, err := viewfeed.NewFeeds(fc, link, edge, log, viewfeed.NewMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{}, edge, link, feeds, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return &agentFixture{cloud: cloud, edge: edge, m: m, reg: reg}
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

// catchups sums the agent's catch-ups whose labels contain match.
func (f *agentFixture) catchups(t *testing.T, match string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "atoll_viewfeed_catchups_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if strings.Contains(m.String(), match) {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
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

// linkSettled waits until the leaf link to the hub has been up on the
// same connection for settle.
func (f *agentFixture) linkSettled(t *testing.T, settle time.Duration) {
	t.Helper()
	var id uint64
	var since time.Time
	poll.Eventually(t, 20*time.Second, func() error {
		now := f.edge.HubLink().ID
		switch {
		case now == 0:
			id = 0
			return poll.Errorf("leaf link down")
		case now != id:
			id, since = now, time.Now()
			return poll.Errorf("leaf link %d new", id)
		case time.Since(since) < settle:
			return poll.Errorf("leaf link %d up for %s", id, time.Since(since).Round(time.Millisecond))
		}
		return nil
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
// the unit view, as it does for a new node. Joining the unit renames the
// node's NATS cluster, which restarts its leaf link just as the unit
// view's feed starts; its republished copy can be lost on the way, and
// nothing later shows the gap (the view does not change). The agent holds
// the view within two check periods of the link coming back.
func TestFirstViewAfterJoin(t *testing.T) {
	f := newAgent(t, checkPeriod)
	f.assign(t, "u1")
	f.view(t, "u1", 3)
	f.holds(t, "u1", 3, 2*checkPeriod+3*time.Second)
}

// setupWait bounds a test's first view: the agent's first catch-up can
// take a request timeout and a retry while a busy machine restarts the
// leaf link it joined the unit with. What each test asserts has its own,
// tight bound.
const setupWait = 30 * time.Second

// losing runs publish with the hub's republishing of VIEWS off: the views
// are stored and never reach the agent's subscriptions, like a delivery
// lost on the way, which nothing later shows when the view does not
// change again.
func (f *agentFixture) losing(t *testing.T, publish func()) {
	t.Helper()
	ctx := context.Background()
	st, err := f.cloud.Stream(ctx, events.StreamViews)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	republish := cfg.RePublish
	cfg.RePublish = nil
	if _, err := f.cloud.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	publish()
	cfg.RePublish = republish
	if _, err := f.cloud.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// TestCatchUpLostDelivery: a new view is stored but its republished copy
// never reaches the agent. The agent holds it within two check periods
// (the feeds' periodic catch-up); a move to another unit lost the same
// way is caught up too, and the new unit's view followed.
func TestCatchUpLostDelivery(t *testing.T) {
	f := newAgent(t, checkPeriod)
	f.assign(t, "u1")
	f.view(t, "u1", 2)
	f.holds(t, "u1", 2, setupWait)

	before := f.catchups(t, "unit_view")
	f.losing(t, func() { f.view(t, "u1", 3) })
	f.holds(t, "u1", 3, 2*checkPeriod+time.Second)
	// Counted once the catch-up has ended, just after it applied the view.
	poll.Eventually(t, 5*time.Second, func() error {
		if n := f.catchups(t, "unit_view") - before; n < 1 {
			return poll.Errorf("the unit view's catch-ups grew by %v, want at least 1", n)
		}
		return nil
	})

	f.losing(t, func() {
		f.view(t, "u2", 4)
		f.assign(t, "u2")
	})
	f.holds(t, "u2", 4, 2*checkPeriod+2*time.Second)
}

// TestCatchUpAfterLeafFlap: while the agent's leaf link is down a new
// view is published, and its republished copy goes nowhere. Once the
// link is back the agent holds the new view within two check periods
// (the reconnect's catch-up).
func TestCatchUpAfterLeafFlap(t *testing.T) {
	f := newAgent(t, checkPeriod)
	f.assign(t, "u1")
	f.view(t, "u1", 2)
	f.holds(t, "u1", 2, setupWait)

	if err := f.edge.SetLeafEnabled(false); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, func() error {
		if f.edge.Status().HubConnected {
			return poll.Errorf("leaf link still up")
		}
		return nil
	})
	f.view(t, "u1", 3)
	if err := f.edge.SetLeafEnabled(true); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, func() error {
		if !f.edge.Status().HubConnected {
			return poll.Errorf("leaf link still down")
		}
		return nil
	})
	f.holds(t, "u1", 3, 2*checkPeriod+time.Second)
}

// TestCatchUpRecreatedStream: the hub loses the VIEWS stream and it is
// created again (a hub restarted without its store): sequences start
// over below the ones the agent holds. The agent takes the recreated
// stream's values.
func TestCatchUpRecreatedStream(t *testing.T) {
	f := newAgent(t, checkPeriod)
	f.assign(t, "u1")
	for n := 1; n <= 5; n++ { // push the sequences up
		f.view(t, "u1", n)
	}
	f.holds(t, "u1", 5, setupWait)

	ctx := context.Background()
	if err := f.cloud.DeleteStream(ctx, events.StreamViews); err != nil {
		t.Fatal(err)
	}
	if err := eventbus.EnsureStreams(ctx, f.cloud, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	f.assign(t, "u1")
	f.view(t, "u1", 2)
	f.holds(t, "u1", 2, 3*checkPeriod+2*time.Second)
}

// TestNoConsumersInSteadyState: an agent that holds its views holds no
// consumer on the hub: its catch-ups' consumers are gone a linger after
// they ended, and a change still arrives (republished).
func TestNoConsumersInSteadyState(t *testing.T) {
	f := newAgent(t, time.Hour)
	f.assign(t, "u1")
	f.view(t, "u1", 2)
	f.holds(t, "u1", 2, setupWait)
	// The unit's mesh renames the node's cluster, which replaces its
	// leaf link; that reconnect's catch-up may come after the views are
	// held. Steady state begins once the link has stayed the same for
	// longer than a feed takes to notice a new one and catch up.
	f.linkSettled(t, 2*time.Second)
	noConsumers := func() error {
		if n := f.consumers(t, func(context.Context, string) error { return nil }); n != 0 {
			return poll.Errorf("%d consumers on VIEWS", n)
		}
		return nil
	}
	poll.Eventually(t, 20*time.Second, noConsumers)
	f.view(t, "u1", 3)
	f.holds(t, "u1", 3, 5*time.Second)
	if err := noConsumers(); err != nil {
		t.Fatal(err)
	}
}
