package viewfeed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

const unit = "u1"

// env is a hub with VIEWS, the cloud publishing on it, and one edge node
// of unit u1 with its agent's link.
type env struct {
	t     *testing.T
	cloud jetstream.JetStream
	cnc   *nats.Conn
	node  *natsnode.Node
	link  *hublink.Link
	// leaf is what the feed sees of the node: a reconnect is only
	// noticed while it is not frozen.
	leaf *leafView
	// hubLeafs counts the leaf connections the hub holds.
	hubLeafs func() int
}

func newEnv(t *testing.T) *env {
	t.Helper()
	h := natstest.Hub(t)
	cnc, cloud := natstest.CloudStreams(t, h)
	node := natstest.Unit(t, h, unit, natstest.EdgeOptions{}, "a")[0]
	e := &env{t: t, cloud: cloud, cnc: cnc, node: node, leaf: &leafView{n: node}, hubLeafs: h.Server().NumLeafNodes}
	e.waitLinked()
	nc, err := node.Connect("agent")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	e.link = hublink.Of(nc, js)
	return e
}

// deleteViews deletes the hub's VIEWS stream; createViews creates it
// again, empty.
func (e *env) deleteViews() {
	e.t.Helper()
	if err := e.cloud.DeleteStream(e.t.Context(), events.StreamViews); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) createViews() {
	e.t.Helper()
	o := events.DefaultStreamOptions()
	o.Storage = jetstream.MemoryStorage
	if err := eventbus.EnsureStreams(e.t.Context(), e.cloud, o); err != nil {
		e.t.Fatal(err)
	}
}

// catchUpsFail waits until n more of feed "t"'s catch-ups failed than
// before the calls in then.
func catchUpsFail(t *testing.T, m *Metrics, n float64, then ...func()) {
	t.Helper()
	errs := testutil.ToFloat64(m.catchupErrors.WithLabelValues("t"))
	for _, f := range then {
		f()
	}
	poll.Eventually(t, 20*time.Second, func() error {
		if got := testutil.ToFloat64(m.catchupErrors.WithLabelValues("t")); got < errs+n {
			return fmt.Errorf("%v more failed catch-ups, want %v", got-errs, n)
		}
		return nil
	})
}

func (e *env) waitLinked() {
	e.t.Helper()
	poll.Eventually(e.t, 20*time.Second, func() error {
		if !e.node.Status().HubConnected {
			return fmt.Errorf("node not linked to the hub")
		}
		return nil
	})
}

// unlinked waits until both ends have dropped the leaf link.
func (e *env) unlinked() {
	e.t.Helper()
	poll.Eventually(e.t, 10*time.Second, func() error {
		if e.node.Status().HubConnected || e.hubLeafs() != 0 {
			return fmt.Errorf("still linked")
		}
		return nil
	})
}

// leafView is the node as the feed sees it; Freeze hides reconnects.
type leafView struct {
	n      *natsnode.Node
	frozen atomic.Bool
	held   atomic.Uint64
}

func (l *leafView) HubLink() natsnode.HubLink {
	if l.frozen.Load() {
		return natsnode.HubLink{ID: l.held.Load()}
	}
	return l.n.HubLink()
}

func (l *leafView) Freeze() { l.held.Store(l.n.HubLink().ID); l.frozen.Store(true) }
func (l *leafView) Thaw()   { l.frozen.Store(false) }

// publish stores data on view subject name of the unit's space and
// returns its sequence.
func (e *env) publish(name, data string) uint64 {
	e.t.Helper()
	ack, err := e.cloud.Publish(e.t.Context(), subject(name), []byte(data))
	if err != nil {
		e.t.Fatal(err)
	}
	return ack.Sequence
}

func subject(name string) string { return "atoll.view." + unit + ".nodes._." + name }

// consumers is how many consumers VIEWS holds on the hub.
func (e *env) consumers() int {
	e.t.Helper()
	s, err := e.cloud.Stream(e.t.Context(), events.StreamViews)
	if err != nil {
		e.t.Fatal(err)
	}
	return s.CachedInfo().State.Consumers
}

// handler records what a feed applies.
type handler struct {
	mu       sync.Mutex
	views    map[string]string // subject → data
	seqs     map[string]uint64 // subject → sequence
	applied  []Msg
	resets   int
	catchups []CatchUp
	err      error // a sequence that decreased on a subject
	// lax takes a decreasing sequence: after a view a unit peer relayed
	// under a forged sequence, the stream's next view of its subject
	// comes with a lower one.
	lax bool
}

func newHandler() *handler {
	return &handler{views: map[string]string{}, seqs: map[string]uint64{}}
}

