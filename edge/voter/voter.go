// Package voter turns the unit's probe reports into verdicts. It listens
// to every checker's reports over the unit's routes (so it keeps working
// with the cloud link down; the reports never go to the hub), keeps the
// freshest report per checker, and for each member N applies
// internal/quorum's rule to the fresh reports of the other members about N
// (N's own report never counts): no verdict unless more than half of N's
// unit's other members reported fresh, otherwise their strict majority. A
// report counts only when signed by the key the unit view publishes for
// its checker (verify.go).
//
// # Ballots: traffic that follows change
//
// The voter sends the hub one message, a Ballot, carrying its verdicts on
// every other member of the unit. The freshness rules:
//
//   - change: a ballot goes out at the first evaluation (every Tick) after a
//     verdict or its counts change (a checker's reports went stale or came
//     back), the membership changes, or the node's leaf link to the hub
//     comes back up or moves to a new connection (another hub server: a
//     reconnect between two evaluations counts too), and once more
//     relinkAgain after a new connection; a verdict change
//     therefore reaches the hub within one Tick of the report that caused
//     it. In a steady unit nothing of this moves: every checker reports
//     every 2 s, well within the timeout;
//   - keep-alive: otherwise the same verdicts are sent again every
//     KeepAlive (30 s), marked keepalive;
//   - acknowledged: each ballot is published with a JetStream
//     acknowledgement and retried until the stream stores it or a newer
//     ballot replaces it (sender.go); retries keep the Nats-Msg-Id;
//   - expiry: the cloud counts a ballot until TTL (2.5 keep-alives) after
//     the hub stored it, until the voter's next ballot replaces it, or until
//     the hub reports the voter's leaf connection closed, whichever is
//     first: a voter that lost its link stops counting as soon as the hub
//     server notices, not after a TTL (cloud/health).
//
// In steady state a node thus sends 1/KeepAlive ballots per second, however
// large its unit, where it sent one vote per member every 5 s and a probe
// report every 2 s before.
package voter

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/edge/membership"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/quorum"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Config tunes the voter.
type Config struct {
	// Timeout: a report older than this (by its report time) no longer
	// counts. Three probe periods by default.
	Timeout time.Duration
	// Skew tolerated between the checkers' clocks and the voter's, in both
	// directions.
	Skew time.Duration
	// KeepAlive: a ballot whose verdicts did not change is sent again
	// after this long.
	KeepAlive time.Duration
	// TTL is how long the cloud may count a ballot after storing it; it
	// must outlast a keep-alive and its retries.
	TTL time.Duration
	// Tick is how often the voter re-evaluates (for staleness and for new
	// reports): a verdict change is sent within one tick.
	Tick time.Duration
	// AckTimeout: a ballot not acknowledged within this long is sent
	// again, after a backoff from RetryMin doubling up to RetryMax.
	AckTimeout         time.Duration
	RetryMin, RetryMax time.Duration
}

// DefaultConfig suits a 2 s probe period.
func DefaultConfig() Config {
	return Config{Timeout: 6 * time.Second, Skew: 2 * time.Second, KeepAlive: 30 * time.Second, TTL: 75 * time.Second,
		Tick: 250 * time.Millisecond, AckTimeout: 2 * time.Second, RetryMin: 250 * time.Millisecond, RetryMax: 5 * time.Second}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.Timeout <= 0:
		return errors.New("voter: timeout must be positive")
	case c.Skew < 0:
		return errors.New("voter: skew must not be negative")
	case c.KeepAlive <= 0:
		return errors.New("voter: keep-alive must be positive")
	case c.TTL < c.KeepAlive+c.AckTimeout:
		return errors.New("voter: ttl must be at least the keep-alive plus the ack timeout")
	case c.Tick <= 0 || c.Tick > c.KeepAlive:
		return errors.New("voter: tick must be positive and at most the keep-alive")
	case c.AckTimeout <= 0:
		return errors.New("voter: ack timeout must be positive")
	case c.RetryMin <= 0 || c.RetryMax < c.RetryMin:
		return errors.New("voter: retry backoff must be positive, its maximum at least its minimum")
	}
	return nil
}

