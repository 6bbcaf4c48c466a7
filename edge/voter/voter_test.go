package voter

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/test/poll"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/edge/membership"
	"github.com/atoll-edge/atoll/events"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
)

func count(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}

func TestDecide(t *testing.T) {
	H, U, N := atollv1.Verdict_VERDICT_HEALTHY, atollv1.Verdict_VERDICT_UNHEALTHY, atollv1.Verdict_VERDICT_NONE
	tests := []struct {
		name             string
		members          int
		normal, abnormal int
		want             atollv1.Verdict
	}{
		{"alone", 1, 0, 0, N},
		{"the other one says normal", 2, 1, 0, H},
		{"the other one says abnormal", 2, 0, 1, U},
		{"no other reported", 2, 0, 0, N},
		{"unanimous", 4, 3, 0, H},
		{"majority normal", 4, 2, 1, H},
		{"majority abnormal", 4, 1, 2, U},
		{"split two against two", 5, 2, 2, N},
		{"split one against one", 3, 1, 1, N},
		{"exactly half normal of six", 7, 3, 3, N},
		{"four of seven", 8, 4, 3, H},
		{"too few others fresh", 5, 2, 0, N},
		{"just enough others fresh", 5, 2, 1, H},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Decide(tt.members, tt.normal, tt.abnormal); got != tt.want {
				t.Fatalf("Decide(%d, %d, %d) = %v, want %v", tt.members, tt.normal, tt.abnormal, got, tt.want)
			}
		})
	}
}

func TestFresh(t *testing.T) {
	c := Config{Timeout: 6 * time.Second, Skew: 2 * time.Second}
	now := time.Unix(1000, 0)
	tests := []struct {
		age  time.Duration
		want bool
	}{
		{0, true},
		{6 * time.Second, true},
		{8 * time.Second, true},                    // timeout + skew
		{8*time.Second + time.Millisecond, false},  // past it
		{-2 * time.Second, true},                   // checker's clock ahead within skew
		{-2*time.Second - time.Millisecond, false}, // too far in the future
		{time.Hour, false},
	}
	for _, tt := range tests {
		if got := c.Fresh(now.Add(-tt.age), now); got != tt.want {
			t.Errorf("Fresh(age %v) = %v, want %v", tt.age, got, tt.want)
		}
		if got, want := c.Future(now.Add(-tt.age), now), tt.age < -c.Skew; got != want {
			t.Errorf("Future(age %v) = %v, want %v", tt.age, got, want)
		}
	}
}

func report(checker string, at time.Time, normal map[string]bool) *atollv1.ProbeReport {
	r := &atollv1.ProbeReport{Checker: checker, Unit: "u1", ReportTime: timestamppb.New(at)}
	for node, ok := range normal {
		r.Peers = append(r.Peers, &atollv1.PeerResult{Node: node, Normal: ok})
	}
	return r
}

func TestTally(t *testing.T) {
	now := time.Unix(1000, 0)
	c := Config{Timeout: 6 * time.Second, Skew: 2 * time.Second}
	reports := map[string]*atollv1.ProbeReport{
		"a": report("a", now, map[string]bool{"a": true, "b": true, "c": false}),
		"b": report("b", now.Add(-time.Second), map[string]bool{"a": true, "b": true, "c": false}),
		"c": report("c", now.Add(-time.Minute), map[string]bool{"a": false, "b": false, "c": true}), // stale
	}
	dup := report("d", now, map[string]bool{"c": true})
	dup.Peers = append(dup.Peers, &atollv1.PeerResult{Node: "c", Normal: true}) // listed twice
	reports["d"] = dup
	got := Tally(reports, func(r *atollv1.ProbeReport) bool { return c.Fresh(r.GetReportTime().AsTime(), now) })
	// A checker's result about itself does not count: a's about a, b's
	// about b, d's about c does (d is another checker).
	want := map[string]Count{"a": {1, 0}, "b": {1, 0}, "c": {1, 2}}
	for node, w := range want {
		if got[node] != w {
			t.Errorf("tally[%s] = %+v, want %+v", node, got[node], w)
		}
	}
}