func (h *handler) apply(_ context.Context, m Msg) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m.Seq < h.seqs[m.Subject] && h.err == nil && !h.lax {
		h.err = fmt.Errorf("%s: sequence %d after %d", m.Subject, m.Seq, h.seqs[m.Subject])
	}
	h.views[m.Subject], h.seqs[m.Subject] = string(m.Data), m.Seq
	h.applied = append(h.applied, m)
	return nil
}

func (h *handler) options(name string) Options {
	return Options{
		Name: name, Filter: "atoll.view." + unit + ".>", Apply: h.apply,
		Reset: func(context.Context) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.resets++
			clear(h.seqs)
		},
		CaughtUp: func(_ context.Context, c CatchUp) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.catchups = append(h.catchups, c)
		},
	}
}

// holds waits until the handler holds want.
func (h *handler) holds(t testing.TB, want map[string]string) {
	t.Helper()
	poll.Eventually(t, 20*time.Second, func() error {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.err != nil {
			t.Fatal(h.err)
		}
		for s, v := range want {
			if h.views[s] != v {
				return fmt.Errorf("%s holds %q, want %q", s, h.views[s], v)
			}
		}
		return nil
	})
}

func (h *handler) count() int { h.mu.Lock(); defer h.mu.Unlock(); return len(h.applied) }

func testConfig() Config {
	c := DefaultConfig()
	c.CatchUpLinger = time.Second
	return c
}

// run starts a feed and waits for its first catch-up.
func (e *env) run(cfg Config, o Options) (*Feed, *Metrics) {
	e.t.Helper()
	m := NewMetrics(nil)
	f, err := New(cfg, e.link, e.leaf, o, natstest.Logger(e.t, -4), m)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Run(ctx) }()
	e.t.Cleanup(func() { cancel(); <-done })
	select {
	case <-f.CaughtUp():
	case <-time.After(20 * time.Second):
		e.t.Fatal("the feed did not catch up")
	}
	return f, m
}

func catchups(m *Metrics, feed, reason string) int {
	return int(testutil.ToFloat64(m.catchups.WithLabelValues(feed, reason)))
}

func viaCount(m *Metrics, feed, via string) int {
	return int(testutil.ToFloat64(m.applied.WithLabelValues(feed, via)))
}

// noConsumers waits until the hub holds no consumer on VIEWS.
func (e *env) noConsumers() {
	e.t.Helper()
	poll.Eventually(e.t, 20*time.Second, func() error {
		if n := e.consumers(); n != 0 {
			return fmt.Errorf("VIEWS holds %d consumers", n)
		}
		return nil
	})
}

// TestDeliveredAtOnce: the views stored before start come with the
// start's catch-up, whose consumer is gone soon after; a change then
// comes republished, with no catch-up and no consumer on the hub.
func TestDeliveredAtOnce(t *testing.T) {
	e := newEnv(t)
	e.publish("x", "x1")
	e.publish("y", "y1")
	h := newHandler()
	_, m := e.run(testConfig(), h.options("t"))
	h.holds(t, map[string]string{subject("x"): "x1", subject("y"): "y1"})
	e.noConsumers()

	e.publish("x", "x2")
	e.publish("z", "z1")
	h.holds(t, map[string]string{subject("x"): "x2", subject("z"): "z1"})
	if n := e.consumers(); n != 0 {
		t.Fatalf("VIEWS holds %d consumers while the feed follows", n)
	}
	if got := viaCount(m, "t", viaCore); got != 2 {
		t.Errorf("%d views applied from the republished subject, want 2", got)
	}
	if got := catchups(m, "t", ReasonStart); got != 1 {
		t.Errorf("%d start catch-ups, want 1", got)
	}
	for _, r := range reasons[1:] {
		if got := catchups(m, "t", r); got != 0 {
			t.Errorf("%d catch-ups for %s, want none", got, r)
		}
	}
}

// republish sends a copy of a stored view on its republished subject, as
// the hub would: a duplicate, or a view arriving late.
func (e *env) republish(name, data string, seq, prev uint64) {
	e.t.Helper()
	pub, err := events.Republished(subject(name))
	if err != nil {
		e.t.Fatal(err)
	}
	msg := nats.NewMsg(pub)
	msg.Data = []byte(data)
	msg.Header.Set(jetstream.SubjectHeader, subject(name))
	msg.Header.Set(jetstream.SequenceHeader, strconv.FormatUint(seq, 10))
	msg.Header.Set(jetstream.LastSequenceHeader, strconv.FormatUint(prev, 10))
	if err := e.cnc.PublishMsg(msg); err != nil {
		e.t.Fatal(err)
	}
	if err := e.cnc.Flush(); err != nil {
		e.t.Fatal(err)
	}
}

