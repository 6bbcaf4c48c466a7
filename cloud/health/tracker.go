package health

import (
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/atoll-edge/atoll/internal/quorum"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Judgement is the cloud's reading of the votes about one node.
type Judgement struct {
	// Verdict is quorum.Verdict over the fresh votes that count: NONE
	// unless more than half of the node's unit's other members voted,
	// then their strict majority.
	Verdict atollv1.Verdict
	// Fresh votes that count, by verdict.
	Healthy, Unhealthy, Undecided int
	// Members of the node's unit, the node included.
	Members int
	// Counts of the freshest vote: checkers saying normal and abnormal.
	Normal, Abnormal, Checkers uint32
	// Since when the freshest vote's verdict has held (voter's clock).
	Since time.Time
	// LastVote is when the freshest vote reached the hub (zero: none).
	LastVote time.Time
}

// Votes is the number of fresh votes.
func (j Judgement) Votes() int { return j.Healthy + j.Unhealthy + j.Undecided }

// entry is one voter's recorded vote about a node: what judging and
// operators read of it, copied out of the decoded message. At 10,000
// nodes in units of 180 the tracker holds 1.8 million votes; kept as
// decoded *Vote messages (2.5 heap objects per vote with their
// timestamps and names) the collector took about a quarter of
// atoll-cloud's CPU profile. Names are interned (one string per node
// however many votes name it): 0.06 objects per vote
// (BenchmarkTrackerMemory).
type entry struct {
	unit                       string
	verdict                    atollv1.Verdict
	normal, abnormal, checkers uint32
	// made and since are the voter's clock: when it made the vote, and
	// since when the verdict has held.
	made, since time.Time
	// published is when the hub stored the vote; it expires ttl after.
	published time.Time
	ttl       time.Duration
}

// record copies v, stored by the hub at published, with its TTL (the
// tracker's default when it gives none).
func (t *Tracker) record(v *atollv1.Vote, published time.Time) entry {
	ttl := v.GetTtl().AsDuration()
	if ttl <= 0 {
		ttl = t.defaultTTL
	}
	return entry{
		unit: t.intern(v.GetUnit()), verdict: v.GetVerdict(),
		normal: v.GetNormal(), abnormal: v.GetAbnormal(), checkers: v.GetCheckers(),
		made: v.GetTime().AsTime(), since: v.GetSince().AsTime(),
		published: published, ttl: ttl,
	}
}

// intern returns the tracker's copy of a node or unit name, so it keeps
// one string per name, not one per decoded message; Prune drops the names
// nothing uses any more. The caller holds t.mu.
func (t *Tracker) intern(s string) string {
	if c, ok := t.names[s]; ok {
		return c
	}
	s = strings.Clone(s)
	t.names[s] = s
	return s
}

// Tracker keeps the latest vote of every voter about every node and judges
// them. Votes expire by the hub's clock (the time JetStream stored them)
// plus the TTL the voter gave, so voters' clock skew does not matter.
type Tracker struct {
	defaultTTL time.Duration

	mu     sync.RWMutex
	byNode map[string]map[string]entry // node → voter → latest vote
	// byVoter indexes byNode the other way (voter → the nodes it has a
	// vote about), so a cut or a departed voter costs its own votes, not
	// a scan of every node.
	byVoter map[string]map[string]bool
	// ballots: voter → its latest ballot recorded (its time, the voter's
	// clock; the nodes it names), so an older or repeated ballot delivered
	// late changes nothing.
	ballots map[string]ballotRecord
	// cuts: voter → the latest time the hub reported its leaf link
	// closed; what the voter had stored by then never counts, even when
	// delivered after the cut (a replica catching up on the stream).
	cuts map[string]time.Time
	// names holds one copy of each node and unit name the votes use
	// (intern).
	names map[string]string
	// due is no later than the first time Prune has anything to drop (a
	// vote expiring, a ballot record or a cut to forget; zero: unknown,
	// scan): before it Prune returns at once. Prune scanned every vote
	// every 2 s under the write lock — at 10,000 nodes in units of 180,
	// 1.8 million votes, an eighth of atoll-cloud's CPU and a quarter of a
	// second each time that no ballot could be recorded — where keep-alive
	// ballots (every 30 s, TTL 75 s) leave nothing to drop for 45 s.
	due time.Time
	// scans counts the scans Prune made (tests).
	scans int
}

type ballotRecord struct {
	made      time.Time
	published time.Time
	nodes     []string
	ttl       time.Duration
}

// NewTracker returns an empty tracker; votes without a TTL live defaultTTL.
func NewTracker(defaultTTL time.Duration) *Tracker {
	return &Tracker{defaultTTL: defaultTTL, byNode: map[string]map[string]entry{}, byVoter: map[string]map[string]bool{}, ballots: map[string]ballotRecord{}, cuts: map[string]time.Time{}, names: map[string]string{}}
}

// ObserveBallot records the votes of one ballot of voter (events.BallotVotes),
// made at made by the voter's clock and stored by the hub at published. A
// ballot replaces the voter's whole previous ballot: a node it no longer
// names loses the voter's vote. A ballot not newer than the voter's last
// one recorded (a duplicate, or one delivered out of order) is ignored. It
// returns the nodes whose vote from voter changed (Changing) or was
// dropped; a ballot that only repeats fresh votes returns none.
func (t *Tracker) ObserveBallot(voter string, made, published time.Time, ttl time.Duration, votes []*atollv1.Vote) []string {
	if published.IsZero() {
		published = time.Now()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.newer(voter, made, published) {
		return nil
	}
	prev := t.ballots[voter]
	named := make(map[string]bool, len(votes))
	nodes := make([]string, 0, len(votes))
	var touched []string
	for _, v := range votes {
		named[v.GetNode()] = true
		nodes = append(nodes, t.intern(v.GetNode()))
		if t.changes(voter, v, published) {
			touched = append(touched, v.GetNode())
		}
	}
	for _, node := range prev.nodes {
		if !named[node] {
			t.drop(node, voter)
			touched = append(touched, node)
		}
	}
	for _, v := range votes {
		t.set(v.GetNode(), voter, t.record(v, published))
	}
	t.ballots[voter] = ballotRecord{made: made, published: published, nodes: nodes, ttl: ttl}
	t.dueBy(t.forgetBallot(t.ballots[voter]))
	return touched
}

// Refresh records a ballot of voter that repeats its previous one: the
// same nodes in the same order (agents sort their entries), each with the
// verdict and unit of the voter's vote about it, and none of those votes
// expired. Those votes are renewed in place (times, counts, since);
// nothing else changes, so no node is touched. It returns false, having
// recorded nothing, for any other ballot, which ObserveBallot then takes.
// Keep-alive ballots — every voter's every 30 s, 179 entries in a unit of
// 180 — are most of what the cloud handles; this way each entry costs one
// lookup and one assignment, and the ballot is not expanded into votes.
func (t *Tracker) Refresh(b *atollv1.Ballot, published time.Time) bool {
	voter, entries, unit := b.GetVoter(), b.GetEntries(), b.GetUnit()
	made, ttl := b.GetTime().AsTime(), b.GetTtl().AsDuration()
	voteTTL := ttl
	if voteTTL <= 0 {
		voteTTL = t.defaultTTL
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	prev, ok := t.ballots[voter]
	if !ok || len(entries) == 0 || len(entries) != len(prev.nodes) || !t.newer(voter, made, published) {
		return false
	}
	for i, e := range entries {
		old, ok := t.byNode[prev.nodes[i]][voter]
		if !ok || e.GetNode() != prev.nodes[i] || old.verdict != e.GetVerdict() || old.unit != unit || old.expired(published) {
			return false
		}
	}
	for i, e := range entries {
		voters := t.byNode[prev.nodes[i]]
		v := voters[voter]
		v.normal, v.abnormal, v.checkers = e.GetNormal(), e.GetAbnormal(), e.GetNormal()+e.GetAbnormal()
		v.made, v.since = made, e.GetSince().AsTime()
		v.published, v.ttl = published, voteTTL
		voters[voter] = v
	}
	t.dueBy(published.Add(voteTTL))
	t.ballots[voter] = ballotRecord{made: made, published: published, nodes: prev.nodes, ttl: ttl}
	t.dueBy(t.forgetBallot(t.ballots[voter]))
	return true
}

// dueBy makes Prune scan at at or before; callers hold mu.
func (t *Tracker) dueBy(at time.Time) {
	if !t.due.IsZero() && at.Before(t.due) {
		t.due = at
	}
}

// forgetBallot is when Prune forgets the voter of ballot b: a ballot
// record outlives its votes by a little, so a late duplicate of the
// voter's last ballot cannot count again.
func (t *Tracker) forgetBallot(b ballotRecord) time.Time {
	return b.published.Add(2 * max(b.ttl, t.defaultTTL))
}

// Newer reports whether a ballot from voter made at made would be
// recorded: no ballot of the voter made at or after it is, and the hub
// has not reported the voter's link closed after publishing it.
func (t *Tracker) Newer(voter string, made, published time.Time) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.newer(voter, made, published)
}

// newer is Newer for a caller holding t.mu.
func (t *Tracker) newer(voter string, made, published time.Time) bool {
	if prev, had := t.ballots[voter]; had && !made.After(prev.made) {
		return false
	}
	if cut, ok := t.cuts[voter]; ok && !published.After(cut) {
		return false
	}
	return true
}

// Changing returns the nodes whose vote from voter the votes would
// change (ObserveBallot's touched, but for the nodes the voter stops
// naming): a new vote, another verdict or unit, or one that replaces an
// expired vote. A keep-alive that repeats fresh votes changes no verdict,
// and judging every node of a large unit before and after each ballot
// was O(unit²) per ballot: at units of 180 the ballots fell behind by
// more than their TTL.
func (t *Tracker) Changing(voter string, published time.Time, votes []*atollv1.Vote) []string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []string
	for _, v := range votes {
		if t.changes(voter, v, published) {
			out = append(out, v.GetNode())
		}
	}
	return out
}

// changes reports whether v changes what voter's vote about its node
// counts for. The caller holds t.mu.
func (t *Tracker) changes(voter string, v *atollv1.Vote, published time.Time) bool {
	old, ok := t.byNode[v.GetNode()][voter]
	return !ok || old.verdict != v.GetVerdict() || old.unit != v.GetUnit() || old.expired(published)
}

// LinkDown reports whether the hub reported voter's leaf link closed
// after it stored the voter's latest vote or ballot (or the voter has
// none since): the voter is cut from the cloud until it sends again.
func (t *Tracker) LinkDown(voter string) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	cut, ok := t.cuts[voter]
	if !ok {
		return false
	}
	last := t.ballots[voter].published
	for node := range t.byVoter[voter] {
		if e := t.byNode[node][voter]; e.published.After(last) {
			last = e.published
		}
	}
	return !last.After(cut)
}

