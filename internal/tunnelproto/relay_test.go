package tunnelproto_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/tunnelproto"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// unitEnv is a hub and unit u1 of three edge servers a, b, c, meshed by
// their routes, each with its own leaf link through its own cuttable
// proxy and its own credentials; and d, alone in unit u2. a's agent echoes
// (a Listener), b's and c's agents relay (a Relay each, whose unit view
// is u1 = {a, b, c}); the cloud's Dialer relays a's sessions through b,
// then c.
type unitEnv struct {
	proxies  map[string]*natstest.Proxy
	nodes    map[string]*natstest.EdgeServer
	cloud    *nats.Conn
	dialer   *tunnelproto.Dialer
	ln       *tunnelproto.Listener // a's
	relays   map[string]*tunnelproto.Relay
	down     atomic.Bool // the cloud's link-state hint for a
	switches chan string // paths a's sessions moved to ("" direct)

	relayed, framesOut, framesIn, refused atomic.Int64
	lnRelayed                             atomic.Int64
	refusedReason                         atomic.Value
}

func startUnit(t *testing.T, cfg tunnelproto.Config) *unitEnv {
	t.Helper()
	h := natstest.Hub(t)
	e := &unitEnv{proxies: map[string]*natstest.Proxy{}, nodes: map[string]*natstest.EdgeServer{}, relays: map[string]*tunnelproto.Relay{},
		switches: make(chan string, 64)}
	var u1 []*natstest.EdgeServer
	for _, n := range []string{"a", "b", "c"} {
		p := natstest.NewProxy(t, h.LeafURL().Host)
		e.proxies[n] = p
		e.nodes[n] = natstest.Edge(t, h, n, natstest.EdgeOptions{Unit: "u1", HubURL: "nats-leaf://" + p.Addr()})
		u1 = append(u1, e.nodes[n])
	}
	creds := natstest.MeshOf("u1")
	for _, n := range u1 {
		if err := n.SetMesh(creds); err != nil {
			t.Fatal(err)
		}
	}
	natstest.SetMesh(t, "u1", u1...)
	// The unit's routes formed before anything is counted: a test's
	// goroutine baseline taken while they still connect reads as a leak.
	for _, n := range u1 {
		poll.Eventually(t, 30*time.Second, func() error {
			if peers := n.Status().RoutedPeers; len(peers) != len(u1)-1 {
				return fmt.Errorf("%s routed to %v", n.Name(), peers)
			}
			return nil
		})
	}
	e.nodes["d"] = natstest.Unit(t, h, "u2", natstest.EdgeOptions{}, "d")[0]
	for name, n := range e.nodes {
		poll.Eventually(t, 30*time.Second, func() error {
			if !n.Status().HubConnected {
				return fmt.Errorf("%s not linked", name)
			}
			return nil
		})
	}
	var err error
	if e.cloud, err = h.Connect("tunnel-server"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.cloud.Close)
	if e.dialer, err = tunnelproto.NewDialer(e.cloud, cfg); err != nil {
		t.Fatal(err)
	}
	e.dialer.Relay = tunnelproto.RelayPolicy{
		Peers: func(node string) []string {
			if node == "a" {
				return []string{"b", "c"}
			}
			return []string{"b"} // a cloud whose view is wrong about d
		},
		Down:      func(node string) bool { return node == "a" && e.down.Load() },
		After:     time.Second,
		OnSwitch:  func(_, via string) { e.switches <- via },
		OnRelayed: func(string) { e.relayed.Add(1) },
		OnFrame: func(dir events.TunnelDir) {
			if dir == events.ToEdge {
				e.framesOut.Add(1)
			} else {
				e.framesIn.Add(1)
			}
		},
	}
	members := map[string]bool{"a": true, "b": true, "c": true}
	for _, name := range []string{"b", "c"} {
		nc, err := e.nodes[name].Connect("agent")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		r, err := tunnelproto.NewRelay(nc, name, tunnelproto.RelayConfig{
			Member: func(node string) (string, bool) { return "u1", members[node] },
			Expiry: 2 * time.Second,
			OnRefused: func(_, reason string) {
				e.refused.Add(1)
				e.refusedReason.Store(reason)
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		e.relays[name] = r
	}
	for _, name := range []string{"a", "d"} {
		nc, err := e.nodes[name].Connect("agent")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		ln, err := tunnelproto.Listen(nc, name, cfg, 1024)
		if err != nil {
			t.Fatal(err)
		}
		if name == "a" {
			e.ln = ln
			ln.OnRelayedFrame = func() { e.lnRelayed.Add(1) }
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				r, err := ln.Accept(ctx)
				if err != nil {
					return
				}
				c := r.Accept()
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer c.Close()
					if _, err := io.Copy(c, c); err == nil {
						_ = c.CloseWrite()
					}
				}()
			}
		}()
		t.Cleanup(func() {
			cancel()
			_ = ln.Close()
			wg.Wait()
		})
	}
	return e
}

// cut cuts node's own leaf link and waits until its server knows.
func (e *unitEnv) cut(t *testing.T, node string) {
	t.Helper()
	e.proxies[node].Cut()
	poll.Eventually(t, 30*time.Second, func() error {
		if e.nodes[node].Status().HubConnected {
			return fmt.Errorf("%s still linked", node)
		}
		return nil
	})
}

func (e *unitEnv) dial(t *testing.T, node string) *tunnelproto.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := e.dialer.Dial(ctx, node, "127.0.0.1:10250")
	if err != nil {
		t.Fatalf("dial %s: %v", node, err)
	}
	return c
}

