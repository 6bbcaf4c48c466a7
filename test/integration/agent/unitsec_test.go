package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/cloud/cloudapp"
	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/edge/edgeapp"
	"github.com/atoll-edge/atoll/edge/prober"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// kubelet is a TCP listener every agent probes as its peers' kubelet port
// (all agents share 127.0.0.1): every peer is normal.
func kubelet(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// probing has the agent check its peers every second with one TCP check
// of port, and send its ballot every 2 s when nothing changes.
func probing(port int) func(*edgeapp.Config) {
	return func(c *edgeapp.Config) {
		c.Kubelet.Port = port
		c.Prober.Period, c.Prober.RoundBudget, c.Prober.Scoreline = time.Second, 2*time.Second, 100
		c.ViewFeed.CheckPeriod = c.Prober.Period
		c.Prober.Plugins = []prober.PluginConfig{{Kind: "tcp", Name: "kubelet-port", Weight: 1, Timeout: 500 * time.Millisecond}}
		c.Voter.KeepAlive = 2 * time.Second
	}
}

// metric sums the agent's samples of name whose labels contain match.
func (e edge) metric(t *testing.T, name, match string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + e.admin.Addr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	sum := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, name) || !strings.Contains(line, match) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// voteLog records, at the hub, every vote of the unit's ballots, with its
// voter.
type voteLog struct {
	mu     sync.Mutex
	votes  []*atollv1.Vote
	voters []string
	at     []time.Time
}

func recordVotes(t *testing.T, h *hub.Hub) *voteLog {
	t.Helper()
	nc, err := h.Connect("vote-log")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	l := &voteLog{}
	if _, err := eventbus.Subscribe(nc, events.BallotSubjects, "test-ballots", func(_ context.Context, ev eventbus.Event[*atollv1.Ballot]) error {
		l.mu.Lock()
		for _, v := range ev.Msg.GetVotes() {
			l.votes, l.voters, l.at = append(l.votes, v), append(l.voters, ev.Msg.GetVoter()), append(l.at, time.Now())
		}
		l.mu.Unlock()
		return nil
	}, eventbus.ConsumeOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return l
}

// since returns the votes of voter about node recorded from index from on.
func (l *voteLog) since(from int, voter, node string) ([]*atollv1.Vote, []time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var vs []*atollv1.Vote
	var ts []time.Time
	for i := from; i < len(l.votes); i++ {
		if v := l.votes[i]; l.voters[i] == voter && v.GetNode() == node {
			vs, ts = append(vs, v), append(ts, l.at[i])
		}
	}
	return vs, ts
}

func (l *voteLog) len() int { l.mu.Lock(); defer l.mu.Unlock(); return len(l.votes) }

// latest is voter's last vote on node (nil: none yet).
func (l *voteLog) latest(voter, node string) *atollv1.Vote {
	vs, _ := l.since(0, voter, node)
	if len(vs) == 0 {
		return nil
	}
	return vs[len(vs)-1]
}

// waitHealthy waits until the hub's last vote of every node about every
// other is healthy with all the others' reports normal: the unit is up
// and voting.
func waitHealthy(t *testing.T, votes *voteLog, nodes ...string) {
	t.Helper()
	poll.Eventually(t, 20*time.Second, func() error {
		for _, voter := range nodes {
			for _, node := range nodes {
				if voter == node {
					continue
				}
				if v := votes.latest(voter, node); v.GetVerdict() != atollv1.Verdict_VERDICT_HEALTHY || int(v.GetNormal()) != len(nodes)-1 {
					return fmt.Errorf("vote of %s on %s: %v %d/%d, want healthy %d/0", voter, node, v.GetVerdict(), v.GetNormal(), v.GetAbnormal(), len(nodes)-1)
				}
			}
		}
		return nil
	})
}

// TestForgedReportsOnTheUnitMesh: with real agents a, b and c of one unit,
// a's server publishes probe reports in b's name (signed with a's own
// key) and unsigned reports in c's name, all saying that every other node
// is down. b's and c's voters drop and count them, and every vote the hub
// receives still says the nodes are healthy with no abnormal checker.
func TestForgedReportsOnTheUnitMesh(t *testing.T) {
	h, _ := cloud(t)
	port := kubelet(t)
	var edges []edge
	for _, name := range []string{"a", "b", "c"} {
		e, app := startEdge(t, h, name, "u1", t.TempDir(), probing(port))
		defer app.RequireStop()
		edges = append(edges, e)
	}
	a, b, c := edges[0], edges[1], edges[2]
	waitMeshed(t, "u1", edges...)
	votes := recordVotes(t, h.Hub)
	// Every node's key is in the view.
	poll.Eventually(t, 10*time.Second, func() error {
		for _, m := range b.mem.Current().Members {
			if m.GetNodeKey() == "" {
				return fmt.Errorf("no key for %s in b's view", m.GetName())
			}
		}
		return nil
	})

	waitHealthy(t, votes, "a", "b", "c")

	nc, err := a.node.Connect("forger")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	down := func(checker string) *atollv1.ProbeReport {
		r := &atollv1.ProbeReport{Checker: checker, Unit: "u1", ReportTime: timestamppb.New(time.Now().Add(time.Second)), Sequence: 1 << 40}
		for _, n := range []string{"a", "b", "c"} {
			r.Peers = append(r.Peers, &atollv1.PeerResult{Node: n, Normal: n == checker})
		}
		return r
	}
	forge := func() {
		subj, _ := events.ProbeSubject("u1", "b")
		if err := events.PublishSigned(nc, subj, down("b"), "", a.node); err != nil { // a's key, b's name
			t.Fatal(err)
		}
		subj, _ = events.ProbeSubject("u1", "c")
		if err := events.Publish(nc, subj, down("c"), ""); err != nil { // unsigned
			t.Fatal(err)
		}
		_ = nc.Flush()
	}
	from := votes.len()
	poll.Eventually(t, 20*time.Second, func() error {
		forge()
		for _, e := range []edge{b, c} {
			for _, reason := range []string{"bad_signature", "unsigned"} {
				if n := e.metric(t, "atoll_voter_reports_unverified_total", `reason="`+reason+`"`); n < 3 {
					return fmt.Errorf("%s's voter dropped %v reports as %s, want at least 3", e.node.Name(), n, reason)
				}
			}
		}
		// Two refreshes of votes from every voter about every other node.
		for _, voter := range []string{"a", "b", "c"} {
			for _, node := range []string{"a", "b", "c"} {
				if vs, _ := votes.since(from, voter, node); voter != node && len(vs) < 2 {
					return fmt.Errorf("%d votes of %s on %s since the forging began", len(vs), voter, node)
				}
			}
		}
		return nil
	})
	for _, voter := range []string{"a", "b", "c"} {
		for _, node := range []string{"a", "b", "c"} {
			vs, _ := votes.since(from, voter, node)
			for _, v := range vs {
				if v.GetVerdict() != atollv1.Verdict_VERDICT_HEALTHY || v.GetAbnormal() != 0 {
					t.Errorf("vote of %s on %s while reports were forged: %v %d/%d", voter, node, v.GetVerdict(), v.GetNormal(), v.GetAbnormal())
				}
			}
		}
	}
}

// TestDepartedMemberIsLockedOut: real agents a, b and c of one unit, with
// traffic flowing between a and b. c leaves the unit (its agent stops and
// the cloud drops it); the cloud rotates the unit's route password, a and
// b reload their routes, and c, back with a server that replays its old
// credentials, is refused. Throughout, the hub keeps receiving
// healthy votes of a and b about each other, never more than a vote TTL
// apart.
func TestDepartedMemberIsLockedOut(t *testing.T) {
	h, _ := cloud(t, func(c *cloudapp.Config) { c.Members.NodeTTL = 3 * time.Second })
	port := kubelet(t)
	var edges []edge
	var apps []interface{ RequireStop() }
	for _, name := range []string{"a", "b", "c"} {
		e, app := startEdge(t, h, name, "u1", t.TempDir(), probing(port))
		edges, apps = append(edges, e), append(apps, app)
	}
	defer func() {
		for _, app := range apps[:2] {
			app.RequireStop()
		}
	}()
	a, b := edges[0], edges[1]
	waitMeshed(t, "u1", edges...)
	votes := recordVotes(t, h.Hub)
	old := edges[2].node.Mesh()
	if err := natstest.RouteConnect(t, a.node, "u1", old.User, old.Password); err != nil {
		t.Fatalf("a refuses the unit's own credentials: %v", err)
	}

	// Load between a and b over their route while the unit changes.
	ncA, err := a.node.Connect("load")
	if err != nil {
		t.Fatal(err)
	}
	defer ncA.Close()
	ncB, err := b.node.Connect("load")
	if err != nil {
		t.Fatal(err)
	}
	defer ncB.Close()
	var received atomic.Int64
	if _, err := ncB.Subscribe("load.>", func(*nats.Msg) { received.Add(1) }); err != nil {
		t.Fatal(err)
	}
	_ = ncB.Flush()
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	wg.Add(1)
	go func() {
		defer wg.Done()
		payload := make([]byte, 1024)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				for range 2 {
					_ = ncA.Publish("load.x", payload)
				}
			}
		}
	}()
	poll.Eventually(t, 10*time.Second, func() error {
		if received.Load() == 0 {
			return errors.New("no load reaches b")
		}
		return nil
	})

	waitHealthy(t, votes, "a", "b", "c")

	// c leaves u1: its agent stops, and the cloud drops it once it has
	// not reported for the node TTL.
	from := votes.len()
	left := time.Now()
	apps[2].RequireStop()
	waitMeshed(t, "u1", a, b)
	poll.Eventually(t, 15*time.Second, func() error {
		for _, e := range []edge{a, b} {
			if e.node.Mesh().Password == old.Password || e.node.Status().RouteRotations != 1 {
				return fmt.Errorf("%s: route password not rotated once (%d rotations)", e.node.Name(), e.node.Status().RouteRotations)
			}
		}
		return nil
	})
	rotated := a.node.Mesh()
	if b.node.Mesh().Password != rotated.Password {
		t.Fatal("a and b hold different route passwords")
	}

	// c comes back with a server of its own and replays the old
	// credentials: its routes are refused.
	intruder := natstest.Edge(t, h, "c", natstest.EdgeOptions{})
	if err := intruder.SetMesh(old); err != nil {
		t.Fatal(err)
	}
	for _, e := range []edge{a, b} {
		if err := natstest.RouteConnect(t, e.node, "u1", old.User, old.Password); !errors.Is(err, natstest.ErrRouteRefused) {
			t.Fatalf("%s accepts the departed node's credentials: %v", e.node.Name(), err)
		}
		if err := natstest.RouteConnect(t, e.node, "u1", rotated.User, rotated.Password); err != nil {
			t.Fatalf("%s refuses the rotated credentials: %v", e.node.Name(), err)
		}
	}
	waitMeshed(t, "u1", a, b)
	// Its outbound route may show for the moment between the dial and
	// the peer's refusal; it must not last.
	poll.Eventually(t, 5*time.Second, func() error {
		if peers := intruder.Status().RoutedPeers; len(peers) != 0 {
			return fmt.Errorf("the departed node routes to %v", peers)
		}
		return nil
	})

	// Votes of a and b about each other: healthy throughout, and from the
	// departure on never more than a vote TTL (3 refreshes) apart, for
	// at least three refreshes after the rotation.
	const ttl = 6 * time.Second
	poll.Eventually(t, 30*time.Second, func() error {
		for _, pair := range [][2]string{{"a", "b"}, {"b", "a"}} {
			_, ts := votes.since(from, pair[0], pair[1])
			if len(ts) == 0 || time.Since(left) < 3*ttl/2 || ts[len(ts)-1].Sub(left) < ttl {
				return fmt.Errorf("waiting for votes of %s on %s after the rotation", pair[0], pair[1])
			}
		}
		return nil
	})
	for _, pair := range [][2]string{{"a", "b"}, {"b", "a"}} {
		vs, ts := votes.since(from, pair[0], pair[1])
		prev := left
		for i, v := range vs {
			if v.GetVerdict() != atollv1.Verdict_VERDICT_HEALTHY {
				t.Errorf("vote of %s on %s at +%v: %v %d/%d", pair[0], pair[1], ts[i].Sub(left).Round(time.Millisecond), v.GetVerdict(), v.GetNormal(), v.GetAbnormal())
			}
			if gap := ts[i].Sub(prev); gap > ttl {
				t.Errorf("votes of %s on %s %v apart at +%v (TTL %v)", pair[0], pair[1], gap, ts[i].Sub(left), ttl)
			}
			prev = ts[i]
		}
	}
	if received.Load() == 0 {
		t.Fatal("no load was delivered")
	}
}