// TestDuplicates: a view delivered twice (the same subject and sequence)
// is applied once from the republished subject, and a catch-up that
// covers it again applies it again at most: per subject, sequences never
// decrease.
func TestDuplicates(t *testing.T) {
	e := newEnv(t)
	h := newHandler()
	_, m := e.run(testConfig(), h.options("t"))
	seq := e.publish("x", "x1")
	h.holds(t, map[string]string{subject("x"): "x1"})
	marker := e.publish("y", "y1")
	h.holds(t, map[string]string{subject("y"): "y1"})
	e.republish("x", "x1", seq, 0)
	// The duplicate went before the marker's second copy; once that is
	// skipped, so was the duplicate.
	e.republish("y", "y1", marker, 0)
	poll.Eventually(t, 10*time.Second, func() error {
		if n := int(testutil.ToFloat64(m.skipped.WithLabelValues("t", skipSeen))); n < 2 {
			return fmt.Errorf("%d views skipped as seen, want 2", n)
		}
		return nil
	})
	if n := h.count(); n != 2 {
		t.Fatalf("%d views applied, want 2", n)
	}
}

// TestLinkLoss: changes made while the node's leaf link is down are all
// applied once it is back (the reconnect's catch-up), and the hub holds
// no consumer afterwards.
func TestLinkLoss(t *testing.T) {
	e := newEnv(t)
	e.publish("x", "x1")
	h := newHandler()
	_, m := e.run(testConfig(), h.options("t"))
	h.holds(t, map[string]string{subject("x"): "x1"})

	if err := e.node.SetLeafEnabled(false); err != nil {
		t.Fatal(err)
	}
	e.unlinked()
	e.publish("x", "x2")
	e.publish("y", "y1")
	if err := e.node.SetLeafEnabled(true); err != nil {
		t.Fatal(err)
	}
	h.holds(t, map[string]string{subject("x"): "x2", subject("y"): "y1"})
	catchupsReach(t, m, ReasonReconnect, 1, -1)
	e.noConsumers()
}

// cutUnnoticed drops the node's leaf link and brings it back without the
// feed noticing the reconnect, runs during the drop, and waits until the
// link is up again.
func (e *env) cutUnnoticed(during func()) {
	e.t.Helper()
	e.leaf.Freeze()
	if err := e.node.SetLeafEnabled(false); err != nil {
		e.t.Fatal(err)
	}
	e.unlinked()
	during()
	if err := e.node.SetLeafEnabled(true); err != nil {
		e.t.Fatal(err)
	}
	e.waitLinked()
}

// publishUntilHeard publishes name (a new value each time) until the feed
// has applied one, from the republished subject: the leaf's interest
// reaches the hub a moment after the link.
func (e *env) publishUntilHeard(h *handler, name string) (string, uint64) {
	e.t.Helper()
	var val string
	var seq uint64
	poll.Eventually(e.t, 20*time.Second, func() error {
		h.mu.Lock()
		got := h.views[subject(name)]
		h.mu.Unlock()
		if got != "" && got == val {
			return nil
		}
		val = fmt.Sprintf("%s-%d", name, time.Now().UnixNano())
		seq = e.publish(name, val)
		return fmt.Errorf("%s not heard yet", name)
	})
	return val, seq
}

// hearFresh publishes a view until the feed applies one, on a subject of
// its own at each try: a try lost while the link comes back (the leaf's
// interest reaches the hub a moment after the link) leaves no gap on its
// subject for the next one to reveal, so nothing is caught up by it.
func (e *env) hearFresh(h *handler) {
	e.t.Helper()
	try := 0
	poll.Eventually(e.t, 20*time.Second, func() error {
		try++
		name := fmt.Sprintf("y%d", try)
		e.publish(name, "v")
		deadline := time.Now().Add(500 * time.Millisecond)
		for time.Now().Before(deadline) {
			h.mu.Lock()
			got := h.views[subject(name)]
			h.mu.Unlock()
			if got == "v" {
				return nil
			}
			time.Sleep(10 * time.Millisecond)
		}
		return fmt.Errorf("%s not heard", name)
	})
}

// TestReconnectRace: views republished after the link is back are
// applied before the agent learns of the reconnect; a view lost during
// the drop (another subject, below what was applied) is still caught up,
// because catch-ups read from the verified cursor, not from the last
// view applied.
func TestReconnectRace(t *testing.T) {
	e := newEnv(t)
	e.publish("x", "x1")
	h := newHandler()
	_, m := e.run(testConfig(), h.options("t"))
	h.holds(t, map[string]string{subject("x"): "x1"})
	e.noConsumers()

	e.cutUnnoticed(func() { e.publish("x", "x2") })
	e.hearFresh(h)
	h.mu.Lock()
	lost := h.views[subject("x")]
	h.mu.Unlock()
	if lost != "x1" {
		t.Fatalf("x holds %q before the feed learnt of the reconnect, want the lost x2 missing", lost)
	}
	if got := catchups(m, "t", ReasonReconnect); got != 0 {
		t.Fatalf("%d reconnect catch-ups while frozen", got)
	}
	e.leaf.Thaw()
	h.holds(t, map[string]string{subject("x"): "x2"})
	catchupsReach(t, m, ReasonReconnect, 1, 1)
}

