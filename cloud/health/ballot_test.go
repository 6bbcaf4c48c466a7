package health

import (
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/cloud/units"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// ballot is voter's ballot for unit u1 made at made, with its verdicts by
// node, sorted by node as voters send them. Each vote says 2 checkers see
// the node normal.
func ballot(voter string, made time.Time, ttl time.Duration, verdicts map[string]atollv1.Verdict) *atollv1.Ballot {
	b := &atollv1.Ballot{Voter: voter, Unit: "u1", Time: timestamppb.New(made), Ttl: durationpb.New(ttl), Members: uint32(len(verdicts) + 1)}
	for _, node := range slices.Sorted(maps.Keys(verdicts)) {
		b.Votes = append(b.Votes, &atollv1.Vote{Node: node, Verdict: verdicts[node], Normal: 2, Since: timestamppb.New(made.Add(-time.Minute))})
	}
	return b
}

// viaWire returns b as a consumer has it: encoded and decoded again,
// with its own copies of every name.
func viaWire(t testing.TB, b *atollv1.Ballot) *atollv1.Ballot {
	t.Helper()
	wire, err := proto.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	var got atollv1.Ballot
	if err := proto.Unmarshal(wire, &got); err != nil {
		t.Fatal(err)
	}
	return &got
}

// TestTrackerBallots: each vote of a ballot counts for the ballot's TTL
// after the hub stored it; the next ballot replaces the whole previous one
// (a node it leaves out loses the vote); a duplicate or an older ballot
// delivered late changes nothing; a ballot's vote about its own voter
// never counts.
func TestTrackerBallots(t *testing.T) {
	now := time.Unix(10_000, 0)
	ttl := 75 * time.Second
	tr := NewTracker(30 * time.Second)
	tally := func(node string, at time.Time) Tally { return tr.Tally(node, at, 3, nil) } // x, y, and the voters
	b1 := ballot("a", now, ttl, map[string]atollv1.Verdict{"x": healthy, "y": healthy, "a": healthy})
	if got := tr.ObserveBallot(b1, now); len(got) != 2 {
		t.Fatalf("first ballot touched %v, want x and y", got)
	}
	tr.ObserveBallot(ballot("b", now, ttl, map[string]atollv1.Verdict{"x": healthy, "y": healthy}), now)
	if j := tally("x", now); j.Verdict != healthy || j.Healthy != 2 {
		t.Fatalf("x = %+v", j)
	}
	if j := tally("a", now); j.Votes() != 0 {
		t.Fatalf("a's vote about itself counted: %+v", j)
	}
	// Still counting just before the TTL, by the hub's clock, with no
	// keep-alive since; not after.
	if j := tally("x", now.Add(ttl)); j.Verdict != healthy {
		t.Fatalf("x before the TTL = %+v", j)
	}
	if j := tally("x", now.Add(ttl+time.Millisecond)); j.Votes() != 0 {
		t.Fatalf("x after the TTL = %+v", j)
	}

	// a's next ballot says x unhealthy and leaves y out.
	b2 := ballot("a", now.Add(time.Second), ttl, map[string]atollv1.Verdict{"x": unhealthy})
	got := tr.ObserveBallot(b2, now.Add(time.Second))
	slices.Sort(got)
	if !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("second ballot touched %v, want x and y", got)
	}
	at := now.Add(time.Second)
	if j := tally("x", at); j.Healthy != 1 || j.Unhealthy != 1 {
		t.Fatalf("x after a's change = %+v", j)
	}
	if j := tally("y", at); j.Healthy != 1 || j.Votes() != 1 {
		t.Fatalf("y after a left it out = %+v", j)
	}

	// Duplicate and reordered deliveries: b2 again, then b1 late.
	if got := tr.ObserveBallot(b2, now.Add(2*time.Second)); got != nil {
		t.Fatalf("duplicate recorded: %v", got)
	}
	if got := tr.ObserveBallot(b1, now.Add(3*time.Second)); got != nil {
		t.Fatalf("older ballot recorded: %v", got)
	}
	if j := tally("x", at); j.Healthy != 1 || j.Unhealthy != 1 {
		t.Fatalf("x after the late deliveries = %+v", j)
	}
	// The duplicate did not extend b2's life either: it expires TTL after
	// its first storing.
	if j := tally("x", at.Add(ttl+time.Second)); j.Votes() != 0 {
		t.Fatalf("x long after = %+v", j)
	}
}

