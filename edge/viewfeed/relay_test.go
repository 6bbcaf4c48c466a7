package viewfeed

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// relayEnv is a hub with VIEWS, the cloud signing the shared views it
// stores, and units of edge servers, each node with an agent following
// the shared space through its unit (Relay).
type relayEnv struct {
	t       testing.TB
	h       natstest.HubServers
	servers []*server.Server // the hub's
	domain  string
	signer  events.Signer // the cloud's view signer
	cloud   jetstream.JetStream
	nodes   map[string]*natsnode.Node
	feeds   map[string]*relayFeed
}

type relayFeed struct {
	unit    string
	node    *natsnode.Node
	h       *handler
	m       *Metrics
	cancel  context.CancelFunc
	stopped chan struct{}
}

func newRelayEnv(t testing.TB, units map[string][]string) *relayEnv {
	return newRelayEnvOf(t, units, true)
}

// newRelayEnvOf is newRelayEnv with the agents relaying or not (each then
// takes its own copy from the hub, as without Relay).
func newRelayEnvOf(t testing.TB, units map[string][]string, relay bool) *relayEnv {
	t.Helper()
	h := natstest.Hub(t)
	_, cloud := natstest.CloudStreams(t, h)
	e := &relayEnv{t: t, h: h, servers: []*server.Server{h.Server()}, domain: h.Domain(), signer: h.Issuer().ViewSigner(), cloud: cloud}
	e.startUnits(units, relay)
	return e
}

// newRelayCluster is newRelayEnv on a hub of three servers (VIEWS R3),
// the cloud publishing through the first.
func newRelayCluster(t *testing.T, units map[string][]string) *relayEnv {
	t.Helper()
	c := natstest.NewHubCluster(t)
	nc, err := c.Connect(c.Server(0), "cloud")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cloud, err := jetstream.NewWithDomain(nc, c.Domain())
	if err != nil {
		t.Fatal(err)
	}
	o := events.DefaultStreamOptions()
	o.Replicas, o.Storage = natstest.ClusterSize, jetstream.MemoryStorage
	poll.Eventually(t, time.Minute, func() error { return eventbus.EnsureStreams(t.Context(), cloud, o) })
	e := &relayEnv{t: t, h: c, domain: c.Domain(), signer: c.Issuer().ViewSigner(), cloud: cloud}
	for i := range natstest.ClusterSize {
		e.servers = append(e.servers, c.Server(i).Server())
	}
	e.startUnits(units, true)
	return e
}

func (e *relayEnv) startUnits(units map[string][]string, relay bool) {
	e.t.Helper()
	e.nodes, e.feeds = map[string]*natsnode.Node{}, map[string]*relayFeed{}
	for unit, names := range units {
		for _, n := range natstest.Unit(e.t, e.h, unit, natstest.EdgeOptions{}, names...) {
			e.nodes[n.Name()] = n
		}
	}
	for unit, names := range units {
		for _, name := range names {
			e.start(unit, name, relay)
		}
	}
}

// start runs the agent of node name in unit and waits for its first
// catch-up.
func (e *relayEnv) start(unit, name string, relay bool) {
	e.t.Helper()
	n := e.nodes[name]
	poll.Eventually(e.t, 20*time.Second, func() error {
		if !n.Status().HubConnected {
			return fmt.Errorf("%s not linked", name)
		}
		return nil
	})
	nc, err := n.Connect("agent")
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, e.domain)
	if err != nil {
		e.t.Fatal(err)
	}
	h, m := newHandler(), NewMetrics(nil)
	o := h.options("shared")
	o.Filter = events.SharedSpaceSubjects()
	if relay {
		o.Relay = &Relay{Unit: unit, Node: name, Key: n.CloudKey, Meshed: n.Meshed}
	}
	f, err := New(testConfig(), hublink.Of(nc, js), n, o, natstest.Logger(e.t, slog.LevelWarn), m)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rf := &relayFeed{unit: unit, node: n, h: h, m: m, cancel: cancel, stopped: make(chan struct{})}
	go func() { defer close(rf.stopped); _ = f.Run(ctx) }()
	e.t.Cleanup(func() { cancel(); <-rf.stopped })
	select {
	case <-f.CaughtUp():
	case <-time.After(20 * time.Second):
		e.t.Fatalf("%s: no first catch-up", name)
	}
	e.feeds[name] = rf
}