// TestGap: a view whose subject's previous sequence the feed never saw
// (lost while the link was down, the reconnect not noticed) starts a
// catch-up at once.
func TestGap(t *testing.T) {
	e := newEnv(t)
	e.publish("x", "x1")
	h := newHandler()
	_, m := e.run(testConfig(), h.options("t"))
	h.holds(t, map[string]string{subject("x"): "x1"})

	e.cutUnnoticed(func() {
		e.publish("x", "x2")
		e.publish("w", "w1") // another subject, lost too
	})
	e.publishUntilHeard(h, "x")
	h.holds(t, map[string]string{subject("w"): "w1"})
	if got := int(testutil.ToFloat64(m.gaps.WithLabelValues("t"))); got < 1 {
		t.Errorf("%d gaps, want at least 1", got)
	}
	catchupsReach(t, m, ReasonGap, 1, -1)
}

// TestOutOfOrder: a view arriving after a later one, never seen, starts
// a catch-up, which applies what the stream holds; its own late copy is
// not applied over the newer value.
func TestOutOfOrder(t *testing.T) {
	e := newEnv(t)
	h := newHandler()
	_, m := e.run(testConfig(), h.options("t"))
	var late uint64
	e.cutUnnoticed(func() { late = e.publish("w", "w1") })
	// Something heard after the cut (that would catch w1 up before its
	// late copy).
	e.hearFresh(h)
	e.republish("w", "w1", late, 0)
	h.holds(t, map[string]string{subject("w"): "w1"})
	catchupsReach(t, m, ReasonOutOfOrder, 1, 1)
}

// catchupsReach waits until feed t's catch-ups for reason number at
// least least, then fails if they are more than most (-1: no bound). The
// views a catch-up applies are applied before it completes and is
// counted, so a test that saw them polls for the count.
func catchupsReach(t *testing.T, m *Metrics, reason string, least, most int) {
	t.Helper()
	poll.Eventually(t, 10*time.Second, func() error {
		if got := catchups(m, "t", reason); got < least {
			return fmt.Errorf("%d %s catch-ups, want at least %d", got, reason, least)
		}
		return nil
	})
	if got := catchups(m, "t", reason); most >= 0 && got > most {
		t.Errorf("%d %s catch-ups, want at most %d", got, reason, most)
	}
}

// firstRun runs a feed until its first catch-up and stops it; it
// returns what that catch-up told its handler (the cursor a restart
// starts from).
func (e *env) firstRun() CatchUp {
	e.t.Helper()
	h := newHandler()
	ctx, cancel := context.WithCancel(context.Background())
	f, err := New(testConfig(), e.link, e.leaf, h.options("t"), natstest.Logger(e.t, 0), nil)
	if err != nil {
		e.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Run(ctx) }()
	<-f.CaughtUp()
	cancel()
	<-done
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.catchups[len(h.catchups)-1]
}

// TestRestart: a feed started from the verified cursor of an earlier run
// reads only what was stored after it.
func TestRestart(t *testing.T) {
	e := newEnv(t)
	e.publish("x", "x1")
	e.publish("y", "y1")
	kept := e.firstRun()

	e.publish("y", "y2")
	e.publish("z", "z1")
	h2 := newHandler()
	o := h2.options("t")
	o.Start, o.Created = kept.Verified, kept.Created
	e.run(testConfig(), o)
	h2.holds(t, map[string]string{subject("y"): "y2", subject("z"): "z1"})
	h2.mu.Lock()
	defer h2.mu.Unlock()
	for _, m := range h2.applied {
		if m.Seq <= kept.Verified {
			t.Errorf("%s seq %d applied again after a restart from %d", m.Subject, m.Seq, kept.Verified)
		}
	}
	if h2.resets != 0 {
		t.Errorf("%d resets after a restart on the same stream", h2.resets)
	}
}