// Fresh reports whether a report made at reportTime still counts at now.
func (c Config) Fresh(reportTime, now time.Time) bool {
	age := now.Sub(reportTime)
	return age <= c.Timeout+c.Skew && !c.Future(reportTime, now)
}

// Future reports whether reportTime is further ahead of now than the skew
// allows: such a report is rejected, not kept for later.
func (c Config) Future(reportTime, now time.Time) bool {
	return reportTime.Sub(now) > c.Skew
}

// Count is what the fresh reports say about one node.
type Count struct{ Normal, Abnormal int }

// Tally counts, per judged node, the fresh reports of other checkers that
// say it is normal and abnormal: a checker's result about itself never
// counts. A report counts once per node even if it lists the node twice.
func Tally(reports map[string]*atollv1.ProbeReport, fresh func(*atollv1.ProbeReport) bool) map[string]Count {
	out := map[string]Count{}
	for _, r := range reports {
		if !fresh(r) {
			continue
		}
		seen := make(map[string]bool, len(r.GetPeers()))
		for _, p := range r.GetPeers() {
			if seen[p.GetNode()] || p.GetNode() == r.GetChecker() {
				continue
			}
			seen[p.GetNode()] = true
			c := out[p.GetNode()]
			if p.GetNormal() {
				c.Normal++
			} else {
				c.Abnormal++
			}
			out[p.GetNode()] = c
		}
	}
	return out
}

// Decide is the voter's rule about a node of a unit of members, given the
// fresh reports of the other members about it (Tally):
// quorum.Verdict — no verdict unless more than half of the others reported,
// then their strict majority.
func Decide(members, normal, abnormal int) atollv1.Verdict {
	return quorum.Verdict(members, normal, abnormal, 0)
}

// Members tells the voter who is in its unit.
type Members interface {
	Current() membership.View
	Changes() <-chan struct{}
}

type sent struct {
	verdict          atollv1.Verdict
	normal, abnormal int
	since            time.Time
}

// Voter computes and publishes votes.
type Voter struct {
	cfg     Config
	self    string
	members Members
	link    *hublink.Link
	log     *slog.Logger
	metrics *metrics
	evm     *eventbus.Metrics
	now     func() time.Time

	out  *sender       // set by Run
	leaf func() uint64 // the node's leaf connection to the hub: its id, 0 while down (nil: always up)

	warns *limiter // WARNs about reports that fail verification

	mu      sync.Mutex
	unit    string
	member  map[string]bool
	keys    map[string]string // member → its identity key ("" when the view has none)
	reports map[string]*atollv1.ProbeReport
	sent    map[string]sent
	// ballot is the last ballot made (nil: none since the unit or the
	// membership changed) and conn the leaf connection at the last
	// evaluation.
	ballot *atollv1.Ballot
	conn   uint64
	// again is when the ballot goes out once more after a new leaf
	// connection (zero: not due; relinkAgain).
	again time.Time
	// outsiders counts, per checker, the reports ignored as coming from
	// a non-member since the membership last changed; warned is set once
	// the WARN about them is out.
	outsiders map[string]int
	warned    bool
}

// outsiderRounds is how many reports of one non-member are ignored (at
// DEBUG) before the one WARN: a peer just removed from the unit may send
// a round or two, an agent with a view that stays behind keeps getting
// them.
const outsiderRounds = 3