// relaying waits until every named feed follows its unit's relayed views
// only (routed to all its unit).
func (e *relayEnv) relaying(names ...string) {
	e.t.Helper()
	poll.Eventually(e.t, 30*time.Second, func() error {
		for _, name := range names {
			if d := testutil.ToFloat64(e.feeds[name].m.direct.WithLabelValues("shared")); d != 0 {
				return fmt.Errorf("%s still follows the republished views itself", name)
			}
		}
		return nil
	})
}

func sharedSubject(name string) string { return "atoll.view._all.services.default." + name }

// publish stores a shared view signed by s (nil: unsigned).
func (e *relayEnv) publish(name, data string, s events.Signer) uint64 {
	e.t.Helper()
	msg := nats.NewMsg(sharedSubject(name))
	msg.Data = []byte(data)
	if s != nil {
		if err := events.SignMsg(msg, s); err != nil {
			e.t.Fatal(err)
		}
	}
	ack, err := e.cloud.PublishMsg(e.t.Context(), msg)
	if err != nil {
		e.t.Fatal(err)
	}
	return ack.Sequence
}

// catchUps is how many catch-ups the agents' feeds completed.
func (e *relayEnv) catchUps() float64 {
	n := 0.0
	for _, f := range e.feeds {
		for _, r := range reasons {
			n += testutil.ToFloat64(f.m.catchups.WithLabelValues("shared", r))
		}
	}
	return n
}

// catchUpsByReason is catchUps by reason (those with any).
func (e *relayEnv) catchUpsByReason() map[string]float64 {
	out := map[string]float64{}
	for _, f := range e.feeds {
		for _, r := range reasons {
			if n := testutil.ToFloat64(f.m.catchups.WithLabelValues("shared", r)); n > 0 {
				out[r] += n
			}
		}
	}
	return out
}

// hubToEdge is how many messages and bytes the hub has sent over its
// leaf links.
func (e *relayEnv) hubToEdge() int64 {
	n, _ := e.hubToEdgeBytes()
	return n
}

