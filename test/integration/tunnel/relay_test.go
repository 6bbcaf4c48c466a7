package tunnel_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/cloud/tunnel"
	"github.com/atoll-edge/atoll/edge/natsnode"
	edgetunnel "github.com/atoll-edge/atoll/edge/tunnel"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// staticUnit is an agent's view of unit u1 = {n1, n2}.
type staticUnit struct{}

func (staticUnit) Member(node string) (string, bool) { return "u1", node == "n1" || node == "n2" }

func counterVec(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" {
				sum += m.GetCounter().GetValue()
				continue
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

// TestConnectRelayed: unit u1 = {n1, n2}, each edge server with its own
// leaf link through its own cuttable proxy and the real agent; one tunnel
// server replica whose peers come from the unit view and whose link state
// comes from the hub's system events. n1's own leaf is cut in the middle
// of a CONNECT transfer: it completes byte for byte through n2. A new
// CONNECT to n1 while its link is known down goes through n2 at once.
// n2's agent refuses to relay for a node outside its unit. Once the link
// is back, new sessions go direct. Relayed sessions and frames are counted
// on both sides, and nothing leaks.
func TestConnectRelayed(t *testing.T) {
	kubelet := echoServer(t)
	_, port, _ := net.SplitHostPort(kubelet)
	h := natstest.Hub(t)
	log := natstest.Logger(t, 0)
	sys, err := identity.DialSystem(t.Context(), h.ClientConfig(), h.Issuer(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.Close)
	links, err := tunnel.FollowLinks(sys, h.Issuer().Keys().AccountKey())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(links.Close)

	proxies := map[string]*natstest.Proxy{}
	var nodes []*natsnode.Node
	for _, name := range []string{"n1", "n2"} {
		proxies[name] = natstest.NewProxy(t, h.LeafURL().Host)
		nodes = append(nodes, natstest.Edge(t, h, name, natstest.EdgeOptions{Unit: "u1", HubURL: "nats-leaf://" + proxies[name].Addr()}))
	}
	creds := natstest.MeshOf("u1")
	for _, n := range nodes {
		if err := n.SetMesh(creds); err != nil {
			t.Fatal(err)
		}
	}
	natstest.SetMesh(t, "u1", nodes...)
	for _, n := range nodes {
		poll.Eventually(t, 30*time.Second, func() error {
			if !n.Status().HubConnected {
				return fmt.Errorf("%s not linked", n.Name())
			}
			return nil
		})
	}
	agentRegs := map[string]*prometheus.Registry{}
	for _, n := range nodes {
		nc, err := n.Connect("agent")
		if err != nil {
			t.Fatal(err)
		}
		acfg := edgetunnel.DefaultConfig()
		acfg.Kubelet = kubelet
		acfg.Session.KeepAlive = 500 * time.Millisecond
		agentRegs[n.Name()] = prometheus.NewRegistry()
		a, err := edgetunnel.New(acfg, n.Name(), edgetunnel.NewMetrics(agentRegs[n.Name()]), log)
		if err != nil {
			t.Fatal(err)
		}
		a.SetUnits(staticUnit{})
		if err := a.Start(nc); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = a.Run(ctx) }()
		t.Cleanup(func() {
			_ = a.Stop(context.Background())
			cancel()
			<-done
			nc.Close()
		})
	}

	nc, err := h.Connect("tunnel-0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := tunnel.DefaultConfig()
	cfg.ConnectAddr = "127.0.0.1:0"
	cfg.RelayAfter = time.Second
	cfg.Session.KeepAlive, cfg.Session.LinkTimeout = 500*time.Millisecond, 8*time.Second
	reg := prometheus.NewRegistry()
	s, err := tunnel.New(cfg, tunnel.Names{}, tunnel.NewMetrics(reg), log)
	if err != nil {
		t.Fatal(err)
	}
	units := tunnel.NewUnitViews()
	units.Links = links
	units.Apply(&atollv1.UnitView{Unit: "u1", Members: []*atollv1.UnitMember{{Name: "n1"}, {Name: "n2"}}})
	s.SetRelay(units, links)
	if err := s.Start(nc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop(context.Background()); nc.Close() })
	r := &rig{servers: []*tunnel.Server{s}, agentReg: agentRegs["n1"]}

	// In progress when n1's own leaf is cut.
	c, code, body := r.connect(t, 0, "n1:"+port)
	if c == nil {
		t.Fatalf("CONNECT: %d %s", code, body)
	}
	echo(t, c, 16<<20, func() { proxies["n1"].Cut() })
	c.Close()
	if v := counterVec(t, reg, "atoll_tunnel_server_relayed_sessions_total", "", ""); v != 1 {
		t.Fatalf("relayed sessions %v, want 1", v)
	}

	// New, with the link known down: relayed from the first frame.
	poll.Eventually(t, 30*time.Second, func() error {
		if !links.Down("n1") {
			return fmt.Errorf("n1's link not known down")
		}
		return nil
	})
	// Counted from here, with the link state settled (a link flap leaves
	// the servers' connection goroutines in other numbers).
	before, subs := runtime.NumGoroutine(), nc.NumSubscriptions()
	start := time.Now()
	c, code, body = r.connect(t, 0, "n1:"+port)
	if c == nil {
		t.Fatalf("CONNECT while n1's link is down: %d %s", code, body)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("CONNECT to a node known down took %s", d)
	}
	echo(t, c, 1<<20, nil)
	c.Close()
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, code, body := r.connect(t, 0, "n1:"+port)
			if c == nil {
				t.Errorf("CONNECT %d while n1's link is down: %d %s", i, code, body)
				return
			}
			defer c.Close()
			if err := echoed(c, 64<<10+i, nil); err != nil {
				t.Errorf("session %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if v := counterVec(t, reg, "atoll_tunnel_server_relayed_sessions_total", "", ""); v != 22 {
		t.Fatalf("relayed sessions %v, want 22", v)
	}
	noLeaks(t, r, before)
	poll.Eventually(t, 20*time.Second, func() error {
		// Not more: the session before may have lingered then (see
		// eventtunnel.Session.Lingers).
		if n := nc.NumSubscriptions(); n > subs {
			return fmt.Errorf("%d server subscriptions, %d before", n, subs)
		}
		if v := gauge(t, agentRegs["n2"], "atoll_tunnel_agent_relay_sessions"); v != 0 {
			return fmt.Errorf("n2 still relays %v sessions", v)
		}
		return nil
	})
	for _, dir := range []string{"to_edge", "from_edge"} {
		if v := counterVec(t, reg, "atoll_tunnel_server_relay_frames_total", "dir", dir); v == 0 {
			t.Errorf("no relayed frame %s counted by the server", dir)
		}
	}
	for _, dir := range []string{"to_peer", "to_cloud"} {
		if v := counterVec(t, agentRegs["n2"], "atoll_tunnel_agent_relay_frames_total", "dir", dir); v == 0 {
			t.Errorf("no relayed frame %s counted by n2's agent", dir)
		}
	}
	if v := counterVec(t, agentRegs["n1"], "atoll_tunnel_agent_relay_frames_total", "dir", "from_peer"); v == 0 {
		t.Error("n1's agent counted no frame through its peer")
	}

	// n2's agent refuses, with a reason, to relay for a node outside its
	// unit, and counts it.
	answers := make(chan *nats.Msg, 4)
	sub, err := nc.ChanSubscribe("atoll.tunnel.n2.relay.x.s1.out", answers)
	if err != nil {
		t.Fatal(err)
	}
	open, _ := proto.Marshal(&atollv1.TunnelFrame{Session: "s1", Kind: atollv1.FrameKind_FRAME_KIND_OPEN, Sequence: 1, Target: "x:" + port})
	if err := nc.Publish("atoll.tunnel.n2.relay.x.s1.in", open); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-answers:
		var f atollv1.TunnelFrame
		if err := proto.Unmarshal(m.Data, &f); err != nil || f.Kind != atollv1.FrameKind_FRAME_KIND_ERROR || !strings.Contains(f.Error, `x is not in unit "u1" of n2`) {
			t.Fatalf("answer %v %v, want n2's refusal", &f, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("n2 did not answer a relay request for a node outside its unit")
	}
	_ = sub.Unsubscribe()
	if v := counterVec(t, agentRegs["n2"], "atoll_tunnel_agent_relay_refused_total", "", ""); v != 1 {
		t.Fatalf("n2 counted %v refusals, want 1", v)
	}

	// n2's link down too: nothing can carry a session to n1, and a
	// CONNECT says so at once (503) instead of waiting for the dial
	// timeout.
	proxies["n2"].Cut()
	poll.Eventually(t, 30*time.Second, func() error {
		if !links.Down("n2") {
			return fmt.Errorf("n2's link not known down")
		}
		return nil
	})
	if c, code, body := r.connect(t, 0, "n1:"+port); c != nil || code != http.StatusServiceUnavailable || !strings.Contains(body, "no unit peer is linked to relay") {
		t.Fatalf("CONNECT to n1 with its unit cut off: %d %q, want 503 at once", code, body)
	}
	if v := counterVec(t, reg, "atoll_tunnel_server_session_opens_total", "result", "unreachable"); v != 1 {
		t.Errorf("unreachable opens counted %v, want 1", v)
	}
	proxies["n2"].Restore()
	poll.Eventually(t, 30*time.Second, func() error {
		if links.Down("n2") || !nodes[1].Status().HubConnected {
			return fmt.Errorf("n2's link not back")
		}
		return nil
	})

	// The link is back: a new session stays direct.
	proxies["n1"].Restore()
	poll.Eventually(t, 30*time.Second, func() error {
		if links.Down("n1") || !nodes[0].Status().HubConnected {
			return fmt.Errorf("n1's link not back")
		}
		return nil
	})
	switches := counterVec(t, reg, "atoll_tunnel_server_path_switches_total", "", "")
	c, code, body = r.connect(t, 0, "n1:"+port)
	if c == nil {
		t.Fatalf("CONNECT after the link came back: %d %s", code, body)
	}
	echo(t, c, 1<<20, nil)
	c.Close()
	if v := counterVec(t, reg, "atoll_tunnel_server_path_switches_total", "", ""); v != switches {
		t.Errorf("a session after the link came back changed path (%v switches, %v before)", v, switches)
	}
}

// TestNeverLinkedIsDown: a replica that starts following the hub's leaf
// events after its nodes linked reads the hub servers' leaf connections:
// a linked node is up, a node that never linked is down, so a CONNECT to
// it (a valid name, no relay peer linked) answers 503 at once instead of
// waiting the dial timeout; the linked node's sessions open.
func TestNeverLinkedIsDown(t *testing.T) {
	kubelet := echoServer(t)
	_, port, _ := net.SplitHostPort(kubelet)
	h := natstest.Hub(t)
	log := natstest.Logger(t, 0)
	n1 := natstest.Edge(t, h, "n1", natstest.EdgeOptions{Unit: "u1"})
	poll.Eventually(t, 30*time.Second, func() error {
		if !n1.Status().HubConnected {
			return fmt.Errorf("n1 not linked")
		}
		return nil
	})
	anc, err := n1.Connect("agent")
	if err != nil {
		t.Fatal(err)
	}
	acfg := edgetunnel.DefaultConfig()
	acfg.Kubelet = kubelet
	a, err := edgetunnel.New(acfg, "n1", edgetunnel.NewMetrics(prometheus.NewRegistry()), log)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(anc); err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(context.Background())
	adone := make(chan struct{})
	go func() { defer close(adone); _ = a.Run(actx) }()
	t.Cleanup(func() { _ = a.Stop(context.Background()); acancel(); <-adone; anc.Close() })

	// Following starts after n1 linked: no event tells of its link.
	sys, err := identity.DialSystem(t.Context(), h.ClientConfig(), h.Issuer(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.Close)
	links, err := tunnel.FollowLinks(sys, h.Issuer().Keys().AccountKey())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(links.Close)
	poll.Eventually(t, 10*time.Second, func() error {
		if !links.Down("n9") {
			return fmt.Errorf("n9, never linked, not known down yet")
		}
		return nil
	})
	if links.Down("n1") {
		t.Fatal("n1, linked before the replica followed, is known down")
	}

	nc, err := h.Connect("tunnel-0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := tunnel.DefaultConfig()
	cfg.ConnectAddr = "127.0.0.1:0"
	reg := prometheus.NewRegistry()
	s, err := tunnel.New(cfg, tunnel.Names{}, tunnel.NewMetrics(reg), log)
	if err != nil {
		t.Fatal(err)
	}
	units := tunnel.NewUnitViews()
	units.Links = links
	units.Apply(&atollv1.UnitView{Unit: "u1", Members: []*atollv1.UnitMember{{Name: "n1"}}})
	s.SetRelay(units, links)
	if err := s.Start(nc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop(context.Background()); nc.Close() })
	r := &rig{servers: []*tunnel.Server{s}}

	// n9 is in no unit view: no peer may relay for it.
	start := time.Now()
	c, code, body := r.connect(t, 0, "n9:"+port)
	took := time.Since(start)
	if c != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("CONNECT to n9, never linked: %d %q, want 503", code, body)
	}
	t.Logf("CONNECT to a node never linked: %d in %v: %s", code, took, strings.TrimSpace(body))
	if c, code, body := r.connect(t, 0, "n1:"+port); c == nil {
		t.Fatalf("CONNECT to n1: %d %s", code, body)
	} else {
		c.Close()
	}
}