// New returns the voter of node self; it hears reports and publishes votes
// over link (connected by the time Run is called).
func New(cfg Config, self string, members Members, link *hublink.Link, log *slog.Logger, m *metrics, evm *eventbus.Metrics) (*Voter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if m == nil {
		m = newMetrics(nil)
	}
	return &Voter{cfg: cfg, self: self, members: members, link: link, log: log.With("component", "voter"),
		metrics: m, evm: evm, now: time.Now, reports: map[string]*atollv1.ProbeReport{}, sent: map[string]sent{}, member: map[string]bool{},
		outsiders: map[string]int{}, keys: map[string]string{}, warns: newLimiter(unverifiedWarnEvery)}, nil
}

// SetLink has the voter send its ballot again as soon as conn, the id of
// the node's leaf connection to the hub (0 while down), names a new
// connection: the hub may have stopped counting the voter when the old
// one closed. A reconnect counts even when no evaluation saw the link
// down (a hub server died and the leaf moved to another within a Tick; a
// silently dead link the hub closed by its pings before the edge noticed
// and reconnected). Call it before Run.
func (v *Voter) SetLink(conn func() uint64) { v.leaf = conn }

// Run follows the unit and votes until ctx is done.
func (v *Voter) Run(ctx context.Context) error {
	out, err := newSender(v.cfg, v.link.Conn(), v.log, v.metrics, v.now)
	if err != nil {
		return err
	}
	v.mu.Lock()
	v.out = out
	v.mu.Unlock()
	if v.leaf != nil {
		conn := v.leaf()
		v.mu.Lock()
		v.conn = conn
		v.mu.Unlock()
	}
	sending := make(chan struct{})
	runCtx, stop := context.WithCancel(ctx)
	go func() { defer close(sending); out.run(runCtx) }()
	defer func() { stop(); <-sending }()

	changes := v.members.Changes()
	var sub *nats.Subscription
	defer func() {
		if sub != nil {
			_ = sub.Unsubscribe()
		}
	}()
	resubscribe := func() {
		view := v.members.Current()
		unitChanged := v.setMembers(view)
		if !unitChanged {
			return
		}
		if sub != nil {
			_ = sub.Unsubscribe()
			sub = nil
		}
		if view.Unit == "" {
			return
		}
		subj, err := events.ProbeUnitSubjects(view.Unit)
		if err != nil {
			v.log.Error("cannot follow unit reports", "unit", view.Unit, "err", err)
			return
		}
		sub, err = eventbus.Subscribe(v.link.Conn(), subj, "probe-reports",
			func(_ context.Context, ev eventbus.Event[*atollv1.ProbeReport]) error { v.receive(ev); return nil },
			eventbus.ConsumeOptions{Logger: v.log, Metrics: v.evm})
		if err != nil {
			v.log.Error("cannot follow unit reports", "unit", view.Unit, "err", err)
		}
	}
	resubscribe()
	t := time.NewTicker(v.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changes:
			resubscribe()
		case <-t.C:
			v.Evaluate()
		}
	}
}

// setMembers applies a membership view: the reports of checkers and the
// votes about nodes that left are forgotten (a new unit starts afresh). It
// reports whether the unit changed.
func (v *Voter) setMembers(view membership.View) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	unitChanged := view.Unit != v.unit
	v.unit = view.Unit
	v.member = make(map[string]bool, len(view.Members))
	v.keys = make(map[string]string, len(view.Members))
	for _, m := range view.Members {
		v.member[m.GetName()] = true
		v.keys[m.GetName()] = m.GetNodeKey()
	}
	if v.warned {
		var admitted []string
		for checker := range v.outsiders {
			if v.member[checker] {
				admitted = append(admitted, checker)
			}
		}
		if len(admitted) > 0 {
			slices.Sort(admitted)
			v.log.Info("peers whose reports were ignored as non-members are members now", "unit", v.unit, "checkers", admitted)
		}
	}
	v.outsiders, v.warned = map[string]int{}, false
	if unitChanged {
		v.reports = map[string]*atollv1.ProbeReport{}
	}
	for checker := range v.reports {
		if !v.member[checker] {
			delete(v.reports, checker)
		}
	}
	for node := range v.sent {
		if unitChanged || !v.member[node] {
			delete(v.sent, node)
		}
	}
	v.ballot = nil // the next evaluation sends a ballot for the new membership
	return unitChanged
}