// LastBallot returns when the hub stored the latest ballot of voter this
// tracker recorded (zero: none).
func (t *Tracker) LastBallot(voter string) time.Time {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.ballots[voter].published
}

// set records voter's vote about node; callers hold mu.
func (t *Tracker) set(node, voter string, e entry) {
	node, voter = t.intern(node), t.intern(voter)
	voters := t.byNode[node]
	if voters == nil {
		voters = map[string]entry{}
		t.byNode[node] = voters
	}
	voters[voter] = e
	t.dueBy(e.published.Add(e.ttl))
	nodes := t.byVoter[voter]
	if nodes == nil {
		nodes = map[string]bool{}
		t.byVoter[voter] = nodes
	}
	nodes[node] = true
}

// drop removes voter's vote about node; callers hold mu.
func (t *Tracker) drop(node, voter string) {
	if voters := t.byNode[node]; voters != nil {
		delete(voters, voter)
		if len(voters) == 0 {
			delete(t.byNode, node)
		}
	}
	if nodes := t.byVoter[voter]; nodes != nil {
		delete(nodes, node)
		if len(nodes) == 0 {
			delete(t.byVoter, voter)
		}
	}
}

// Cut drops every vote of voter stored by the hub at or before at: the
// hub reported the voter's leaf connection closed then, so what it said
// before no longer stands. A ballot stored after at (the voter back on
// another link) keeps counting. It returns the nodes that lost the
// voter's vote.
func (t *Tracker) Cut(voter string, at time.Time) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if at.After(t.cuts[voter]) {
		t.cuts[voter] = at
		t.dueBy(at.Add(maxCutAge))
	}
	var out []string
	for node := range t.byVoter[voter] {
		if e, ok := t.byNode[node][voter]; ok && !e.published.After(at) {
			t.drop(node, voter)
			out = append(out, node)
		}
	}
	return out
}

