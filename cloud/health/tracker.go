package health

import (
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/atoll-edge/atoll/internal/quorum"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Tally is the cloud's reading of the fresh votes about one node.
type Tally struct {
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
	// LastVote is when the ballot of the freshest vote reached the hub
	// (zero: none).
	LastVote time.Time
	// Graced counts the votes of voters whose link the hub reported
	// closed less than the cut grace ago: they count for no verdict, but
	// Protecting includes them.
	Graced int
	// Protecting is quorum.Verdict over the votes that count and the
	// graced ones: what protection decides by (Protect), so that the
	// links of a site cut off, reported closed one at a time, do not take
	// its nodes below quorum one by one before the last close makes the
	// unit held.
	Protecting atollv1.Verdict
}

// Votes is the number of fresh votes.
func (t Tally) Votes() int { return t.Healthy + t.Unhealthy + t.Undecided }

// stored is one voter's vote about a node as the tracker keeps it: what
// tallies and operators read of it, copied out of the decoded ballot
// (one heap object per vote rather than a message and its timestamps,
// which the collector would walk for every vote of a large fleet). Names
// are interned: one string per node however many votes name it
// (BenchmarkTrackerMemory).
type stored struct {
	unit                       string
	verdict                    atollv1.Verdict
	normal, abnormal, checkers uint32
	// made and since are the voter's clock: when it made the ballot, and
	// since when the verdict has held.
	made, since time.Time
	// published is when the hub stored the ballot; it expires ttl after.
	published time.Time
	ttl       time.Duration
}

// store copies v, a vote of ballot b stored by the hub at published, with
// the ballot's TTL (the tracker's default when it gives none).
func (t *Tracker) store(b *atollv1.Ballot, v *atollv1.Vote, published time.Time) stored {
	return stored{
		unit: t.intern(b.GetUnit()), verdict: v.GetVerdict(),
		normal: v.GetNormal(), abnormal: v.GetAbnormal(), checkers: v.GetNormal() + v.GetAbnormal(),
		made: b.GetTime().AsTime(), since: v.GetSince().AsTime(),
		published: published, ttl: t.ttl(b),
	}
}

// ttl is how long the votes of b count: its own TTL, or the default.
func (t *Tracker) ttl(b *atollv1.Ballot) time.Duration {
	if ttl := b.GetTtl().AsDuration(); ttl > 0 {
		return ttl
	}
	return t.defaultTTL
}

// votesOf returns the votes of b that count: a vote about the voter
// itself never does (a node's word about itself), nor one without a
// node, nor a second vote about the same node.
func votesOf(b *atollv1.Ballot) []*atollv1.Vote {
	votes := b.GetVotes()
	seen := make(map[string]bool, len(votes))
	for i, v := range votes {
		if v.GetNode() == "" || v.GetNode() == b.GetVoter() || seen[v.GetNode()] {
			// Rare: copy the ones before, then filter the rest.
			out := slices.Clone(votes[:i])
			for _, v := range votes[i:] {
				if v.GetNode() != "" && v.GetNode() != b.GetVoter() && !seen[v.GetNode()] {
					seen[v.GetNode()] = true
					out = append(out, v)
				}
			}
			return out
		}
		seen[v.GetNode()] = true
	}
	return votes
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

// Tracker keeps every voter's latest ballot, as the vote of each voter
// about each node, and tallies them. Votes expire by the hub's clock (the
// time JetStream stored their ballot) plus the TTL the voter gave, so
// voters' clock skew does not matter.
type Tracker struct {
	defaultTTL time.Duration
	// cutGrace: how long a cut voter's votes keep protecting
	// (Tally.Protecting; SetCutGrace).
	cutGrace time.Duration

	mu     sync.RWMutex
	byNode map[string]map[string]stored // node → voter → its vote
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
	// links: voter → when its newest leaf connection opened (the hub
	// server's clock), so the close of an older one reported later cuts
	// nothing (Superseded).
	links map[string]time.Time
	// names holds one copy of each node and unit name the votes use
	// (intern).
	names map[string]string
	// due is no later than the first time Prune has anything to drop (a
	// vote expiring, a ballot record or a cut to forget; zero: unknown,
	// scan): before it Prune returns at once. A scan walks every vote
	// under the write lock, and keep-alive ballots (every 30 s, TTL 75 s)
	// leave nothing to drop for most of their life.
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
	return &Tracker{defaultTTL: defaultTTL, byNode: map[string]map[string]stored{}, byVoter: map[string]map[string]bool{}, ballots: map[string]ballotRecord{}, cuts: map[string]time.Time{}, links: map[string]time.Time{}, names: map[string]string{}}
}

// ObserveBallot records ballot b, stored by the hub at published. A
// ballot replaces the voter's whole previous ballot: a node it no longer
// names loses the voter's vote. A ballot not newer than the voter's last
// one recorded (a duplicate, or one delivered out of order) is ignored. It
// returns the nodes whose vote from the voter changed (Changing) or was
// dropped; a ballot that only repeats fresh votes returns none.
func (t *Tracker) ObserveBallot(b *atollv1.Ballot, published time.Time) []string {
	if published.IsZero() {
		published = time.Now()
	}
	voter, unit, made := b.GetVoter(), b.GetUnit(), b.GetTime().AsTime()
	votes := votesOf(b)
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
		if t.changes(voter, unit, v, published) {
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
		t.set(v.GetNode(), voter, t.store(b, v, published))
	}
	t.ballots[voter] = ballotRecord{made: made, published: published, nodes: nodes, ttl: b.GetTtl().AsDuration()}
	t.dueBy(t.forgetBallot(t.ballots[voter]))
	return touched
}

// Refresh records a ballot of voter that repeats its previous one: the
// same nodes in the same order (agents sort their entries), each with the
// verdict and unit of the voter's vote about it, and none of those votes
// expired. Those votes are renewed in place (times, counts, since);
// nothing else changes, so no node is touched. It returns false, having
// recorded nothing, for any other ballot, which ObserveBallot then takes.
// Keep-alive ballots — every voter's every 30 s, a vote per other member —
// are most of what the cloud handles; this way each vote costs one
// lookup and one assignment.
func (t *Tracker) Refresh(b *atollv1.Ballot, published time.Time) bool {
	voter, votes, unit := b.GetVoter(), b.GetVotes(), b.GetUnit()
	made, ttl, voteTTL := b.GetTime().AsTime(), b.GetTtl().AsDuration(), t.ttl(b)
	t.mu.Lock()
	defer t.mu.Unlock()
	prev, ok := t.ballots[voter]
	if !ok || len(votes) == 0 || len(votes) != len(prev.nodes) || !t.newer(voter, made, published) {
		return false
	}
	for i, v := range votes {
		old, ok := t.byNode[prev.nodes[i]][voter]
		if _, cut := t.cutOf(voter, old); !ok || cut || v.GetNode() != prev.nodes[i] || old.verdict != v.GetVerdict() || old.unit != unit || old.expired(published) {
			return false
		}
	}
	for i, v := range votes {
		voters := t.byNode[prev.nodes[i]]
		st := voters[voter]
		st.normal, st.abnormal, st.checkers = v.GetNormal(), v.GetAbnormal(), v.GetNormal()+v.GetAbnormal()
		st.made, st.since = made, v.GetSince().AsTime()
		st.published, st.ttl = published, voteTTL
		voters[voter] = st
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

// SetCutGrace sets how long the votes of a voter whose link the hub
// reported closed keep protecting (Tally.Protecting). Call it before use.
func (t *Tracker) SetCutGrace(d time.Duration) { t.cutGrace = d }

// cutOf reports whether e, voter's vote, was stored before the hub last
// reported the voter's link closed, and when that was. The caller holds
// t.mu.
func (t *Tracker) cutOf(voter string, e stored) (time.Time, bool) {
	cut, ok := t.cuts[voter]
	return cut, ok && !e.published.After(cut)
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

// Changing returns the nodes whose vote from b's voter b would change
// (ObserveBallot's touched, but for the nodes the voter stops naming): a
// new vote, another verdict or unit, or one that replaces an expired vote.
// A keep-alive that repeats fresh votes changes no verdict, and tallying
// every node of a large unit before and after each ballot would cost
// O(unit²) per ballot.
func (t *Tracker) Changing(b *atollv1.Ballot, published time.Time) []string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var out []string
	for _, v := range votesOf(b) {
		if t.changes(b.GetVoter(), b.GetUnit(), v, published) {
			out = append(out, v.GetNode())
		}
	}
	return out
}

// changes reports whether v, voter's vote for unit, changes what the
// voter's vote about its node counts for. The caller holds t.mu.
func (t *Tracker) changes(voter, unit string, v *atollv1.Vote, published time.Time) bool {
	old, ok := t.byNode[v.GetNode()][voter]
	_, cut := t.cutOf(voter, old)
	return !ok || cut || old.verdict != v.GetVerdict() || old.unit != unit || old.expired(published)
}

// LinkDown reports whether the hub reported voter's leaf link closed
// after it stored the voter's latest ballot (or the voter has none
// since): the voter is cut from the cloud until it sends again.
func (t *Tracker) LinkDown(voter string) bool {
	_, down := t.LinkDownSince(voter)
	return down
}

// LinkDownSince is LinkDown, with when the hub reported the link closed.
func (t *Tracker) LinkDownSince(voter string) (time.Time, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	cut, ok := t.cuts[voter]
	if !ok || t.ballots[voter].published.After(cut) {
		return time.Time{}, false
	}
	return cut, true
}

// LastBallot returns when the hub stored the latest ballot of voter this
// tracker recorded (zero: none).
func (t *Tracker) LastBallot(voter string) time.Time {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.ballots[voter].published
}

// set records voter's vote about node; callers hold mu.
func (t *Tracker) set(node, voter string, e stored) {
	node, voter = t.intern(node), t.intern(voter)
	voters := t.byNode[node]
	if voters == nil {
		voters = map[string]stored{}
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

// Cut stops every vote of voter stored by the hub at or before at from
// counting: the hub reported the voter's leaf connection closed then, so
// what it said before no longer stands. They keep protecting for the cut
// grace (Tally.Protecting), then go. A ballot stored after at (the voter
// back on another link) counts. It returns the nodes that lost the
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
			if t.cutGrace <= 0 {
				t.drop(node, voter)
			} else {
				t.dueBy(at.Add(t.cutGrace))
			}
			out = append(out, node)
		}
	}
	return out
}

// LinkOpened records that a hub server opened voter's leaf connection at
// start.
func (t *Tracker) LinkOpened(voter string, start time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if start.After(t.links[voter]) {
		t.links[t.intern(voter)] = start
		t.dueBy(start.Add(maxCutAge))
	}
}

// Superseded reports whether the close at at of voter's leaf connection
// opened at start comes after the voter opened a newer one: a server
// notices a link that died silently only once its pings go unanswered, by
// when the node may have linked again, to it or to another server. Such
// a close cuts nothing: the voter is linked, sends its ballot over the
// new link at once (edge/voter), and that ballot replaces its votes; until
// it does they count as any voter's do, for their TTL. (A zero start,
// unknown: false.)
func (t *Tracker) Superseded(voter string, start, at time.Time) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	newer := t.links[voter]
	return !start.IsZero() && newer.After(start) && newer.Before(at)
}

// expired reports whether the vote no longer counts at now.
func (e stored) expired(now time.Time) bool { return now.After(e.published.Add(e.ttl)) }

// Tally reads the fresh votes about node, of a unit of members (the node
// included), at now: the node's own vote never counts, nor does one that
// counts rejects (nil: every other voter counts; it is given the voter
// and the unit the vote was cast for). The verdict is quorum.Verdict's.
func (t *Tracker) Tally(node string, now time.Time, members int, counts func(voter, unit string) bool) Tally {
	t.mu.RLock()
	defer t.mu.RUnlock()
	tl := Tally{Members: members}
	var freshest stored
	var gh, gu, gn int // graced votes, by verdict
	for voter, e := range t.byNode[node] {
		if voter == node || e.expired(now) || (counts != nil && !counts(voter, e.unit)) {
			continue
		}
		if cut, ok := t.cutOf(voter, e); ok {
			if now.Before(cut.Add(t.cutGrace)) {
				tl.Graced++
				switch e.verdict {
				case atollv1.Verdict_VERDICT_HEALTHY:
					gh++
				case atollv1.Verdict_VERDICT_UNHEALTHY:
					gu++
				default:
					gn++
				}
			}
			continue
		}
		switch e.verdict {
		case atollv1.Verdict_VERDICT_HEALTHY:
			tl.Healthy++
		case atollv1.Verdict_VERDICT_UNHEALTHY:
			tl.Unhealthy++
		default:
			tl.Undecided++
		}
		if e.published.After(tl.LastVote) {
			tl.LastVote, freshest = e.published, e
		}
	}
	// Voters see the same reports and normally agree; an undecided vote
	// only matters while a report is in flight to some voters and not
	// others, and then it blocks a verdict rather than making one.
	tl.Verdict = quorum.Verdict(members, tl.Healthy, tl.Unhealthy, tl.Undecided)
	tl.Protecting = tl.Verdict
	if tl.Graced > 0 {
		tl.Protecting = quorum.Verdict(members, tl.Healthy+gh, tl.Unhealthy+gu, tl.Undecided+gn)
	}
	if !tl.LastVote.IsZero() {
		tl.Normal, tl.Abnormal, tl.Checkers = freshest.normal, freshest.abnormal, freshest.checkers
		tl.Since = freshest.since
	}
	return tl
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
	delete(t.links, node)
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
			cut, isCut := t.cutOf(voter, e)
			switch {
			case e.expired(now) || (isCut && !now.Before(cut.Add(t.cutGrace))):
				t.drop(target, voter)
				n++
			case isCut:
				units[e.unit] = true
				next(cut.Add(t.cutGrace))
			default:
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
	// A link's opening only matters to the close of an older one, which
	// its server reports within a few ping intervals.
	for voter, at := range t.links {
		if now.After(at.Add(maxCutAge)) {
			delete(t.links, voter)
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
		_, link := t.links[name]
		if !node && !voter && !ballot && !link && !units[name] {
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

// Vote is one voter's fresh vote about a node, as read for operators.
type Vote struct {
	// Voter is the node that voted.
	Voter string
	// Verdict is the voter's verdict.
	Verdict atollv1.Verdict
	// Made is when the voter made its ballot (its clock); Stored is when
	// the hub stored the ballot (the time its TTL runs from).
	Made, Stored time.Time
}

// Votes returns the fresh votes about node at now that counts accepts
// (nil: all), by voter name; the node's own vote is never among them.
// They are the votes Tally counts.
func (t *Tracker) Votes(node string, now time.Time, counts func(voter, unit string) bool) []Vote {
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := make([]Vote, 0, len(t.byNode[node]))
	for voter, e := range t.byNode[node] {
		if _, cut := t.cutOf(voter, e); cut || voter == node || e.expired(now) || (counts != nil && !counts(voter, e.unit)) {
			continue
		}
		out = append(out, Vote{Voter: voter, Verdict: e.verdict, Made: e.made, Stored: e.published})
	}
	slices.SortFunc(out, func(a, b Vote) int { return strings.Compare(a.Voter, b.Voter) })
	return out
}