// Observe takes one probe report, verified (receive) or from the voter's
// own tests. Reports from checkers outside the unit are ignored, and so
// are results about nodes outside it; both are counted.
func (v *Voter) Observe(r *atollv1.ProbeReport) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if r.GetUnit() != v.unit {
		v.metrics.ignored.WithLabelValues("other_unit").Inc()
		return
	}
	if !v.member[r.GetChecker()] {
		v.metrics.ignored.WithLabelValues("checker_not_member").Inc()
		v.ignoreOutsider(r.GetChecker())
		return
	}
	// A report dated ahead of the voter's clock (beyond the skew) is
	// rejected rather than kept: kept, it would shadow the checker's real
	// reports until its date, since only newer reports replace it.
	if v.cfg.Future(r.GetReportTime().AsTime(), v.now()) {
		v.metrics.ignored.WithLabelValues("future").Inc()
		v.log.Warn("ignoring a probe report dated in the future", "checker", r.GetChecker(), "report_time", r.GetReportTime().AsTime(), "skew", v.cfg.Skew)
		return
	}
	if old, ok := v.reports[r.GetChecker()]; ok && !r.GetReportTime().AsTime().After(old.GetReportTime().AsTime()) {
		v.metrics.ignored.WithLabelValues("not_newer").Inc()
		return
	}
	peers := r.GetPeers()[:0:0]
	for _, p := range r.GetPeers() {
		if v.member[p.GetNode()] {
			peers = append(peers, p)
		} else {
			v.metrics.ignored.WithLabelValues("peer_not_member").Inc()
		}
	}
	r.Peers = peers
	v.reports[r.GetChecker()] = r
}

// ignoreOutsider logs a report ignored because its checker is not in the
// unit view: at DEBUG, and once per membership at WARN when a checker
// keeps reporting for outsiderRounds. A peer of the unit that this agent
// does not count as a member usually means this agent's unit view is
// behind (see the membership's readiness and catch-ups). Callers hold mu.
func (v *Voter) ignoreOutsider(checker string) {
	v.outsiders[checker]++
	if v.warned || v.outsiders[checker] < outsiderRounds {
		v.log.Debug("ignoring probe report from a non-member", "checker", checker, "unit", v.unit)
		return
	}
	v.warned = true
	var checkers []string
	for c, n := range v.outsiders {
		if n >= outsiderRounds {
			checkers = append(checkers, c)
		}
	}
	slices.Sort(checkers)
	v.log.Warn("ignoring every probe report of peers that are not in this agent's view of its unit: its unit view may be behind; they count for nothing until the view lists them (logged once per view; see atoll_voter_reports_ignored_total{reason=\"checker_not_member\"})",
		"unit", v.unit, "checkers", checkers, "members", len(v.member), "reports", outsiderRounds)
}