// TestRestartQuiet: a feed restarted from its kept cursor on a space
// where nothing was stored since creates no consumer: the stream info
// and the space's last view say so. It is ready, its handler learns the
// same cursor, and a view stored afterwards still arrives. With direct
// gets off on the stream, the same restart catches up with a consumer.
func TestRestartQuiet(t *testing.T) {
	for _, direct := range []bool{true, false} {
		t.Run(fmt.Sprintf("direct gets %v", direct), func(t *testing.T) {
			e := newEnv(t)
			e.publish("x", "x1")
			kept := e.firstRun()
			if !direct {
				s, err := e.cloud.Stream(t.Context(), events.StreamViews)
				if err != nil {
					t.Fatal(err)
				}
				cfg := s.CachedInfo().Config
				cfg.AllowDirect = false
				if _, err := e.cloud.UpdateStream(t.Context(), cfg); err != nil {
					t.Fatal(err)
				}
			}

			created := e.createdCounter()
			h2 := newHandler()
			o := h2.options("t")
			o.Start, o.Created = kept.Verified, kept.Created
			_, m := e.run(testConfig(), o)
			if n, want := testutil.ToFloat64(m.consumers.WithLabelValues("t", ReasonStart)), map[bool]float64{true: 0, false: 1}[direct]; n != want {
				t.Fatalf("atoll_viewfeed_consumers_total{reason=start} %v, want %v", n, want)
			}
			h2.mu.Lock()
			got := h2.catchups
			h2.mu.Unlock()
			if len(got) != 1 || got[0].Verified != kept.Verified || got[0].Reloaded {
				t.Fatalf("catch-ups after the restart: %+v, want one at %d, not reloaded", got, kept.Verified)
			}
			e.publish("y", "y1")
			h2.holds(t, map[string]string{subject("y"): "y1"})
			// The hub's advisories come after its replies: counted once
			// the view stored after the restart arrived.
			if direct {
				if n := created(); n != 0 {
					t.Fatalf("%d consumers created for a restart on a space where nothing was stored", n)
				}
				return
			}
			poll.Eventually(t, 10*time.Second, func() error {
				if n := created(); n != 1 {
					return fmt.Errorf("%d consumers created for a restart on a stream without direct gets, want 1", n)
				}
				return nil
			})
		})
	}
}

// TestRebuiltStream: a cursor above the stream's last sequence, or a
// stream created at another time, means the stream was rebuilt: the
// handler is reset and the space read again in full.
func TestRebuiltStream(t *testing.T) {
	tests := []struct {
		name  string
		start func(e *env, last uint64, created time.Time) (uint64, time.Time)
	}{
		{"cursor past the end", func(_ *env, last uint64, created time.Time) (uint64, time.Time) { return last + 100, time.Time{} }},
		{"created anew", func(_ *env, last uint64, created time.Time) (uint64, time.Time) {
			return last, created.Add(-time.Hour)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.publish("x", "x1")
			last := e.publish("y", "y1")
			s, err := e.cloud.Stream(t.Context(), events.StreamViews)
			if err != nil {
				t.Fatal(err)
			}
			h := newHandler()
			o := h.options("t")
			o.Start, o.Created = tc.start(e, last, s.CachedInfo().Created)
			e.run(testConfig(), o)
			h.holds(t, map[string]string{subject("x"): "x1", subject("y"): "y1"})
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.resets != 1 || !h.catchups[0].Reloaded || h.catchups[0].Verified != last {
				t.Errorf("resets %d, catch-ups %+v; want one reset and a reload to %d", h.resets, h.catchups, last)
			}
		})
	}
}

// TestHubCluster: on a 3-server hub, views keep coming after the server
// holding VIEWS' leader is killed (the new leader republishes), and the
// feed holds the last one stored.
func TestHubCluster(t *testing.T) {
	c := natstest.NewHubCluster(t)
	cloudOn := func(i int) (*nats.Conn, jetstream.JetStream) {
		t.Helper()
		nc, err := c.Connect(c.Server(i), "cloud")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.NewWithDomain(nc, c.Domain())
		if err != nil {
			t.Fatal(err)
		}
		return nc, js
	}
	_, cloud := cloudOn(0)
	o := events.DefaultStreamOptions()
	o.Replicas, o.Storage = natstest.ClusterSize, jetstream.MemoryStorage
	poll.Eventually(t, time.Minute, func() error { return eventbus.EnsureStreams(t.Context(), cloud, o) })
	s, err := cloud.Stream(t.Context(), events.StreamViews)
	if err != nil {
		t.Fatal(err)
	}
	leader, other := -1, -1
	for i := range natstest.ClusterSize {
		if c.Server(i).Name() == s.CachedInfo().Cluster.Leader {
			leader = i
		} else {
			other = i
		}
	}
	if leader < 0 {
		t.Fatalf("VIEWS' leader %q is none of the servers", s.CachedInfo().Cluster.Leader)
	}
	// The cloud publishes through a server that stays.
	cnc, cloud := cloudOn(other)
	node := natstest.Unit(t, c, unit, natstest.EdgeOptions{}, "a")[0]
	e := &env{t: t, cloud: cloud, cnc: cnc, node: node, leaf: &leafView{n: node}}
	e.waitLinked()
	nc, err := node.Connect("agent")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, c.Domain())
	if err != nil {
		t.Fatal(err)
	}
	e.link = hublink.Of(nc, js)

	e.publish("x", "x1")
	h := newHandler()
	e.run(testConfig(), h.options("t"))
	h.holds(t, map[string]string{subject("x"): "x1"})

	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	var last string
	poll.Eventually(t, time.Minute, func() error {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		last = fmt.Sprintf("x-%d", time.Now().UnixNano())
		_, err := cloud.Publish(ctx, subject("x"), []byte(last))
		return err
	})
	e.waitLinked()
	h.holds(t, map[string]string{subject("x"): last})
}

