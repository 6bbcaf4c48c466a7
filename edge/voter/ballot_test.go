package voter

import (
	"testing"
	"time"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"

	"github.com/atoll-edge/atoll/edge/membership"
	"github.com/atoll-edge/atoll/test/natstest"
)

// clocked is an offline voter of unit {n1, n2, n3} on a clock the test
// moves, whose peers report every one normal every 2 s (report).
type clocked struct {
	t   *testing.T
	v   *Voter
	now time.Time
	bad map[string]bool // nodes the checkers report abnormal
}

func newClocked(t *testing.T) *clocked {
	c := &clocked{t: t, now: time.Unix(100000, 0), bad: map[string]bool{}}
	c.v = offline(t, c.now, "n1", "n2", "n3")
	c.v.now = func() time.Time { return c.now }
	return c
}

// report has every member report at the current time.
func (c *clocked) report() {
	seen := map[string]bool{}
	for _, n := range []string{"n1", "n2", "n3"} {
		seen[n] = !c.bad[n]
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		c.v.Observe(report(n, c.now, seen))
	}
}

func voteOn(b *atollv1.Ballot, node string) *atollv1.Vote {
	for _, e := range b.GetVotes() {
		if e.GetNode() == node {
			return e
		}
	}
	return nil
}

// TestBallotOnChangeAtOnce: the first evaluation sends a ballot; an
// unchanged evaluation sends nothing; the evaluation right after a
// verdict changes sends a ballot, not marked keep-alive, with the new
// verdict and its since; the voter's own node is never in it.
func TestBallotOnChangeAtOnce(t *testing.T) {
	c := newClocked(t)
	c.report()
	b := c.v.Evaluate()
	if b == nil || b.GetKeepalive() || len(b.GetVotes()) != 2 || voteOn(b, "n1") != nil {
		t.Fatalf("first ballot = %v, want a change ballot about n2 and n3", b)
	}
	if got := voteOn(b, "n2").GetVerdict(); got != atollv1.Verdict_VERDICT_HEALTHY {
		t.Fatalf("n2 = %v, want healthy", got)
	}
	c.now = c.now.Add(250 * time.Millisecond)
	if b := c.v.Evaluate(); b != nil {
		t.Fatalf("unchanged evaluation sent %v", b)
	}
	// n2 turns abnormal in the next round of reports.
	c.now = c.now.Add(2 * time.Second)
	c.bad["n2"] = true
	c.report()
	b = c.v.Evaluate()
	if b == nil || b.GetKeepalive() {
		t.Fatalf("verdict change sent %v, want a change ballot at once", b)
	}
	if e := voteOn(b, "n2"); e.GetVerdict() != atollv1.Verdict_VERDICT_UNHEALTHY || !e.GetSince().AsTime().Equal(c.now) {
		t.Fatalf("n2 = %v, want unhealthy since %v", e, c.now)
	}
	if !b.GetTime().AsTime().Equal(c.now) || b.GetTtl().AsDuration() != c.v.cfg.TTL {
		t.Fatalf("ballot time %v ttl %v", b.GetTime().AsTime(), b.GetTtl().AsDuration())
	}
}

// TestBallotOnCountChange: in a unit of five, a checker whose reports go
// stale leaves the verdicts as they were (three of four others still
// report) but changes their counts, and that is sent at once too.
func TestBallotOnCountChange(t *testing.T) {
	now := time.Unix(100000, 0)
	names := []string{"n1", "n2", "n3", "n4", "n5"}
	v := offline(t, now, names...)
	v.now = func() time.Time { return now }
	all := map[string]bool{"n1": true, "n2": true, "n3": true, "n4": true, "n5": true}
	for _, n := range names {
		v.Observe(report(n, now, all))
	}
	if b := v.Evaluate(); b == nil {
		t.Fatal("no first ballot")
	}
	// Everyone but n5 reports again; n5's last report goes stale.
	now = now.Add(v.cfg.Timeout + v.cfg.Skew - time.Second)
	for _, n := range names[:4] {
		v.Observe(report(n, now, all))
	}
	if b := v.Evaluate(); b != nil {
		t.Fatalf("unchanged evaluation sent %v", b)
	}
	now = now.Add(2 * time.Second)
	b := v.Evaluate()
	if b == nil || b.GetKeepalive() {
		t.Fatalf("count change sent %v, want a change ballot", b)
	}
	if e := voteOn(b, "n2"); e.GetVerdict() != atollv1.Verdict_VERDICT_HEALTHY || e.GetNormal() != 3 {
		t.Fatalf("n2 after n5 went stale = %v, want healthy 3/0", e)
	}
}