func (e *relayEnv) hubToEdgeBytes() (msgs, bytes int64) {
	e.t.Helper()
	for _, srv := range e.servers {
		lz, err := srv.Leafz(&server.LeafzOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		for _, l := range lz.Leafs {
			msgs += l.OutMsgs
			bytes += l.OutBytes
		}
	}
	return msgs, bytes
}

// TestRelayOncePerUnit: with every agent of two units following the
// shared space through its unit, each change crosses the hub's leaf links
// once per unit, not once per node, every agent applies every change,
// and each unit relayed each change exactly once.
func TestRelayOncePerUnit(t *testing.T) {
	units := map[string][]string{"u1": {"a", "b", "c", "d"}, "u2": {"e", "f"}}
	for shape, start := range map[string]func(*testing.T, map[string][]string) *relayEnv{
		"embedded": func(t *testing.T, u map[string][]string) *relayEnv { return newRelayEnv(t, u) },
		"cluster":  newRelayCluster,
	} {
		t.Run(shape, func(t *testing.T) { relayOncePerUnit(t, start(t, units), units) })
	}
}

func relayOncePerUnit(t *testing.T, e *relayEnv, units map[string][]string) {
	e.relaying("a", "b", "c", "d", "e", "f")
	signer := e.signer

	caughtUp := e.catchUps()
	before := e.hubToEdge()
	const changes = 50
	want := map[string]string{}
	for i := range changes {
		name := fmt.Sprint("web-", i%10)
		data := fmt.Sprint("v", i)
		e.publish(name, data, signer)
		want[sharedSubject(name)] = data
	}
	for _, f := range e.feeds {
		f.h.holds(t, want)
	}
	sent := e.hubToEdge() - before
	t.Logf("%d changes, 2 units of 6 nodes: %d messages from the hub to the edges (%.2f per change)", changes, sent, float64(sent)/changes)
	// A catch-up (a relayed view later than gapGrace on a loaded
	// machine) brings messages of its own over the leaf links.
	if e.catchUps() == caughtUp && sent > changes*int64(len(units)) {
		t.Errorf("the hub sent %d messages for %d changes to %d units: more than one per unit", sent, changes, len(units))
	}
	for unit, names := range units {
		var relayed, byRelay float64
		for _, n := range names {
			f := e.feeds[n]
			relayed += testutil.ToFloat64(f.m.relayed.WithLabelValues("shared"))
			byRelay += testutil.ToFloat64(f.m.applied.WithLabelValues("shared", viaRelay))
			if r := testutil.ToFloat64(f.m.skipped.WithLabelValues("shared", skipRefused)); r != 0 {
				t.Errorf("%s refused %v relayed views", n, r)
			}
		}
		if relayed != changes {
			t.Errorf("unit %s relayed %v views, want %d", unit, relayed, changes)
		}
		if byRelay == 0 {
			t.Errorf("no agent of unit %s applied a relayed view", unit)
		}
	}
}

// TestRelayMemberDown: when a member of the unit goes down, the others
// (no longer routed to all of it) follow the hub's copies themselves,
// catch up, and miss nothing published around it; when it is back they
// relay again.
func TestRelayMemberDown(t *testing.T) {
	e := newRelayEnv(t, map[string][]string{"u1": {"a", "b", "c"}})
	e.relaying("a", "b", "c")
	signer := e.signer
	want := map[string]string{}
	put := func(name, data string) {
		e.publish(name, data, signer)
		want[sharedSubject(name)] = data
	}
	put("web-0", "before")

	c := e.feeds["c"]
	c.cancel()
	<-c.stopped
	if err := c.node.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Published while a and b learn that c is gone.
	for i := range 20 {
		put(fmt.Sprint("web-", i%5), fmt.Sprint("during-", i))
		time.Sleep(50 * time.Millisecond)
	}
	for _, n := range []string{"a", "b"} {
		e.feeds[n].h.holds(t, want)
		f := e.feeds[n]
		poll.Eventually(t, 10*time.Second, func() error {
			if d := testutil.ToFloat64(f.m.direct.WithLabelValues("shared")); d != 1 {
				return fmt.Errorf("%s does not follow the hub's copies itself", n)
			}
			return nil
		})
	}
	put("web-9", "after")
	for _, n := range []string{"a", "b"} {
		e.feeds[n].h.holds(t, want)
	}
}

// TestRelayRefusesForgeries: a unit member relaying what the cloud did
// not sign (no signature, another key, a signature of another view, a
// view of another unit's queue) gets none of it applied by its peers,
// who follow the hub's copies themselves for a while instead.
func TestRelayRefusesForgeries(t *testing.T) {
	e := newRelayEnv(t, map[string][]string{"u1": {"a", "b"}})
	e.relaying("a", "b")
	signer := e.signer
	seq := e.publish("web-0", "true", signer)
	e.feeds["a"].h.holds(t, map[string]string{sharedSubject("web-0"): "true"})

	// A rogue process on b's server publishes on the unit's routes.
	rogue, err := e.nodes["b"].Connect("rogue")
	if err != nil {
		t.Fatal(err)
	}
	defer rogue.Close()
	other, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	forge := func(name, data string, s events.Signer, signAs string) {
		t.Helper()
		view := sharedSubject(name)
		subj, err := events.RelayedView("u1", view)
		if err != nil {
			t.Fatal(err)
		}
		seq++
		msg := nats.NewMsg(subj)
		msg.Data = []byte(data)
		msg.Header.Set(jetstream.SubjectHeader, view)
		msg.Header.Set(jetstream.SequenceHeader, fmt.Sprint(seq+1000))
		if s != nil {
			sig := nats.NewMsg(signAs)
			sig.Data = msg.Data
			if err := events.SignMsg(sig, s); err != nil {
				t.Fatal(err)
			}
			msg.Header.Set(events.HeaderSignature, sig.Header.Get(events.HeaderSignature))
		}
		if err := rogue.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
	}
	forge("web-0", "unsigned", nil, "")
	forge("web-0", "other-key", other, sharedSubject("web-0"))
	forge("web-0", "signed-for-web-1", signer, sharedSubject("web-1"))
	if err := rogue.Flush(); err != nil {
		t.Fatal(err)
	}
	a := e.feeds["a"]
	poll.Eventually(t, 10*time.Second, func() error {
		if r := testutil.ToFloat64(a.m.skipped.WithLabelValues("shared", skipRefused)); r != 3 {
			return fmt.Errorf("a refused %v forged views, want 3", r)
		}
		return nil
	})
	a.h.holds(t, map[string]string{sharedSubject("web-0"): "true"})
	if d := testutil.ToFloat64(a.m.direct.WithLabelValues("shared")); d != 1 {
		t.Errorf("a does not follow the hub's copies itself after refusing forgeries")
	}
	// What the cloud stores next still arrives.
	e.publish("web-0", "next", signer)
	a.h.holds(t, map[string]string{sharedSubject("web-0"): "next"})
}

// BenchmarkRelayFanOut counts what one change of the shared space costs
// the hub's leaf links, with and without relaying, for units of several
// sizes: messages and bytes from the hub to the edges per change (1 KiB
// views, 200 changes). In one process (embedded hub and edge servers, no
// TLS); the counts, not the time, are the result.
func BenchmarkRelayFanOut(b *testing.B) {
	for _, shape := range []struct{ units, nodes int }{{1, 10}, {4, 5}, {10, 10}} {
		for _, relay := range []bool{false, true} {
			name := fmt.Sprintf("units=%d/nodes=%d/relay=%v", shape.units, shape.nodes, relay)
			b.Run(name, func(b *testing.B) {
				units := map[string][]string{}
				var all []string
				for u := range shape.units {
					for n := range shape.nodes {
						node := fmt.Sprintf("n%d-%d", u, n)
						units[fmt.Sprint("u", u)] = append(units[fmt.Sprint("u", u)], node)
						all = append(all, node)
					}
				}
				e := newRelayEnvOf(b, units, relay)
				if relay {
					e.relaying(all...)
				}
				const changes = 200
				payload := strings.Repeat("x", 1024)
				for b.Loop() {
					caughtUp := e.catchUps()
					msgs0, bytes0 := e.hubToEdgeBytes()
					want := map[string]string{}
					for i := range changes {
						name := fmt.Sprint("web-", i%20)
						data := fmt.Sprint(i, payload)
						e.publish(name, data, e.signer)
						want[sharedSubject(name)] = data
					}
					for _, f := range e.feeds {
						f.h.holds(b, want)
					}
					msgs, bytes := e.hubToEdgeBytes()
					b.ReportMetric(float64(msgs-msgs0)/changes, "hub-msgs/change")
					b.ReportMetric(float64(bytes-bytes0)/changes, "hub-bytes/change")
					b.ReportMetric(e.catchUps()-caughtUp, "catch-ups")
					if n := e.catchUps() - caughtUp; n > 0 {
						b.Logf("%v catch-ups in the window, by reason since the start: %v", n, e.catchUpsByReason())
					}
				}
				b.ReportMetric(float64(shape.units*shape.nodes), "nodes")
			})
		}
	}
}

// TestRelayForgedSequences: a unit member replaying a view the cloud
// signed under sequences the stream never gave it (a future one, its
// predecessor unheard) gets it held back, not applied: the gap it shows
// is caught up from the hub after gapGrace, which finds nothing behind
// it, and the peer takes the hub's copies itself for a while.
func TestRelayForgedSequences(t *testing.T) {
	e := newRelayEnv(t, map[string][]string{"u1": {"a", "b"}})
	e.relaying("a", "b")
	e.publish("web-0", "old", e.signer)
	seq := e.publish("web-0", "current", e.signer)
	a := e.feeds["a"]
	a.h.holds(t, map[string]string{sharedSubject("web-0"): "current"})

	rogue, err := e.nodes["b"].Connect("rogue")
	if err != nil {
		t.Fatal(err)
	}
	defer rogue.Close()
	// The cloud's signed "old", replayed as if stored after "current".
	view := sharedSubject("web-0")
	msg := nats.NewMsg(view)
	msg.Data = []byte("old")
	if err := events.SignMsg(msg, e.signer); err != nil {
		t.Fatal(err)
	}
	subj, err := events.RelayedView("u1", view)
	if err != nil {
		t.Fatal(err)
	}
	msg.Subject = subj
	msg.Header.Set(jetstream.SubjectHeader, view)
	msg.Header.Set(jetstream.SequenceHeader, fmt.Sprint(seq+100))
	msg.Header.Set(jetstream.LastSequenceHeader, fmt.Sprint(seq+99))
	if err := rogue.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, func() error {
		if r := testutil.ToFloat64(a.m.skipped.WithLabelValues("shared", skipRefused)); r != 1 {
			return fmt.Errorf("a refused %v views, want 1", r)
		}
		return nil
	})
	if g := testutil.ToFloat64(a.m.catchups.WithLabelValues("shared", ReasonGap)); g != 1 {
		t.Errorf("%v gap catch-ups, want 1", g)
	}
	if d := testutil.ToFloat64(a.m.direct.WithLabelValues("shared")); d != 1 {
		t.Error("a does not follow the hub's copies itself after a forged sequence")
	}
	a.h.holds(t, map[string]string{sharedSubject("web-0"): "current"})
	e.publish("web-0", "next", e.signer)
	a.h.holds(t, map[string]string{sharedSubject("web-0"): "next"})

	// The current view replayed under a future sequence, after the one
	// it follows: applied (its content is the cloud's, and current), but
	// it hides nothing stored later on its subject.
	b := e.feeds["b"]
	b.h.mu.Lock()
	b.h.lax = true
	b.h.mu.Unlock()
	cur := e.publish("web-1", "current", e.signer)
	b.h.holds(t, map[string]string{sharedSubject("web-1"): "current"})
	refused := testutil.ToFloat64(b.m.skipped.WithLabelValues("shared", skipRefused))
	view = sharedSubject("web-1")
	msg = nats.NewMsg(view)
	msg.Data = []byte("current")
	if err := events.SignMsg(msg, e.signer); err != nil {
		t.Fatal(err)
	}
	msg.Subject, _ = events.RelayedView("u1", view)
	msg.Header.Set(jetstream.SubjectHeader, view)
	msg.Header.Set(jetstream.SequenceHeader, fmt.Sprint(cur+1000))
	msg.Header.Set(jetstream.LastSequenceHeader, fmt.Sprint(cur))
	peer, err := e.nodes["a"].Connect("rogue")
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	if err := peer.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	if err := peer.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	e.publish("web-1", "after", e.signer)
	b.h.holds(t, map[string]string{sharedSubject("web-1"): "after"})
	poll.Eventually(t, 10*time.Second, func() error {
		if r := testutil.ToFloat64(b.m.skipped.WithLabelValues("shared", skipRefused)); r != refused+1 {
			return fmt.Errorf("b refused %v views, want %v", r, refused+1)
		}
		return nil
	})
}