// members is a fixed unit membership.
type members struct {
	mu   sync.Mutex
	view membership.View
	ch   chan struct{}
}

// nodeKeys holds one identity key per node name for the whole test
// binary: members are published with it and reports signed with it.
var nodeKeys sync.Map // name → nkeys.KeyPair

func keyOf(name string) nkeys.KeyPair {
	if kp, ok := nodeKeys.Load(name); ok {
		return kp.(nkeys.KeyPair)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		panic(err)
	}
	got, _ := nodeKeys.LoadOrStore(name, kp)
	return got.(nkeys.KeyPair)
}

func pubOf(name string) string {
	pub, _ := keyOf(name).PublicKey()
	return pub
}

// newMembers is a unit whose view publishes every member's key.
func newMembers(unit string, names ...string) *members {
	m := &members{ch: make(chan struct{}, 1), view: membership.View{Unit: unit}}
	for _, n := range names {
		m.view.Members = append(m.view.Members, &atollv1.UnitMember{Name: n, NodeKey: pubOf(n)})
	}
	return m
}

func (m *members) Current() membership.View { m.mu.Lock(); defer m.mu.Unlock(); return m.view }
func (m *members) Changes() <-chan struct{} { return m.ch }

// votes records the latest vote per node as the hub sees them (in the
// ballots it sees).
type votes struct {
	mu      sync.Mutex
	got     map[string]*atollv1.Vote
	ballots []*atollv1.Ballot // every ballot the hub saw, in order
	// voter publishes no vote about itself: what it thinks of its own
	// node is read from its state.
	voter *Voter
}