// TestTrackerCut: when the hub reports a voter's leaf link closed, every
// vote it sent before stops counting at once (well within its TTL), the
// other voters' votes stay, and a ballot the voter sends once back counts
// again; a late copy of a ballot from before the cut does not.
func TestTrackerCut(t *testing.T) {
	now := time.Unix(10_000, 0)
	ttl := 75 * time.Second
	tr := NewTracker(30 * time.Second)
	tally := func(node string, at time.Time) Tally { return tr.Tally(node, at, 3, nil) }
	before := ballot("a", now, ttl, map[string]atollv1.Verdict{"x": healthy, "y": healthy})
	tr.ObserveBallot(before, now)
	tr.ObserveBallot(ballot("b", now, ttl, map[string]atollv1.Verdict{"x": healthy}), now)
	cut := now.Add(5 * time.Second)
	got := tr.Cut("a", cut)
	slices.Sort(got)
	if !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("cut touched %v, want x and y", got)
	}
	if j := tally("x", cut); j.Healthy != 1 || j.Votes() != 1 {
		t.Fatalf("x after a's cut = %+v (b's vote must stay)", j)
	}
	if j := tally("y", cut); j.Votes() != 0 {
		t.Fatalf("y after a's cut = %+v", j)
	}
	if got := tr.ObserveBallot(before, cut.Add(time.Second)); got != nil {
		t.Fatalf("a late copy of the ballot before the cut recorded: %v", got)
	}
	// A replica that starts after the cut learns of it (from the links
	// bucket) before it reads the voter's last ballot from the stream:
	// that ballot, stored before the cut, never counts.
	fresh := NewTracker(30 * time.Second)
	fresh.Cut("a", cut)
	if got := fresh.ObserveBallot(before, now); got != nil {
		t.Fatalf("a ballot stored before a known cut recorded: %v", got)
	}
	tr.ObserveBallot(ballot("a", cut.Add(time.Second), ttl, map[string]atollv1.Verdict{"x": healthy, "y": healthy}), cut.Add(2*time.Second))
	if j := tally("y", cut.Add(2*time.Second)); j.Healthy != 1 {
		t.Fatalf("y after a is back = %+v", j)
	}
	// A disconnect event that reaches the cloud after the voter's new
	// ballot (it reconnected elsewhere first) leaves the new ballot alone.
	if got := tr.Cut("a", cut); len(got) != 0 {
		t.Fatalf("a stale cut dropped %v", got)
	}
}

