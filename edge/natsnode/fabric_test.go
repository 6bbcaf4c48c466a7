package natsnode_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/test/poll"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/events"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
)

const settle = 10 * time.Second

// counter counts the probe reports one connection receives, and how often
// it saw each sequence number.
type counter struct {
	n     atomic.Int64
	mu    sync.Mutex
	bySeq map[uint64]int
}

func (c *counter) seen(seq uint64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bySeq[seq]
}

func subscribe(t *testing.T, nc *nats.Conn, subject string) *counter {
	t.Helper()
	c := &counter{bySeq: map[uint64]int{}}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		var b atollv1.Ballot
		if err := events.DecodeMsg(m, &b); err != nil {
			t.Errorf("undecodable ballot: %v", err)
		}
		c.mu.Lock()
		c.bySeq[uint64(b.GetMembers())]++
		c.mu.Unlock()
		c.n.Add(1)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return c
}

func connect(t *testing.T, n *natsnode.Node) *nats.Conn {
	t.Helper()
	nc, err := n.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func connectHub(t *testing.T, h *natstest.HubServer) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := h.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := eventbus.EnsureStreams(ctx, js, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// waitLinks waits until every node routes to exactly its unit peers and,
// if hub is true, has its leaf link up (false: down).
func waitLinks(t testing.TB, hubUp bool, units ...[]*natsnode.Node) {
	t.Helper()
	poll.Eventually(t, settle, func() error {
		for _, unit := range units {
			for _, n := range unit {
				st := n.Status()
				var want []string
				for _, p := range unit {
					if p != n {
						want = append(want, p.Name())
					}
				}
				slices.Sort(want)
				if !slices.Equal(st.RoutedPeers, want) {
					return fmt.Errorf("%s routes to %v, want %v", n.Name(), st.RoutedPeers, want)
				}
				if st.HubConnected != hubUp {
					return fmt.Errorf("%s hub connected = %v, want %v", n.Name(), st.HubConnected, hubUp)
				}
			}
		}
		return nil
	})
}

// probe is the test's event: a ballot of voter, which travels to the unit
// peers over routes and to the hub over the leaf (probe reports stay in
// the unit), with the test's sequence number in its members count.
func probe(unit, voter string, seq uint64) (string, *atollv1.Ballot) {
	subj, err := events.BallotSubject(unit, voter)
	if err != nil {
		panic(err)
	}
	return subj, &atollv1.Ballot{Voter: voter, Unit: unit, Members: uint32(seq), Time: timestamppb.Now()}
}

func publish(t *testing.T, nc *nats.Conn, unit, checker string, seq uint64) {
	t.Helper()
	subj, m := probe(unit, checker, seq)
	if err := events.Publish(nc, subj, m, fmt.Sprintf("%s-%d", checker, seq)); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func streamMsgs(t *testing.T, js jetstream.JetStream, subject string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, events.StreamHealth)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subject]
}

// TestFabricDelivery: two units of three servers; a message published on
// one edge server reaches its unit peers over routes and the hub over the
// leaf links, exactly once each, and the hub's stream captures it.
func TestFabricDelivery(t *testing.T) {
	h := natstest.Hub(t)
	hnc, js := connectHub(t, h)
	u1 := natstest.Unit(t, h, "u1", natstest.EdgeOptions{}, "u1-a", "u1-b", "u1-c")
	u2 := natstest.Unit(t, h, "u2", natstest.EdgeOptions{}, "u2-a", "u2-b", "u2-c")
	waitLinks(t, true, u1, u2)

	subj, _ := probe("u1", "u1-a", 0)
	onB := subscribe(t, connect(t, u1[1]), subj)
	onC := subscribe(t, connect(t, u1[2]), subj)
	onHub := subscribe(t, hnc, subj)
	// Interest from the hub reaches the edges asynchronously.
	pub := connect(t, u1[0])
	poll.Eventually(t, settle, func() error {
		publish(t, pub, "u1", "u1-a", 0)
		if onHub.n.Load() == 0 || onB.n.Load() == 0 || onC.n.Load() == 0 {
			return fmt.Errorf("warm-up not seen everywhere: hub=%d b=%d c=%d", onHub.n.Load(), onB.n.Load(), onC.n.Load())
		}
		return nil
	})

	const n = 100
	for i := 1; i <= n; i++ {
		publish(t, pub, "u1", "u1-a", uint64(i))
	}
	receivers := map[string]*counter{"u1-b": onB, "u1-c": onC, "hub": onHub}
	poll.Eventually(t, settle, func() error {
		for name, c := range receivers {
			for seq := uint64(1); seq <= n; seq++ {
				if got := c.seen(seq); got != 1 {
					return fmt.Errorf("%s received report %d %d times, want once", name, seq, got)
				}
			}
		}
		return nil
	})
	// The stream keeps the last few reports of the subject.
	poll.Eventually(t, settle, func() error {
		if got := streamMsgs(t, js, subj); got != 4 {
			return fmt.Errorf("HEALTH holds %d messages of %s, want 4 (the per-subject limit)", got, subj)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, _ := js.Stream(ctx, events.StreamHealth)
	last, err := s.GetLastMsgForSubject(ctx, subj)
	if err != nil {
		t.Fatal(err)
	}
	var got atollv1.Ballot
	if err := events.DecodeMsg(&nats.Msg{Subject: last.Subject, Header: last.Header, Data: last.Data}, &got); err != nil {
		t.Fatal(err)
	}
	if got.GetMembers() != n || last.Header.Get(events.HeaderType) != "atoll.v1.Ballot" {
		t.Fatalf("last stored ballot: seq %d type %q", got.GetMembers(), last.Header.Get(events.HeaderType))
	}
}

// TestLeafCut: with every leaf link of a unit dropped by a proxy, the unit
// keeps its local pub/sub; once the links return, new events reach the hub
// stream again without restarting anything.
func TestLeafCut(t *testing.T) {
	h := natstest.Hub(t)
	_, js := connectHub(t, h)
	proxy := natstest.NewProxy(t, h.LeafURL().Host)
	unit := natstest.Unit(t, h, "u1", natstest.EdgeOptions{HubURL: "nats-leaf://" + proxy.Addr()}, "a", "b", "c")
	waitLinks(t, true, unit)

	proxy.Cut()
	waitLinks(t, false, unit)
	subj, _ := probe("u1", "a", 0)
	onC := subscribe(t, connect(t, unit[2]), subj)
	pub := connect(t, unit[0])
	poll.Eventually(t, settle, func() error {
		publish(t, pub, "u1", "a", 1)
		if onC.n.Load() == 0 {
			return fmt.Errorf("unit peer did not receive while the cloud link is cut")
		}
		return nil
	})
	if got := streamMsgs(t, js, subj); got != 0 {
		t.Fatalf("hub stored %d messages while every leaf link was cut", got)
	}

	proxy.Restore()
	waitLinks(t, true, unit)
	poll.Eventually(t, settle, func() error {
		publish(t, pub, "u1", "a", 2)
		if streamMsgs(t, js, subj) == 0 {
			return fmt.Errorf("hub stream did not capture the event after the links returned")
		}
		return nil
	})
}

// TestHubRestart: with the hub stopped, unit-local pub/sub keeps working;
// a hub started again on the same port and store (and so the same
// identity keys) is rejoined without restarting the edge servers.
func TestHubRestart(t *testing.T) {
	store := t.TempDir()
	h1 := natstest.Hub(t, func(c *natstest.HubConfig) { c.StoreDir = store })
	port := h1.LeafURL().Port()
	unit := natstest.Unit(t, h1, "u1", natstest.EdgeOptions{}, "a", "b", "c")
	waitLinks(t, true, unit)

	if err := h1.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitLinks(t, false, unit)
	subj, _ := probe("u1", "a", 0)
	onB := subscribe(t, connect(t, unit[1]), subj)
	pub := connect(t, unit[0])
	poll.Eventually(t, settle, func() error {
		publish(t, pub, "u1", "a", 1)
		if onB.n.Load() == 0 {
			return fmt.Errorf("unit peer did not receive while the hub is down")
		}
		return nil
	})

	h2 := natstest.Hub(t, func(c *natstest.HubConfig) {
		c.StoreDir = store
		if _, err := fmt.Sscan(port, &c.LeafPort); err != nil {
			t.Fatal(err)
		}
	})
	_, js := connectHub(t, h2)
	waitLinks(t, true, unit)
	poll.Eventually(t, settle, func() error {
		publish(t, pub, "u1", "a", 2)
		if streamMsgs(t, js, subj) == 0 {
			return fmt.Errorf("restarted hub did not capture the event")
		}
		return nil
	})
}

// TestMeshMembership: nodes join and leave a unit at runtime and routes
// follow, without restarting any server.
func TestMeshMembership(t *testing.T) {
	h := natstest.Hub(t)
	unit := natstest.Unit(t, h, "u1", natstest.EdgeOptions{}, "a", "b", "c")
	waitLinks(t, true, unit)

	// d joins u1.
	d := natstest.Edge(t, h, "d", natstest.EdgeOptions{})
	grown := append(slices.Clone(unit), d)
	natstest.SetMesh(t, "u1", grown...)
	waitLinks(t, true, grown)

	// c leaves u1 for u2, where it meets e.
	e := natstest.Edge(t, h, "e", natstest.EdgeOptions{})
	u1 := []*natsnode.Node{unit[0], unit[1], d}
	natstest.SetMesh(t, "u1", u1...)
	natstest.SetMesh(t, "u2", unit[2], e)
	waitLinks(t, true, u1, []*natsnode.Node{unit[2], e})

	// d leaves every unit.
	natstest.SetMesh(t, "u1", unit[0], unit[1])
	if err := d.SetMesh(natsnode.Mesh{}); err != nil {
		t.Fatal(err)
	}
	waitLinks(t, true, []*natsnode.Node{unit[0], unit[1]}, []*natsnode.Node{d})
	if got := d.Mesh().Unit; got != "" {
		t.Fatalf("d still in unit %q", got)
	}
}

// TestNoAnonymousAccess: the hub refuses connections without credentials
// and leaf connections whose JWT another installation signed.
func TestNoAnonymousAccess(t *testing.T) {
	h := natstest.Hub(t)
	if nc, err := nats.Connect(h.ClientURL(), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("anonymous client connected to the hub")
	}
	foreign := natstest.Hub(t)
	if nc, err := nats.Connect(h.ClientURL(), nats.UserCredentials(natstest.OperatorCreds(t, foreign.Issuer())), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("operator of another installation connected")
	}
	nc, err := nats.Connect(h.ClientURL(), nats.UserCredentials(natstest.OperatorCreds(t, h.Issuer())))
	if err != nil {
		t.Fatalf("operator: %v", err)
	}
	nc.Close()

	// An edge with credentials of another installation never gets its
	// leaf link up.
	n := natstest.Edge(t, foreign, "rogue", natstest.EdgeOptions{HubURL: h.LeafURL().String()})
	// Give the remote several reconnect intervals; it must stay out.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if n.Status().HubConnected {
			t.Fatal("edge with foreign credentials linked")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