// TestCatchUpFailureWarnsOnce: with the leaf link up, catch-ups that
// cannot read the stream (here: it was deleted) are counted, logged at
// WARN once rather than once per attempt, and shown in behind_seconds; one
// that works again says so, and the feed holds what the new stream holds.
func TestCatchUpFailureWarnsOnce(t *testing.T) {
	e := newEnv(t)
	e.publish("x", "x1")
	h := newHandler()
	var logs natstest.Buffer
	m := NewMetrics(nil)
	cfg := testConfig()
	cfg.CheckPeriod = 200 * time.Millisecond
	f, err := New(cfg, e.link, e.leaf, h.options("t"), slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})), m)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	h.holds(t, map[string]string{subject("x"): "x1"})

	e.deleteViews()
	const warning = "catch-up failed"
	poll.Eventually(t, 20*time.Second, func() error {
		if !strings.Contains(logs.String(), warning) {
			return fmt.Errorf("no WARN about failing catch-ups yet")
		}
		if testutil.ToFloat64(m.behind.WithLabelValues("t")) <= 0 {
			return fmt.Errorf("behind_seconds is 0 while catch-ups fail")
		}
		return nil
	})
	// Another failure (a light check's timeout, most of them) logs no
	// second WARN.
	catchUpsFail(t, m, 1)
	if n := strings.Count(logs.String(), warning); n != 1 {
		t.Fatalf("%d WARN lines about failing catch-ups, want 1", n)
	}
	e.createViews()
	e.publish("x", "x2")
	h.holds(t, map[string]string{subject("x"): "x2"})
	poll.Eventually(t, 20*time.Second, func() error {
		if !strings.Contains(logs.String(), "works again") {
			return fmt.Errorf("no line saying catching up works again")
		}
		if b := testutil.ToFloat64(m.behind.WithLabelValues("t")); b != 0 {
			return fmt.Errorf("behind_seconds %v after a catch-up", b)
		}
		return nil
	})
}

// TestApplyContext: Apply gets the context Run was given, not one that
// ends with the catch-up that delivered the view: a handler may start
// work that outlives it (membership follows a new unit from there).
func TestApplyContext(t *testing.T) {
	e := newEnv(t)
	e.publish("x", "x1")
	var kept atomic.Value
	o := newHandler().options("t")
	o.Apply = func(ctx context.Context, _ Msg) error { kept.Store(ctx); return nil }
	e.run(testConfig(), o)
	ctx, _ := kept.Load().(context.Context)
	if ctx == nil || ctx.Err() != nil {
		t.Fatalf("Apply's context after the catch-up: %v", ctx)
	}
}

// TestPeriodicQuiet: the periodic catch-up of a space where nothing was
// stored since the last catch-up creates no consumer on the hub (a direct
// get of its last view tells), and one where something was stored does.
func TestPeriodicQuiet(t *testing.T) {
	e := newEnv(t)
	e.publish("x", "x1")
	created := 0
	var mu sync.Mutex
	adv, err := e.cnc.Subscribe("$JS.EVENT.ADVISORY.CONSUMER.CREATED."+events.StreamViews+".>", func(*nats.Msg) {
		mu.Lock()
		created++
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = adv.Unsubscribe() })
	count := func() int { mu.Lock(); defer mu.Unlock(); return created }
	h := newHandler()
	cfg := testConfig()
	cfg.CheckPeriod = 200 * time.Millisecond
	_, m := e.run(cfg, h.options("t"))
	poll.Eventually(t, 10*time.Second, func() error {
		if n := catchups(m, "t", ReasonPeriodic); n < 3 {
			return fmt.Errorf("%d periodic catch-ups", n)
		}
		return nil
	})
	if n := count(); n != 1 {
		t.Fatalf("%d consumers created, want the start's only", n)
	}
	// Stored, and its republished copy never seen (sent elsewhere): the
	// next periodic catch-up reads it with a consumer.
	e.leaf.Freeze()
	if err := e.node.SetLeafEnabled(false); err != nil {
		t.Fatal(err)
	}
	e.unlinked()
	e.publish("y", "y1")
	if err := e.node.SetLeafEnabled(true); err != nil {
		t.Fatal(err)
	}
	e.waitLinked()
	h.holds(t, map[string]string{subject("y"): "y1"})
	if n := count(); n < 2 {
		t.Fatalf("%d consumers created, want another for the view stored unheard", n)
	}
}