// followLeafLinks follows h's leaf link events (FollowLeafLinks) on a
// system account connection until the test ends: the closes, and the
// openings.
func followLeafLinks(t *testing.T, h *hub.Hub) (losses, opened <-chan LeafLink) {
	t.Helper()
	log := natstest.Logger(t, slog.LevelError)
	sys, err := identity.DialSystem(t.Context(), h.ClientConfig(), h.Issuer(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.Close)
	lc, oc := make(chan LeafLink, 64), make(chan LeafLink, 64)
	sub, err := FollowLeafLinks(sys, h.Issuer().Keys().AccountKey(), log, func(l LeafLink) {
		ch := oc
		if l.Closed {
			ch = lc
		}
		select {
		case ch <- l:
		default:
			t.Errorf("leaf link event dropped (the test reads too few): %+v", l)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return lc, oc
}

// TestCutGrace: the votes of a cut voter count for no verdict at once,
// but keep protecting (Tally.Protecting) for the cut grace: a site's
// links are reported closed one at a time, and the last close, which
// makes the unit held, must come before its nodes fall below quorum. A
// ballot the voter stores after the cut counts again at once.
func TestCutGrace(t *testing.T) {
	now := time.Unix(10_000, 0)
	tr := NewTracker(30 * time.Second)
	tr.SetCutGrace(5 * time.Second)
	tally := func(at time.Time) Tally { return tr.Tally("x", at, 3, nil) }
	for _, voter := range []string{"a", "b"} {
		tr.ObserveBallot(ballot(voter, now, time.Minute, map[string]atollv1.Verdict{"x": healthy}), now)
	}
	cutA, cutB := now.Add(time.Second), now.Add(3*time.Second)
	tr.Cut("a", cutA)
	if j := tally(cutA); j.Verdict != atollv1.Verdict_VERDICT_NONE || j.Healthy != 1 || j.Graced != 1 || j.Protecting != healthy {
		t.Fatalf("after a's cut: %+v; want no verdict, a graced, protecting", j)
	}
	tr.Cut("b", cutB)
	if j := tally(cutB); j.Votes() != 0 || j.Graced != 2 || j.Protecting != healthy {
		t.Fatalf("after b's cut: %+v; want no vote counting, both graced, protecting", j)
	}
	if j := tally(cutA.Add(5 * time.Second)); j.Graced != 1 || j.Protecting != atollv1.Verdict_VERDICT_NONE {
		t.Fatalf("a's grace over: %+v; want b graced alone, not protecting", j)
	}
	if got := tr.Votes("x", cutB, nil); len(got) != 0 {
		t.Fatalf("operators see cut votes: %v", got)
	}
	// b is back: its ballot counts, replacing the cut vote.
	back := cutB.Add(time.Second)
	if got := tr.ObserveBallot(ballot("b", back, time.Minute, map[string]atollv1.Verdict{"x": healthy}), back); len(got) != 1 {
		t.Fatalf("b's ballot after its cut touched %v, want x", got)
	}
	if j := tally(back); j.Healthy != 1 || j.Graced != 1 {
		t.Fatalf("b back: %+v", j)
	}
	// Past the grace, Prune drops the cut vote.
	if n := tr.Prune(cutA.Add(6 * time.Second)); n != 1 {
		t.Fatalf("pruned %d votes, want a's cut one", n)
	}
	if _, votes := tr.Size(); votes != 1 {
		t.Fatalf("%d votes kept, want b's", votes)
	}
}

// TestLeafLossesFromTheHub: the hub's system events report an edge node's
// leaf link closing, with the node's name, to a system account connection;
// the link of a node that stays up reports nothing; the node's next link
// is reported opening, after the closed one.
func TestLeafLossesFromTheHub(t *testing.T) {
	h := natstest.Hub(t)
	losses, opened := followLeafLinks(t, h)
	nodes := natstest.Unit(t, h, "u1", natstest.EdgeOptions{}, "e1", "e2")
	for _, n := range nodes {
		poll.Eventually(t, 20*time.Second, func() error {
			if !n.Status().HubConnected {
				return fmt.Errorf("%s not linked", n.Name())
			}
			return nil
		})
	}
	start := time.Now()
	if err := nodes[0].SetLeafEnabled(false); err != nil {
		t.Fatal(err)
	}
	// Links that meshing the unit bounced before start are not this cut.
	timeout := time.After(15 * time.Second)
	var loss LeafLink
	for found := false; !found; {
		select {
		case l := <-losses:
			if l.At.Before(start) {
				continue
			}
			if l.Node != "e1" || l.Server == "" || l.Start.IsZero() || !l.Start.Before(l.At) {
				t.Fatalf("loss = %+v, want e1's", l)
			}
			found, loss = true, l
			t.Logf("e1's loss reported %v after the link was cut (%s)", time.Since(start).Round(time.Millisecond), l.Reason)
		case <-timeout:
			t.Fatal("no leaf loss reported within 15 s")
		}
	}
	select {
	case l := <-losses:
		t.Fatalf("unexpected loss %+v", l)
	case <-time.After(500 * time.Millisecond):
	}
	if err := nodes[0].SetLeafEnabled(true); err != nil {
		t.Fatal(err)
	}
	timeout = time.After(15 * time.Second)
	for {
		select {
		case l := <-opened:
			if l.Node != "e1" || !l.Start.After(loss.At) {
				continue
			}
			if l.Closed || !l.At.Equal(l.Start) || l.Server == "" {
				t.Fatalf("opening = %+v", l)
			}
			return
		case <-timeout:
			t.Fatal("e1's new link not reported opening within 15 s")
		}
	}
}

// TestLeafLossSilentCut: a leaf link that dies without closing (every
// byte dropped, both ends still up) is closed by the hub after its pings
// go unanswered, and reported, within 15 s.
func TestLeafLossSilentCut(t *testing.T) {
	h := natstest.Hub(t)
	losses, _ := followLeafLinks(t, h)
	proxy := natstest.NewProxy(t, h.LeafURL().Host)
	e := natstest.Edge(t, h, "e1", natstest.EdgeOptions{HubURL: "nats-leaf://" + proxy.Addr()})
	poll.Eventually(t, 20*time.Second, func() error {
		if !e.Status().HubConnected {
			return fmt.Errorf("e1 not linked")
		}
		return nil
	})
	start := time.Now()
	proxy.Stall()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case l := <-losses:
			if l.At.Before(start) || l.Node != "e1" {
				continue
			}
			took := time.Since(start)
			t.Logf("silent cut reported after %v (%s)", took.Round(time.Millisecond), l.Reason)
			if took > 15*time.Second {
				t.Fatalf("silent cut reported after %v, want within 15 s", took)
			}
			return
		case <-timeout:
			t.Fatal("silent cut not reported within 20 s")
		}
	}
}

// TestKeepAliveTouchesNothing: a ballot that repeats its voter's fresh
// votes touches no node (no verdict can change, and tallying every node
// of a large unit for each keep-alive would be O(unit²) per ballot); a changed
// verdict, a vote that had expired, a new node and a node left out are
// touched, and Changing names the same nodes before the ballot is
// recorded.
func TestKeepAliveTouchesNothing(t *testing.T) {
	now := time.Unix(10_000, 0)
	ttl := 75 * time.Second
	tr := NewTracker(30 * time.Second)
	tr.ObserveBallot(ballot("a", now, ttl, map[string]atollv1.Verdict{"x": healthy, "y": healthy, "z": healthy}), now)

	at := now.Add(30 * time.Second)
	keep := ballot("a", at, ttl, map[string]atollv1.Verdict{"x": healthy, "y": healthy, "z": healthy})
	if got := tr.Changing(keep, at); got != nil {
		t.Fatalf("Changing names %v for a keep-alive", got)
	}
	if got := tr.ObserveBallot(keep, at); len(got) != 0 {
		t.Fatalf("a keep-alive touched %v", got)
	}
	if j := tr.Tally("x", at.Add(ttl), 4, nil); j.Votes() != 1 {
		t.Fatalf("the keep-alive did not renew x's vote: %+v", j)
	}

	// y turns unhealthy, z is left out, w is new.
	at = at.Add(30 * time.Second)
	next := ballot("a", at, ttl, map[string]atollv1.Verdict{"x": healthy, "y": unhealthy, "w": healthy})
	want := []string{"w", "y"}
	changing := tr.Changing(next, at)
	slices.Sort(changing)
	if !slices.Equal(changing, want) {
		t.Fatalf("Changing = %v, want %v", changing, want)
	}
	got := tr.ObserveBallot(next, at)
	slices.Sort(got)
	if want := []string{"w", "y", "z"}; !slices.Equal(got, want) {
		t.Fatalf("touched %v, want %v", got, want)
	}

	// A vote renewed after it expired counts again: touched.
	late := at.Add(ttl + time.Second)
	again := ballot("a", late, ttl, map[string]atollv1.Verdict{"x": healthy, "y": unhealthy, "w": healthy})
	got = tr.ObserveBallot(again, late)
	slices.Sort(got)
	if want := []string{"w", "x", "y"}; !slices.Equal(got, want) {
		t.Fatalf("renewing expired votes touched %v, want %v", got, want)
	}
}

// TestBallotsAlreadyRecordedOrExpired: a ballot already recorded (the
// leader's follower and its shared consumer both deliver each one) is
// neither recorded again nor tallied; one whose TTL passed before it was
// handled (a consumer far behind) is recorded, so the voter's order
// holds, but changes no verdict and is counted, however many nodes it
// names; a fresh one after it counts at once.
func TestBallotsAlreadyRecordedOrExpired(t *testing.T) {
	now := time.Unix(10_000, 0)
	ttl := 75 * time.Second
	s := &Service{
		tracker: NewTracker(30 * time.Second),
		now:     func() time.Time { return now },
		units:   map[string]unitStatus{},
		members: units.NewIndex(units.DefaultRule()),
		metrics: newMetrics(prometheus.NewRegistry()),
	}
	for _, n := range []string{"a", "b", "x", "y"} {
		s.members.Set(n, "u1")
	}
	verdicts := map[string]atollv1.Verdict{"x": healthy, "y": healthy}

	// Stored 80 s ago: its TTL passed before it was handled.
	late := ballot("a", now.Add(-80*time.Second), ttl, verdicts)
	if got := s.observeBallot(t.Context(), late, now.Add(-80*time.Second)); got != nil {
		t.Fatalf("a ballot expired on arrival changed %v", got)
	}
	if got := testutil.ToFloat64(s.metrics.lateBallots); got != 1 {
		t.Fatalf("expired ballots counted %v, want 1", got)
	}
	if j := s.Tally("x"); j.Votes() != 0 {
		t.Fatalf("an expired ballot counts: %+v", j)
	}
	if s.tracker.LastBallot("a").IsZero() {
		t.Fatal("the expired ballot was not recorded")
	}

	// b's fresh ballot is one vote of the two x and y need; a's makes it.
	s.observeBallot(t.Context(), ballot("b", now.Add(-time.Second), ttl, verdicts), now.Add(-time.Second))
	fresh := ballot("a", now.Add(-time.Second), ttl, verdicts)
	got := s.observeBallot(t.Context(), fresh, now.Add(-time.Second))
	slices.Sort(got)
	if want := []string{"x", "y"}; !slices.Equal(got, want) {
		t.Fatalf("a fresh ballot changed %v, want %v", got, want)
	}
	// The same ballot again, and an older one delivered late: nothing.
	if got := s.observeBallot(t.Context(), fresh, now.Add(-time.Second)); got != nil {
		t.Fatalf("a ballot delivered twice changed %v", got)
	}
	if got := s.observeBallot(t.Context(), ballot("a", now.Add(-2*time.Second), ttl, map[string]atollv1.Verdict{"x": unhealthy}), now); got != nil {
		t.Fatalf("an older ballot changed %v", got)
	}
	if j := s.Tally("x"); j.Verdict != healthy {
		t.Fatalf("x = %+v after the duplicate and the older ballot, want healthy", j)
	}
	if got := testutil.ToFloat64(s.metrics.lateBallots); got != 1 {
		t.Fatalf("expired ballots counted %v, want still 1", got)
	}

	// A first ballot naming more nodes than maxTallied: all of them go to
	// the reconciles, untallied.
	many := map[string]atollv1.Verdict{}
	for i := range maxTallied + 2 {
		n := fmt.Sprintf("m%02d", i)
		s.members.Set(n, "u1")
		many[n] = healthy
	}
	if got := s.observeBallot(t.Context(), ballot("b", now, ttl, many), now); len(got) != maxTallied+2+2 {
		t.Fatalf("a ballot changing %d votes returned %d nodes, want every node it names and the 2 it drops", maxTallied+2, len(got))
	}
}

// TestTrackerNames: the tracker keeps one copy of each name however many
// ballots name it, and forgets the names once their votes have expired.
func TestTrackerNames(t *testing.T) {
	now := time.Unix(10_000, 0)
	ttl := 75 * time.Second
	tr := NewTracker(30 * time.Second)
	for i := range 3 {
		at := now.Add(time.Duration(i) * time.Second)
		// Each decoded ballot brings its own copies of the names.
		for _, b := range []*atollv1.Ballot{
			ballot("node-a", at, ttl, map[string]atollv1.Verdict{"node-x": healthy, "node-y": healthy}),
			ballot("node-b", at, ttl, map[string]atollv1.Verdict{"node-x": healthy, "node-a": healthy}),
		} {
			tr.ObserveBallot(viaWire(t, b), at)
		}
	}
	x := func(voter string) *byte {
		nodes := tr.ballots[voter].nodes
		return unsafe.StringData(nodes[slices.Index(nodes, "node-x")])
	}
	if n := len(tr.names); n != 5 { // node-a, -b, -x, -y, u1
		t.Errorf("%d names kept, want 5 (four nodes and the unit)", n)
	}
	if x("node-a") != x("node-b") {
		t.Error("two ballots naming the same node keep two copies of its name")
	}
	tr.Prune(now.Add(10 * time.Minute))
	if n := len(tr.names); n != 0 {
		t.Errorf("%d names kept after every vote expired, want 0", n)
	}
}

// TestRefreshIsObserveBallot: a tracker that takes each ballot through
// Refresh first, and ObserveBallot only when Refresh declines, ends each
// step exactly as one that takes every ballot through ObserveBallot; and
// Refresh takes only a repeat of the voter's fresh votes, in order.
func TestRefreshIsObserveBallot(t *testing.T) {
	now := time.Unix(10_000, 0)
	ttl := 75 * time.Second
	type e struct {
		node    string
		verdict atollv1.Verdict
		normal  uint32
	}
	mk := func(voter, unit string, made time.Time, es ...e) *atollv1.Ballot {
		b := &atollv1.Ballot{Voter: voter, Unit: unit, Time: timestamppb.New(made), Ttl: durationpb.New(ttl), Members: 4}
		for _, x := range es {
			b.Votes = append(b.Votes, &atollv1.Vote{Node: x.node, Verdict: x.verdict, Normal: x.normal, Since: timestamppb.New(made)})
		}
		return viaWire(t, b)
	}
	x, y, z := e{"x", healthy, 2}, e{"y", healthy, 2}, e{"z", healthy, 2}
	steps := []struct {
		name    string
		at      time.Duration // published, from now; the ballot is made then
		b       func(made time.Time) *atollv1.Ballot
		cut     bool // cut voter a just before
		refresh bool
	}{
		{"first ballot", 0, func(m time.Time) *atollv1.Ballot { return mk("a", "u1", m, x, y, z) }, false, false},
		{"keep-alive", 30 * time.Second, func(m time.Time) *atollv1.Ballot { return mk("a", "u1", m, x, y, z) }, false, true},
		{"new counts", 60 * time.Second, func(m time.Time) *atollv1.Ballot { return mk("a", "u1", m, x, e{"y", healthy, 1}, z) }, false, true},
		{"verdict change", 61 * time.Second, func(m time.Time) *atollv1.Ballot { return mk("a", "u1", m, x, e{"y", unhealthy, 0}, z) }, false, false},
		{"reordered", 62 * time.Second, func(m time.Time) *atollv1.Ballot { return mk("a", "u1", m, z, x, e{"y", unhealthy, 0}) }, false, false},
		{"same again, in order", 63 * time.Second, func(m time.Time) *atollv1.Ballot { return mk("a", "u1", m, z, x, e{"y", unhealthy, 0}) }, false, true},
		{"one left out", 64 * time.Second, func(m time.Time) *atollv1.Ballot { return mk("a", "u1", m, z, x) }, false, false},
		{"one added", 65 * time.Second, func(m time.Time) *atollv1.Ballot { return mk("a", "u1", m, z, x, y) }, false, false},
		{"a duplicate for one", 66 * time.Second, func(m time.Time) *atollv1.Ballot { return mk("a", "u1", m, z, x, x) }, false, false},
		{"itself for one", 67 * time.Second, func(m time.Time) *atollv1.Ballot { return mk("a", "u1", m, z, x, e{"a", healthy, 2}) }, false, false},
		{"back to three", 68 * time.Second, func(m time.Time) *atollv1.Ballot { return mk("a", "u1", m, x, y, z) }, false, false},
		{"another unit", 69 * time.Second, func(m time.Time) *atollv1.Ballot { return mk("a", "u2", m, x, y, z) }, false, false},
		{"back to its unit", 70 * time.Second, func(m time.Time) *atollv1.Ballot { return mk("a", "u1", m, x, y, z) }, false, false},
		{"older, delivered late", 69 * time.Second, func(m time.Time) *atollv1.Ballot { return mk("a", "u1", m, x, y, z) }, false, false},
		{"after its votes expired", 70*time.Second + ttl + time.Second, func(m time.Time) *atollv1.Ballot { return mk("a", "u1", m, x, y, z) }, false, false},
		{"keep-alive again", 200 * time.Second, func(m time.Time) *atollv1.Ballot { return mk("a", "u1", m, x, y, z) }, false, true},
		{"after a cut", 210 * time.Second, func(m time.Time) *atollv1.Ballot { return mk("a", "u1", m, x, y, z) }, true, false},
		{"empty", 220 * time.Second, func(m time.Time) *atollv1.Ballot { return mk("a", "u1", m) }, false, false},
		{"empty again", 230 * time.Second, func(m time.Time) *atollv1.Ballot { return mk("a", "u1", m) }, false, false},
	}
	both, plain := NewTracker(30*time.Second), NewTracker(30*time.Second)
	for _, s := range steps {
		at := now.Add(s.at)
		b := s.b(at)
		if s.cut {
			both.Cut("a", at.Add(-time.Millisecond))
			plain.Cut("a", at.Add(-time.Millisecond))
		}
		var got []string
		refreshed := both.Refresh(b, at)
		if !refreshed {
			got = both.ObserveBallot(b, at)
		}
		want := plain.ObserveBallot(b, at)
		if refreshed != s.refresh {
			t.Fatalf("%s: Refresh = %v, want %v", s.name, refreshed, s.refresh)
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: touched %v, ObserveBallot alone %v", s.name, got, want)
		}
		if !reflect.DeepEqual(both.byNode, plain.byNode) || !reflect.DeepEqual(both.byVoter, plain.byVoter) ||
			!reflect.DeepEqual(both.ballots, plain.ballots) || !both.due.Equal(plain.due) {
			t.Fatalf("%s: the trackers differ:\n%+v\n%+v\n%+v\n%+v", s.name, both.byNode, plain.byNode, both.ballots, plain.ballots)
		}
	}
}