// TestRelayLeafCut: a member's leaf link dies silently (packets dropped)
// while the hub still gives it views to relay, which go nowhere until the
// hub's pings find the link dead. When its link is back it tells its
// unit, and the others catch up: they hold every view, though each was
// stored on a subject of its own that never changes again (no later view
// shows the loss).
func TestRelayLeafCut(t *testing.T) {
	h := natstest.Hub(t)
	_, cloud := natstest.CloudStreams(t, h)
	e := &relayEnv{t: t, h: h, servers: []*server.Server{h.Server()}, domain: h.Domain(), signer: h.Issuer().ViewSigner(), cloud: cloud,
		nodes: map[string]*natsnode.Node{}, feeds: map[string]*relayFeed{}}
	proxy := natstest.NewProxy(t, h.LeafURL().Host)
	a := natstest.Edge(t, h, "a", natstest.EdgeOptions{Unit: "u1", HubURL: "nats-leaf://" + proxy.Addr()})
	b := natstest.Edge(t, h, "b", natstest.EdgeOptions{Unit: "u1"})
	for _, n := range []*natsnode.Node{a, b} {
		if err := n.SetMesh(natstest.MeshOf("u1")); err != nil {
			t.Fatal(err)
		}
		e.nodes[n.Name()] = n
	}
	natstest.SetMesh(t, "u1", a, b)
	e.start("u1", "a", true)
	e.start("u1", "b", true)
	e.relaying("a", "b")

	proxy.Stall()
	want := map[string]string{}
	for i := range 20 {
		name := fmt.Sprint("cut-", i)
		e.publish(name, "v", e.signer)
		want[sharedSubject(name)] = "v"
		time.Sleep(100 * time.Millisecond)
	}
	// The hub drops a's link once its pings go unanswered.
	poll.Eventually(t, 30*time.Second, func() error {
		if n := h.Server().NumLeafNodes(); n != 1 {
			return fmt.Errorf("the hub holds %d leaf links", n)
		}
		return nil
	})
	proxy.Restore()
	for _, n := range []string{"a", "b"} {
		e.feeds[n].h.holds(t, want)
	}
	if got := testutil.ToFloat64(e.feeds["b"].m.catchups.WithLabelValues("shared", ReasonPeerReconnect)); got < 1 {
		t.Errorf("b caught up %v times after a's link came back", got)
	}
}