// TestBallotKeepAlive: over ten minutes of steady reports (every 2 s,
// evaluated every tick) the voter sends one ballot per keep-alive, each
// marked keep-alive and carrying the unchanged verdicts: at most 0.1
// messages a second, whatever the unit's size.
func TestBallotKeepAlive(t *testing.T) {
	c := newClocked(t)
	c.report()
	if c.v.Evaluate() == nil {
		t.Fatal("no first ballot")
	}
	start, lastReport := c.now, c.now
	var sent []*atollv1.Ballot
	for c.now.Sub(start) < 10*time.Minute {
		c.now = c.now.Add(c.v.cfg.Tick)
		if c.now.Sub(lastReport) >= 2*time.Second {
			c.report()
			lastReport = c.now
		}
		if b := c.v.Evaluate(); b != nil {
			sent = append(sent, b)
		}
	}
	want := int(10 * time.Minute / c.v.cfg.KeepAlive)
	if len(sent) != want {
		t.Fatalf("%d ballots in 10 minutes, want %d (one per keep-alive)", len(sent), want)
	}
	prev := start
	for _, b := range sent {
		if !b.GetKeepalive() {
			t.Fatalf("steady ballot at %v not marked keep-alive", b.GetTime().AsTime())
		}
		if gap := b.GetTime().AsTime().Sub(prev); gap != c.v.cfg.KeepAlive {
			t.Fatalf("keep-alive %v after the previous ballot, want %v", gap, c.v.cfg.KeepAlive)
		}
		if e := voteOn(b, "n3"); e.GetVerdict() != atollv1.Verdict_VERDICT_HEALTHY || !e.GetSince().AsTime().Equal(start) {
			t.Fatalf("keep-alive carries n3 = %v, want healthy since %v", e, start)
		}
		prev = b.GetTime().AsTime()
	}
	if rate := float64(len(sent)) / (10 * time.Minute).Seconds(); rate > 0.1 {
		t.Fatalf("%.3f ballots/s in steady state, want at most 0.1", rate)
	}
}

// linked is a clocked voter whose leaf connection is *conn, after its
// first ballot.
func linked(t *testing.T, conn *uint64) *clocked {
	t.Helper()
	c := newClocked(t)
	c.v.SetLink(func() uint64 { return *conn })
	c.report()
	if c.v.Evaluate() == nil {
		t.Fatal("no first ballot")
	}
	return c
}

// TestBallotOnLinkUp: when the node's leaf link comes back the voter sends
// its ballot at once, without waiting for the keep-alive: the hub stopped
// counting the voter when the link went (cloud/health).
func TestBallotOnLinkUp(t *testing.T) {
	conn := uint64(1)
	c := linked(t, &conn)
	c.now = c.now.Add(time.Second)
	conn = 0
	if b := c.v.Evaluate(); b != nil {
		t.Fatalf("link going down sent %v", b)
	}
	c.now = c.now.Add(time.Second)
	conn = 2
	if b := c.v.Evaluate(); b == nil || b.GetKeepalive() {
		t.Fatalf("link back sent %v, want a change ballot at once", b)
	}
	c.now = c.now.Add(time.Second)
	if b := c.v.Evaluate(); b != nil {
		t.Fatalf("link staying up sent %v", b)
	}
}

// TestBallotOnReconnectBetweenTicks: a leaf link that reconnects (to the
// same hub server or another) between two evaluations, never seen down,
// is a new connection, and the ballot goes out at once: the hub may have
// reported the old connection closed (one that died silently is closed by
// the hub's pings, often before the edge notices), and the cloud stopped
// counting the voter then.
func TestBallotOnReconnectBetweenTicks(t *testing.T) {
	conn := uint64(7)
	c := linked(t, &conn)
	c.now = c.now.Add(time.Second)
	if b := c.v.Evaluate(); b != nil {
		t.Fatalf("same connection sent %v", b)
	}
	c.now = c.now.Add(time.Second)
	conn = 8
	if b := c.v.Evaluate(); b == nil || b.GetKeepalive() {
		t.Fatalf("new connection sent %v, want a change ballot at once", b)
	}
	c.now = c.now.Add(time.Second)
	if b := c.v.Evaluate(); b != nil {
		t.Fatalf("connection staying up sent %v", b)
	}
}