// drainSwitches returns the paths taken so far.
func (e *unitEnv) drainSwitches() []string {
	var out []string
	for {
		select {
		case v := <-e.switches:
			out = append(out, v)
		default:
			return out
		}
	}
}

// relayLeaks waits until nothing is left: no session at a's agent or in a
// relay, the cloud's subscriptions and the goroutines back to before.
func (e *unitEnv) relayLeaks(t *testing.T, goroutines, cloudSubs int) {
	t.Helper()
	poll.Eventually(t, 20*time.Second, func() error {
		if s := e.ln.Sessions(); s != 0 {
			return fmt.Errorf("%d agent sessions", s)
		}
		for name, r := range e.relays {
			if s := r.Sessions(); s != 0 {
				return fmt.Errorf("%d sessions relayed by %s", s, name)
			}
		}
		if n := e.cloud.NumSubscriptions(); n != cloudSubs {
			return fmt.Errorf("%d cloud subscriptions, want %d", n, cloudSubs)
		}
		if n := runtime.NumGoroutine(); n > goroutines {
			return fmt.Errorf("%d goroutines, want %d", n, goroutines)
		}
		return nil
	})
}

func relayConfig() tunnelproto.Config {
	return tunnelproto.Config{KeepAlive: 500 * time.Millisecond, LinkTimeout: 8 * time.Second}
}

// TestRelayNewSession: with a's own leaf cut (its unit peers still
// linked), a new session to a works through a peer, byte for byte; the
// relayed frames are counted on both ends; nothing is left afterwards.
// With the link known down, a session starts relayed at once.
func TestRelayNewSession(t *testing.T) {
	e := startUnit(t, relayConfig())
	g, subs := runtime.NumGoroutine(), e.cloud.NumSubscriptions()
	e.cut(t, "a")
	c := e.dial(t, "a")
	echo(t, c, 4<<20, nil)
	_ = c.Close()
	if got := e.drainSwitches(); len(got) == 0 || got[0] != "b" {
		t.Fatalf("paths taken %q, want b first", got)
	}
	if e.relayed.Load() != 1 || e.framesOut.Load() == 0 || e.framesIn.Load() == 0 || e.lnRelayed.Load() == 0 {
		t.Fatalf("relayed sessions %d, frames out %d in %d, at the agent %d", e.relayed.Load(), e.framesOut.Load(), e.framesIn.Load(), e.lnRelayed.Load())
	}

	// Known down: the first frame already goes through b.
	e.down.Store(true)
	out := e.framesOut.Load()
	start := time.Now()
	c = e.dial(t, "a")
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a session to a node known down took %s to open", d)
	}
	if got := e.drainSwitches(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("paths taken %q, want b at once", got)
	}
	echo(t, c, 1<<20, nil)
	_ = c.Close()
	if e.framesOut.Load() == out {
		t.Fatal("no frame went through the relay")
	}
	e.relayLeaks(t, g, subs)
}