func (v *votes) of(node string) *atollv1.Vote {
	if v.voter != nil && node == v.voter.self {
		v.voter.mu.Lock()
		defer v.voter.mu.Unlock()
		s, ok := v.voter.sent[node]
		if !ok {
			return nil
		}
		return &atollv1.Vote{Node: node, Verdict: s.verdict, Normal: uint32(s.normal), Abnormal: uint32(s.abnormal)}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.got[node]
}

// unit runs a voter on node a of a real two-server unit (a, b) and returns
// a connection on b to publish reports with, and the votes seen by the hub.
func unit(t *testing.T, cfg Config, mem *members) (*Voter, *nats.Conn, *votes) {
	t.Helper()
	return unitLogging(t, cfg, mem, natstest.Logger(t, slog.LevelWarn))
}

// unitLogging is unit with the voter logging to log.
func unitLogging(t *testing.T, cfg Config, mem *members, log *slog.Logger) (*Voter, *nats.Conn, *votes) {
	t.Helper()
	h := natstest.Hub(t)
	servers := natstest.Unit(t, h, "u1", natstest.EdgeOptions{}, "a", "b")
	ncA, err := servers[0].Connect("voter")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ncA.Close)
	ncB, err := servers[1].Connect("checker")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ncB.Close)
	hub, err := h.Connect("observer")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hub.Close)
	seen := &votes{got: map[string]*atollv1.Vote{}}
	if _, err := eventbus.Subscribe(hub, events.BallotSubjects, "test", func(_ context.Context, ev eventbus.Event[*atollv1.Ballot]) error {
		seen.mu.Lock()
		for _, vote := range ev.Msg.GetVotes() {
			if vote.GetNode() != ev.Msg.GetVoter() {
				seen.got[vote.GetNode()] = vote
			}
		}
		seen.ballots = append(seen.ballots, ev.Msg)
		seen.mu.Unlock()
		return nil
	}, eventbus.ConsumeOptions{}); err != nil {
		t.Fatal(err)
	}
	_ = hub.Flush()
	js, err := jetstream.New(hub)
	if err != nil {
		t.Fatal(err)
	}
	ctx0, cancel0 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel0()
	if err := eventbus.EnsureStreams(ctx0, js, events.StreamOptions{Replicas: 1, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	v, err := New(cfg, "a", mem, hublink.Of(ncA, nil), log, nil, eventbus.NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	seen.voter = v
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = v.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return v, ncB, seen
}

// publishReport publishes r signed by its checker's key.
func publishReport(t *testing.T, nc *nats.Conn, r *atollv1.ProbeReport) {
	t.Helper()
	subj, err := events.ProbeSubject(r.GetUnit(), r.GetChecker())
	if err != nil {
		t.Fatal(err)
	}
	if err := events.PublishSigned(nc, subj, r, "", keyOf(r.GetChecker())); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
}

func waitVerdict(t *testing.T, seen *votes, node string, want atollv1.Verdict, normal, abnormal uint32) {
	t.Helper()
	poll.Eventually(t, 10*time.Second, func() error {
		v := seen.of(node)
		if v.GetVerdict() != want || v.GetNormal() != normal || v.GetAbnormal() != abnormal {
			return fmt.Errorf("vote on %s = %v %d/%d, want %v %d/%d", node, v.GetVerdict(), v.GetNormal(), v.GetAbnormal(), want, normal, abnormal)
		}
		return nil
	})
}

// TestVotesOverTheUnit: reports published on another server of the unit
// reach the voter over routes; the hub's stream stores its votes; a unit of
// five split three against two gives no verdict on the three (two others
// say normal, two abnormal); a checker that stops reporting stops counting
// once its last report is older than the timeout, and with too few fresh
// others left there is no verdict.
func TestVotesOverTheUnit(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Timeout, cfg.Skew, cfg.Tick, cfg.KeepAlive = 1500*time.Millisecond, 100*time.Millisecond, 50*time.Millisecond, time.Second
	mem := newMembers("u1", "a", "b", "c", "d", "e")
	v, pub, seen := unit(t, cfg, mem)

	// {a, b, c} see each other, {d, e} see each other. Publish reports
	// every 200 ms so they stay fresh; stop d's, then e's, later.
	stop := map[string]chan struct{}{"d": make(chan struct{}), "e": make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			now := time.Now()
			side1 := map[string]bool{"a": true, "b": true, "c": true, "d": false, "e": false}
			side2 := map[string]bool{"a": false, "b": false, "c": false, "d": true, "e": true}
			for _, c := range []string{"a", "b", "c"} {
				publishReport(t, pub, report(c, now, side1))
			}
			for _, c := range []string{"d", "e"} {
				select {
				case <-stop[c]:
				default:
					publishReport(t, pub, report(c, now, side2))
				}
			}
			select {
			case <-tick.C:
			case <-ctx.Done():
				return
			}
		}
	}()

	for _, n := range []string{"a", "b", "c"} {
		waitVerdict(t, seen, n, atollv1.Verdict_VERDICT_NONE, 2, 2)
	}
	for _, n := range []string{"d", "e"} {
		waitVerdict(t, seen, n, atollv1.Verdict_VERDICT_UNHEALTHY, 1, 3)
	}
	// d stops reporting: three of a's four others are still fresh, and
	// their majority decides.
	close(stop["d"])
	waitVerdict(t, seen, "a", atollv1.Verdict_VERDICT_HEALTHY, 2, 1)
	waitVerdict(t, seen, "e", atollv1.Verdict_VERDICT_UNHEALTHY, 0, 3)
	// e stops too: two of four others is not more than half.
	close(stop["e"])
	waitVerdict(t, seen, "a", atollv1.Verdict_VERDICT_NONE, 2, 0)
	waitVerdict(t, seen, "d", atollv1.Verdict_VERDICT_UNHEALTHY, 0, 3)
	if n := count(v.metrics.published.WithLabelValues("change")); n < 1 {
		t.Errorf("acknowledged ballots counted: %v", n)
	}
}

// TestIgnoresOutsiders: reports from checkers outside the unit, results
// about nodes outside it, and payloads that lie about their checker are
// ignored and counted.
func TestIgnoresOutsiders(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Tick, cfg.KeepAlive = 50*time.Millisecond, time.Second
	mem := newMembers("u1", "a", "b")
	v, pub, seen := unit(t, cfg, mem)

	// Subscriptions propagate over routes and leafs asynchronously, so keep
	// publishing until the hub sees the votes.
	poll.Eventually(t, 10*time.Second, func() error {
		now := time.Now()
		publishReport(t, pub, report("intruder", now, map[string]bool{"a": false, "b": false}))
		publishReport(t, pub, report("b", now, map[string]bool{"a": true, "b": true, "x": false}))
		// b's server publishes a report claiming to come from a.
		liar := report("a", now, map[string]bool{"b": false})
		subj, _ := events.ProbeSubject("u1", "b")
		msg, _ := events.NewMsg(subj, liar, "")
		if err := pub.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
		// b's report about a decides; nothing counts about b (its own
		// report does not, and the liar's is dropped).
		if vote := seen.of("a"); vote.GetVerdict() != atollv1.Verdict_VERDICT_HEALTHY || vote.GetNormal() != 1 || vote.GetAbnormal() != 0 {
			return fmt.Errorf("vote on a = %v %d/%d, want healthy 1/0", vote.GetVerdict(), vote.GetNormal(), vote.GetAbnormal())
		}
		if vote := seen.of("b"); vote == nil || vote.GetVerdict() != atollv1.Verdict_VERDICT_NONE || vote.GetNormal() != 0 || vote.GetAbnormal() != 0 {
			return fmt.Errorf("vote on b = %v %d/%d, want none 0/0", vote.GetVerdict(), vote.GetNormal(), vote.GetAbnormal())
		}
		return nil
	})
	if n := count(v.metrics.ignored.WithLabelValues("checker_not_member")); n < 1 {
		t.Errorf("non-member reports ignored: %v", n)
	}
	if n := count(v.metrics.ignored.WithLabelValues("peer_not_member")); n < 1 {
		t.Errorf("non-member results ignored: %v", n)
	}
	if n := v.evm.TerminatedCount("probe-reports", eventbus.ReasonIdentity); n < 1 {
		t.Errorf("reports with a false checker dropped: %v", n)
	}
}

// TestOneWarnForOutsiders: an agent whose unit view lacks a peer gets that
// peer's report every round. It logs one WARN naming the peer once the
// peer has reported for a few rounds, not one per report, counts every
// report, and warns again only after its membership changed.
func TestOneWarnForOutsiders(t *testing.T) {
	var logs natstest.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	v, err := New(DefaultConfig(), "a", newMembers("u1", "a", "b"), nil, log, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	v.setMembers(membership.View{Unit: "u1", Members: []*atollv1.UnitMember{{Name: "a"}, {Name: "b"}}})
	warns := func() int { return strings.Count(logs.String(), "level=WARN") }
	rounds := func(n int) {
		for range n {
			now := time.Now()
			v.Observe(report("c", now, map[string]bool{"a": true}))
			v.Observe(report("b", now, map[string]bool{"a": true}))
		}
	}
	rounds(outsiderRounds - 1)
	if n := warns(); n != 0 {
		t.Fatalf("%d WARN lines before %d rounds:\n%s", n, outsiderRounds, logs.String())
	}
	rounds(20)
	if n := warns(); n != 1 {
		t.Fatalf("%d WARN lines after %d rounds, want 1:\n%s", n, outsiderRounds+19, logs.String())
	}
	if !strings.Contains(logs.String(), "checkers=[c]") {
		t.Fatalf("the WARN does not name the peer:\n%s", logs.String())
	}
	if n := count(v.metrics.ignored.WithLabelValues("checker_not_member")); n != float64(outsiderRounds-1+20) {
		t.Fatalf("checker_not_member = %v, want every report counted", n)
	}
	// The view catches up: c is a member, the INFO says so.
	v.setMembers(membership.View{Unit: "u1", Members: []*atollv1.UnitMember{{Name: "a"}, {Name: "b"}, {Name: "c"}}})
	if !strings.Contains(logs.String(), "are members now") {
		t.Fatalf("no line saying the ignored peers are members now:\n%s", logs.String())
	}
	// c leaves for good and keeps reporting: one more WARN.
	v.setMembers(membership.View{Unit: "u1", Members: []*atollv1.UnitMember{{Name: "a"}, {Name: "b"}}})
	rounds(20)
	if n := warns(); n != 2 {
		t.Fatalf("%d WARN lines after the membership changed, want 2:\n%s", n, logs.String())
	}
}