// countingNode counts the asks for the leaf link.
type countingNode struct {
	n     Node
	asked atomic.Int64
}

func (c *countingNode) HubLink() natsnode.HubLink { c.asked.Add(1); return c.n.HubLink() }

// TestFeedsShareTheLeafPoll: the feeds of one agent ask the node for its
// leaf link about as often as one feed would.
func TestFeedsShareTheLeafPoll(t *testing.T) {
	e := newEnv(t)
	node := &countingNode{n: e.node}
	fs, err := NewFeeds(testConfig(), e.link, node, natstest.Logger(t, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for i := range 5 {
		o := newHandler().options(fmt.Sprintf("f%d", i))
		f, err := fs.New(o)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = f.Run(ctx) }()
	}
	start := time.Now()
	<-time.After(2 * time.Second) // a measurement window, not a wait for a state
	// One feed alone asks 4 times a second; five sharing, not much more.
	if n, per := node.asked.Load(), time.Since(start).Seconds(); float64(n)/per > 10 {
		t.Fatalf("%d asks in %.1fs for five feeds, want about one feed's 4/s", n, per)
	}
}

// createdCounter counts the consumers created on VIEWS from now on.
func (e *env) createdCounter() func() int {
	e.t.Helper()
	var n atomic.Int64
	adv, err := e.cnc.Subscribe("$JS.EVENT.ADVISORY.CONSUMER.CREATED."+events.StreamViews+".>", func(*nats.Msg) { n.Add(1) })
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = adv.Unsubscribe() })
	if err := e.cnc.Flush(); err != nil {
		e.t.Fatal(err)
	}
	return func() int { return int(n.Load()) }
}

// TestPeriodicHeard: a space that changed since the last catch-up, every
// change heard from its republished copy, costs its periodic checks no
// consumer (the last view was heard); every VerifyEvery-th check is a full
// catch-up, which reads the changes with a consumer.
func TestPeriodicHeard(t *testing.T) {
	e := newEnv(t)
	e.publish("x", "x1")
	h := newHandler()
	cfg := testConfig()
	cfg.CheckPeriod, cfg.VerifyEvery = 200*time.Millisecond, 1000
	_, m := e.run(cfg, h.options("t"))
	created := e.createdCounter()
	e.publishUntilHeard(h, "y")
	before := catchups(m, "t", ReasonPeriodic)
	poll.Eventually(t, 10*time.Second, func() error {
		if n := catchups(m, "t", ReasonPeriodic); n < before+3 {
			return fmt.Errorf("%d periodic checks since the change was heard", n-before)
		}
		return nil
	})
	if n := created(); n != 0 {
		t.Fatalf("%d consumers created by periodic checks of a space whose last view was heard, want 0", n)
	}

	e2 := newEnv(t)
	e2.publish("x", "x1")
	h2 := newHandler()
	cfg.VerifyEvery = 3
	_, m2 := e2.run(cfg, h2.options("t"))
	created2 := e2.createdCounter()
	e2.publishUntilHeard(h2, "y")
	before = catchups(m2, "t", ReasonPeriodic)
	poll.Eventually(t, 10*time.Second, func() error {
		if n := created2(); n < 1 {
			return fmt.Errorf("%d consumers created after %d periodic checks, want the full one's", n, catchups(m2, "t", ReasonPeriodic)-before)
		}
		return nil
	})
}

// TestReconnectQuiet: a reconnect after which the space's last view is
// at or below the verified cursor (nothing stored meanwhile) reads that
// view only: no consumer; one after which something was stored reads it
// with a consumer (TestLinkLoss).
func TestReconnectQuiet(t *testing.T) {
	e := newEnv(t)
	e.publish("x", "x1")
	h := newHandler()
	_, m := e.run(testConfig(), h.options("t"))
	h.holds(t, map[string]string{subject("x"): "x1"})
	created := e.createdCounter()
	if err := e.node.SetLeafEnabled(false); err != nil {
		t.Fatal(err)
	}
	e.unlinked()
	if err := e.node.SetLeafEnabled(true); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 20*time.Second, func() error {
		if n := catchups(m, "t", ReasonReconnect); n < 1 {
			return fmt.Errorf("%d reconnect catch-ups", n)
		}
		return nil
	})
	if n := created(); n != 0 {
		t.Fatalf("%d consumers created after a reconnect with nothing stored meanwhile, want 0", n)
	}
}