// TestBallotAgainAfterRelink: after a new leaf connection the ballot
// goes out at once and once more relinkAgain later (a hub server that
// notices the old link dead only then has the cloud drop the first one),
// and not again until the keep-alive.
func TestBallotAgainAfterRelink(t *testing.T) {
	conn := uint64(7)
	c := linked(t, &conn)
	c.now = c.now.Add(time.Second)
	conn = 8
	if b := c.v.Evaluate(); b == nil || b.GetKeepalive() {
		t.Fatalf("new connection sent %v, want a change ballot at once", b)
	}
	c.now = c.now.Add(relinkAgain - time.Second)
	c.report()
	if b := c.v.Evaluate(); b != nil {
		t.Fatalf("sent %v before relinkAgain", b)
	}
	c.now = c.now.Add(time.Second)
	if b := c.v.Evaluate(); b == nil || b.GetKeepalive() {
		t.Fatalf("relinkAgain after the new connection sent %v, want the ballot again", b)
	}
	c.now = c.now.Add(time.Second)
	c.report()
	if b := c.v.Evaluate(); b != nil {
		t.Fatalf("sent %v again after the second ballot", b)
	}
}

// TestBallotOnMembershipChange: a member joining or leaving sends a ballot
// at once, with exactly the other current members.
func TestBallotOnMembershipChange(t *testing.T) {
	c := newClocked(t)
	c.report()
	c.v.Evaluate()
	view := func(names ...string) membership.View {
		mv := membership.View{Unit: "u1"}
		for _, n := range names {
			mv.Members = append(mv.Members, &atollv1.UnitMember{Name: n, NodeKey: pubOf(n)})
		}
		return mv
	}
	c.now = c.now.Add(time.Second)
	c.v.setMembers(view("n1", "n2"))
	b := c.v.Evaluate()
	if b == nil || len(b.GetVotes()) != 1 || voteOn(b, "n2") == nil || b.GetMembers() != 2 {
		t.Fatalf("after n3 left: %v, want a ballot about n2 alone", b)
	}
	c.now = c.now.Add(time.Second)
	c.v.setMembers(view("n1", "n2", "n3", "n4"))
	b = c.v.Evaluate()
	if b == nil || len(b.GetVotes()) != 3 || voteOn(b, "n4") == nil {
		t.Fatalf("after n3 and n4 joined: %v, want a ballot about n2, n3, n4", b)
	}
}

// TestBallotRestampedWhileWaiting: a ballot the hub has not stored 10 s
// after it was made is made again with the current time (the cloud
// refuses ballots whose time is far from when the hub stored them);
// before that, nothing new is made.
func TestBallotRestampedWhileWaiting(t *testing.T) {
	c := newClocked(t)
	h := natstest.Hub(t)
	nc, err := h.Connect("voter")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	// A sender that never runs: what it is given waits, as with no stream.
	out, err := newSender(c.v.cfg, nc, c.v.log, c.v.metrics, c.v.now)
	if err != nil {
		t.Fatal(err)
	}
	c.v.out = out
	c.report()
	first := c.v.Evaluate()
	if first == nil {
		t.Fatal("no first ballot")
	}
	c.now = c.now.Add(restampAfter - time.Second)
	c.report()
	if b := c.v.Evaluate(); b != nil {
		t.Fatalf("ballot remade %v after it was made", restampAfter-time.Second)
	}
	c.now = c.now.Add(time.Second)
	b := c.v.Evaluate()
	if b == nil || !b.GetTime().AsTime().Equal(c.now) {
		t.Fatalf("waiting ballot not remade with a fresh time after %v: %v", restampAfter, b)
	}
	if waiting, made := out.waitingSince(); !waiting || !made.Equal(c.now) {
		t.Fatalf("the sender waits with the ballot made at %v (waiting %v), want the fresh one", made, waiting)
	}
}