// TestRelayMidSession: a's own leaf is cut in the middle of a transfer
// and stays cut; the session moves to a peer and completes byte for byte.
// With b's leaf cut too, a new session tries direct, then b, and works
// through c.
func TestRelayMidSession(t *testing.T) {
	e := startUnit(t, relayConfig())
	g, subs := runtime.NumGoroutine(), e.cloud.NumSubscriptions()
	c := e.dial(t, "a")
	echo(t, c, 32<<20, func() { e.proxies["a"].Cut() })
	_ = c.Close()
	if got := e.drainSwitches(); len(got) == 0 || got[0] != "b" {
		t.Fatalf("paths taken %q, want b", got)
	}
	if c.Stats().FramesResent == 0 {
		t.Error("no frame was resent across the switch")
	}
	e.cut(t, "b")
	c = e.dial(t, "a")
	echo(t, c, 4<<20, nil)
	_ = c.Close()
	// On a loaded machine a path may be left before it answered; the
	// rotation comes back to it.
	if got := e.drainSwitches(); len(got) < 2 || got[0] != "b" || got[len(got)-1] != "c" {
		t.Fatalf("paths taken %q, want b, then ending on c", got)
	}
	e.relayLeaks(t, g, subs)
}

// TestRelayBackToDirect: a session relayed because the link was known
// down goes back to direct once the link is known up again, and carries
// on.
func TestRelayBackToDirect(t *testing.T) {
	e := startUnit(t, relayConfig())
	e.down.Store(true)
	c := e.dial(t, "a")
	defer c.Close()
	echo1 := []byte("through the relay\n")
	if _, err := c.Write(echo1); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(echo1))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	e.down.Store(false)
	poll.Eventually(t, 10*time.Second, func() error {
		for _, v := range e.drainSwitches() {
			if v == "" {
				return nil
			}
		}
		return errors.New("the session did not go back to direct")
	})
	agentRelayed := e.lnRelayed.Load()
	echo(t, c, 1<<20, nil)
	if e.lnRelayed.Load() != agentRelayed {
		t.Errorf("%d frames still came through the relay after going direct", e.lnRelayed.Load()-agentRelayed)
	}
}

// TestRelayRefusesOutsider: a relay request for a node outside the
// peer's unit (d is in u2; the cloud's view claims b relays it) is refused
// by the peer's agent with a reason, counted, and nothing reaches d.
func TestRelayRefusesOutsider(t *testing.T) {
	e := startUnit(t, relayConfig())
	g, subs := runtime.NumGoroutine(), e.cloud.NumSubscriptions()
	// A dialer whose link state says d is down, so it goes to b at once.
	d2, err := tunnelproto.NewDialer(e.cloud, relayConfig())
	if err != nil {
		t.Fatal(err)
	}
	d2.Relay = tunnelproto.RelayPolicy{Peers: func(string) []string { return []string{"b"} }, Down: func(string) bool { return true }}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = d2.Dial(ctx, "d", "127.0.0.1:10250")
	var pe *tunnelproto.PeerError
	if !errors.As(err, &pe) || !strings.Contains(pe.Reason, "d is not in unit \"u1\" of b") {
		t.Fatalf("dial d through b: %v, want b's refusal", err)
	}
	if e.refused.Load() == 0 {
		t.Fatal("the refusal was not counted")
	}
	if e.relays["b"].Sessions() != 0 {
		t.Fatal("b relays a session for d")
	}
	// A frame asking b to relay to itself is refused too.
	errs := make(chan *nats.Msg, 4)
	sub, err := e.cloud.ChanSubscribe("atoll.tunnel.b.relay.b.s1.out", errs)
	if err != nil {
		t.Fatal(err)
	}
	open, _ := proto.Marshal(&atollv1.TunnelFrame{Session: "s1", Kind: atollv1.FrameKind_FRAME_KIND_OPEN, Sequence: 1, Target: "127.0.0.1:10250"})
	if err := e.cloud.Publish("atoll.tunnel.b.relay.b.s1.in", open); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-errs:
		var f atollv1.TunnelFrame
		if err := proto.Unmarshal(m.Data, &f); err != nil || f.Kind != atollv1.FrameKind_FRAME_KIND_ERROR || f.Error != "relay to itself" {
			t.Fatalf("answer %v %v, want ERROR relay to itself", &f, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no answer to a relay to itself")
	}
	_ = sub.Unsubscribe()
	if err := d2.Close(); err != nil {
		t.Fatal(err)
	}
	e.relayLeaks(t, g, subs)
}