// Observe records v, published (stored by the hub) at published. An older
// vote of the same voter about the same node is ignored; it reports
// whether v was recorded.
func (t *Tracker) Observe(v *atollv1.Vote, published time.Time) bool {
	if published.IsZero() {
		published = time.Now()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.byNode[v.GetNode()][v.GetVoter()]; ok && !v.GetTime().AsTime().After(old.made) {
		return false
	}
	t.set(v.GetNode(), v.GetVoter(), t.record(v, published))
	return true
}

// expired reports whether the vote no longer counts at now.
func (e entry) expired(now time.Time) bool { return now.After(e.published.Add(e.ttl)) }

// Judge reads the fresh votes about node, of a unit of members (the node
// included), at now: the node's own vote never counts, nor does one that
// counts rejects (nil: every other voter counts; it is given the voter
// and the unit the vote was cast for). The verdict is quorum.Verdict's.
func (t *Tracker) Judge(node string, now time.Time, members int, counts func(voter, unit string) bool) Judgement {
	t.mu.RLock()
	defer t.mu.RUnlock()
	j := Judgement{Members: members}
	var freshest entry
	for voter, e := range t.byNode[node] {
		if voter == node || e.expired(now) || (counts != nil && !counts(voter, e.unit)) {
			continue
		}
		switch e.verdict {
		case atollv1.Verdict_VERDICT_HEALTHY:
			j.Healthy++
		case atollv1.Verdict_VERDICT_UNHEALTHY:
			j.Unhealthy++
		default:
			j.Undecided++
		}
		if e.published.After(j.LastVote) {
			j.LastVote, freshest = e.published, e
		}
	}
	// Voters see the same reports and normally agree; an undecided vote
	// only matters while a report is in flight to some voters and not
	// others, and then it blocks a verdict rather than making one.
	j.Verdict = quorum.Verdict(members, j.Healthy, j.Unhealthy, j.Undecided)
	if !j.LastVote.IsZero() {
		j.Normal, j.Abnormal, j.Checkers = freshest.normal, freshest.abnormal, freshest.checkers
		j.Since = freshest.since
	}
	return j
}

// maxCutAge is how long a cut is kept: longer than any ballot's TTL.
const maxCutAge = 10 * time.Minute

// Forget drops every vote about node and every vote node cast (it left
// the cluster).
func (t *Tracker) Forget(node string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for voter := range t.byNode[node] {
		t.drop(node, voter)
	}
	for target := range t.byVoter[node] {
		t.drop(target, node)
	}
	delete(t.ballots, node)
}

// Prune drops the votes expired at now: they no longer count, and
// without this the votes about nodes that left (or never existed) would
// stay forever. It returns how many it dropped. Until the first vote
// expires (or a record is to be forgotten) it does nothing (due).
func (t *Tracker) Prune(now time.Time) int {
	t.mu.RLock()
	idle := !t.due.IsZero() && !now.After(t.due)
	t.mu.RUnlock()
	if idle {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.scans++
	n := 0
	units := map[string]bool{}
	var due time.Time
	next := func(at time.Time) {
		if due.IsZero() || at.Before(due) {
			due = at
		}
	}
	for target, voters := range t.byNode {
		for voter, e := range voters {
			if e.expired(now) {
				t.drop(target, voter)
				n++
			} else {
				units[e.unit] = true
				next(e.published.Add(e.ttl))
			}
		}
	}
	// A voter's ballot record outlives its votes by a little, so a late
	// duplicate of its last ballot cannot count again; after that the
	// voter is forgotten.
	for voter, b := range t.ballots {
		if at := t.forgetBallot(b); now.After(at) {
			delete(t.ballots, voter)
		} else {
			next(at)
		}
	}
	// A cut only matters for ballots stored before it, which have expired
	// by now.
	for voter, at := range t.cuts {
		if now.After(at.Add(maxCutAge)) {
			delete(t.cuts, voter)
		} else {
			next(at.Add(maxCutAge))
		}
	}
	// Nothing left: the next record sets due (zero until then: scan).
	t.due = due
	for name := range t.names {
		_, node := t.byNode[name]
		_, voter := t.byVoter[name]
		_, ballot := t.ballots[name]
		if !node && !voter && !ballot && !units[name] {
			delete(t.names, name)
		}
	}
	return n
}

// Size is the number of nodes with a recorded vote and of votes recorded.
func (t *Tracker) Size() (nodes, votes int) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, voters := range t.byNode {
		votes += len(voters)
	}
	return len(t.byNode), votes
}

// CastVote is one voter's fresh vote about a node, as read for operators.
type CastVote struct {
	// Voter is the node that voted.
	Voter string
	// Verdict is the voter's verdict.
	Verdict atollv1.Verdict
	// Made is when the voter made it (its clock); Stored is when the
	// hub stored it (the time its TTL runs from).
	Made, Stored time.Time
}

// Votes returns the fresh votes about node at now that counts accepts
// (nil: all), by voter name; the node's own vote is never among them.
// They are the votes Judge counts.
func (t *Tracker) Votes(node string, now time.Time, counts func(voter, unit string) bool) []CastVote {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]CastVote, 0, len(t.byNode[node]))
	for voter, e := range t.byNode[node] {
		if voter == node || e.expired(now) || (counts != nil && !counts(voter, e.unit)) {
			continue
		}
		out = append(out, CastVote{Voter: voter, Verdict: e.verdict, Made: e.made, Stored: e.published})
	}
	slices.SortFunc(out, func(a, b CastVote) int { return strings.Compare(a.Voter, b.Voter) })
	return out
}