// Evaluate recomputes every member's verdict and queues a ballot when one
// is due: a verdict or the membership changed, the link came back, or the
// keep-alive is up. It returns that ballot (nil: none was due).
func (v *Voter) Evaluate() *atollv1.Ballot {
	now := v.now()
	var conn uint64
	if v.leaf != nil {
		conn = v.leaf()
	}
	v.mu.Lock()
	unit := v.unit
	if unit == "" {
		v.mu.Unlock()
		return nil
	}
	fresh := func(r *atollv1.ProbeReport) bool { return v.cfg.Fresh(r.GetReportTime().AsTime(), now) }
	counts := map[atollv1.Verdict]int{}
	tally := Tally(v.reports, fresh)
	prev := map[string]*atollv1.Vote{}
	for _, e := range v.ballot.GetVotes() {
		prev[e.GetNode()] = e
	}
	relinked := conn != 0 && conn != v.conn
	changed := v.ballot == nil || relinked
	v.conn = conn
	switch {
	case relinked:
		v.again = now.Add(relinkAgain)
	case !v.again.IsZero() && !now.Before(v.again):
		v.again, changed = time.Time{}, true
	}
	votes := make([]*atollv1.Vote, 0, len(v.member))
	for node := range v.member {
		normal, abnormal := tally[node].Normal, tally[node].Abnormal
		verdict := Decide(len(v.member), normal, abnormal)
		counts[verdict]++
		old, had := v.sent[node]
		since := old.since
		if !had || old.verdict != verdict {
			since = now
		}
		v.sent[node] = sent{verdict: verdict, normal: normal, abnormal: abnormal, since: since}
		if node == v.self {
			continue // kept for Verdict and the metrics; the cloud counts no vote about its own voter
		}
		if p, ok := prev[node]; !ok || p.GetVerdict() != verdict || p.GetNormal() != uint32(normal) || p.GetAbnormal() != uint32(abnormal) {
			changed = true
		}
		votes = append(votes, &atollv1.Vote{Node: node, Verdict: verdict, Normal: uint32(normal), Abnormal: uint32(abnormal), Since: timestamppb.New(since)})
	}
	if len(votes) != len(prev) {
		changed = true // a member left
	}
	// A ballot still not stored restampAfter after it was made is made
	// again with the current time: the cloud refuses a ballot whose time
	// is too far from when the hub stored it (--max-vote-skew).
	if box := v.out; box != nil && !changed {
		if waiting, made := box.waitingSince(); waiting && now.Sub(made) >= restampAfter {
			changed = true
		}
	}
	due := changed || now.Sub(v.ballot.GetTime().AsTime()) >= v.cfg.KeepAlive
	var b *atollv1.Ballot
	if due {
		slices.SortFunc(votes, func(a, b *atollv1.Vote) int { return strings.Compare(a.GetNode(), b.GetNode()) })
		b = &atollv1.Ballot{Voter: v.self, Unit: unit, Time: timestamppb.New(now), Members: uint32(len(v.member)),
			Votes: votes, Ttl: durationpb.New(v.cfg.TTL), Keepalive: !changed}
		v.ballot = b
	}
	box := v.out
	v.mu.Unlock()

	for verdict, n := range counts {
		v.metrics.verdicts.WithLabelValues(verdict.String()).Set(float64(n))
	}
	if b == nil || box == nil {
		return b // nothing due, or not running: nothing to send with
	}
	if err := box.put(b, now); err != nil {
		v.log.Error("cannot send ballot", "err", err)
	}
	return b
}

// sender returns the sender once Run has made it (nil before).
func (v *Voter) sender() *sender {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.out
}

// Tracked is the number of nodes the voter keeps state about: checkers
// with a report, nodes with a verdict, and ballots waiting to be stored
// (0 or 1).
func (v *Voter) Tracked() (reports, votes, waiting int) {
	v.mu.Lock()
	reports, votes = len(v.reports), len(v.sent)
	box := v.out
	v.mu.Unlock()
	if box != nil {
		if w, _ := box.pending(); w {
			waiting = 1
		}
	}
	return reports, votes, waiting
}

// relinkAgain is when, after a new leaf connection, the voter sends its
// ballot once more: a hub server notices an old link that died silently
// only once its pings go unanswered (12 s by default: every 4 s, closed
// after 2 missed), possibly after the node linked again through another
// server, and the cloud then drops what the voter sent before that close
// unless it learnt of the new link first (cloud/health:
// Tracker.Superseded).
const relinkAgain = 15 * time.Second

// restampAfter is how old a ballot still waiting to be stored may get
// before the voter makes it again with a fresh time: well within the
// cloud's default --max-vote-skew (30 s).
const restampAfter = 10 * time.Second

// Verdict returns the voter's current verdict on node.
func (v *Voter) Verdict(node string) (atollv1.Verdict, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	s, ok := v.sent[node]
	return s.verdict, ok
}