// TestRebuiltHeard: a stream rebuilt while the feed runs (deleted and
// made anew, its sequences starting over) is found from the first view
// republished by it, without waiting for a periodic check: the space is
// read again in full after a Reset.
func TestRebuiltHeard(t *testing.T) {
	e := newEnv(t)
	for i := range 5 {
		e.publish(fmt.Sprintf("old%d", i), "v")
	}
	h := newHandler()
	cfg := testConfig()
	cfg.CheckPeriod = time.Hour
	_, m := e.run(cfg, h.options("t"))
	h.holds(t, map[string]string{subject("old4"): "v"})
	e.deleteViews()
	e.createViews()
	e.publish("new", "n1")
	h.holds(t, map[string]string{subject("new"): "n1"})
	poll.Eventually(t, 20*time.Second, func() error {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.resets != 1 {
			return fmt.Errorf("%d resets", h.resets)
		}
		return nil
	})
	if n := catchups(m, "t", ReasonRebuilt); n != 1 {
		t.Errorf("%d catch-ups for a rebuilt stream, want 1", n)
	}
}

// TestLostPullFailsByHeartbeat: a catch-up's pull whose leaf link drops
// under it, unnoticed by the feed (a unit's routes changing while the
// agent's own connection stays up), fails by the hub's missed idle
// heartbeats rather than waiting for its deadline: the views pushed
// meanwhile queue behind the catch-up.
func TestLostPullFailsByHeartbeat(t *testing.T) {
	e := newEnv(t)
	e.publish("x", "x1")
	f, err := New(testConfig(), e.link, e.leaf, newHandler().options("t"), natstest.Logger(t, -4), NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	cons, err := e.link.JetStream().CreateConsumer(ctx, events.StreamViews, jetstream.ConsumerConfig{
		FilterSubject: "atoll.view." + unit + ".>", AckPolicy: jetstream.AckNonePolicy,
		MemoryStorage: true, Replicas: 1, InactiveThreshold: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	name := cons.CachedInfo().Name
	// A reader expecting one view more than the space holds: its second
	// pull waits at the hub, kept alive by heartbeats. Its deadline (9 s)
	// is below the 10 s from which the client asks for heartbeats of its
	// own: only the feed's ask can end the pull before the deadline.
	r := reader{f: f, pending: 1, next: 1, timeout: 9 * time.Second}
	if err := r.fetch(ctx, ctx, cons); err != nil {
		t.Fatalf("first fetch: %v", err)
	}
	r.pending = 1
	done := make(chan error, 1)
	go func() { done <- r.fetch(ctx, ctx, cons) }()
	poll.Eventually(t, 10*time.Second, func() error {
		c, err := e.cloud.Consumer(ctx, events.StreamViews, name)
		if err != nil {
			return err
		}
		info, err := c.Info(ctx)
		if err != nil {
			return err
		}
		if info.NumWaiting == 0 {
			return fmt.Errorf("no pull waiting on %s", name)
		}
		return nil
	})
	e.leaf.Freeze()
	if err := e.node.SetLeafEnabled(false); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, jetstream.ErrNoHeartbeat) {
			t.Fatalf("lost pull ended with %v, want %v", err, jetstream.ErrNoHeartbeat)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the lost pull did not fail")
	}
}

// TestReconnectLightCheckUnanswered: after a reconnect, a light check
// the hub does not answer (here the stream was deleted while the link was
// down: a direct get across the leaf link gets no answer) fails the
// catch-up, which is retried; the next goes full, and its stream info
// says what is wrong. Once the stream is back the space is read again.
func TestReconnectLightCheckUnanswered(t *testing.T) {
	e := newEnv(t)
	e.publish("x", "x1")
	h := newHandler()
	cfg := testConfig()
	cfg.CheckPeriod = time.Hour
	_, m := e.run(cfg, h.options("t"))
	h.holds(t, map[string]string{subject("x"): "x1"})
	if err := e.node.SetLeafEnabled(false); err != nil {
		t.Fatal(err)
	}
	e.unlinked()
	e.deleteViews()
	// The light check's timeout, a retry, the full catch-up's refusal.
	catchUpsFail(t, m, 2, func() {
		if err := e.node.SetLeafEnabled(true); err != nil {
			t.Fatal(err)
		}
	})
	e.createViews()
	e.publish("y", "y1")
	h.holds(t, map[string]string{subject("y"): "y1"})
}

// TestDiagnose: of the catch-ups whose light check the hub does not
// answer, the second in a row and every eighth after it read the stream
// info; the others are retried as light checks.
func TestDiagnose(t *testing.T) {
	var got []uint64
	for failures := range uint64(20) {
		if diagnose(failures) {
			got = append(got, failures+1)
		}
	}
	if want := []uint64{2, 10, 18}; !slices.Equal(got, want) {
		t.Fatalf("catch-ups that read the stream info after unanswered light checks: %v, want %v", got, want)
	}
}
