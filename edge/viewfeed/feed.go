// Package viewfeed follows one space of the hub's views (a filter in
// atoll.view.>) without holding a JetStream consumer: the hub republishes
// every view VIEWS stores on atoll.viewpub.<rest> (events.Republished),
// with its stream sequence and its subject's previous sequence in
// headers, and a Feed subscribes there with core NATS on the agent's own
// server (the leaf link carries it from the hub). Core NATS keeps nothing
// and redelivers nothing, so a Feed catches up with a short-lived
// consumer on VIEWS whenever it may have missed a view:
//
//   - at start, from the handler's cursor (Options.Start);
//   - after every reconnect of the node's leaf link (a new leaf
//     connection, polled from the node's server as edge/membership did);
//   - on a gap: a view whose Nats-Last-Sequence (the previous sequence
//     of the same subject, 0 for none) is neither 0, nor at or below the
//     verified cursor, nor a sequence the feed applied since;
//   - on a view older than one applied that it had not seen (out of
//     order), and when the subscription dropped views (slow consumer);
//   - on a republished view stored after the last catch-up began whose
//     sequence is at or below the verified cursor: the stream may have
//     been rebuilt, its sequences started over (the catch-up's stream
//     info tells);
//   - every CheckPeriod, the net for a loss nothing reveals (the first
//     view of a new subject lost, and nothing after it on that subject);
//   - a second after a catch-up on a hub cluster whose consumer stopped
//     below the stream's last sequence (a light check only; see Cursors).
//
// A catch-up creates an ephemeral pull consumer filtered on the space
// (the edge's permissions name the filter), reads it until nothing is
// pending and lets it go: the edge may not delete consumers, so the hub
// drops it CatchUpLinger after its last request. A consumer is created
// only when the space holds views above the verified cursor: each one
// costs the hub a check of its subscriptions against every leaf link's
// permissions, as its deletion does, which in a fleet's reconnect storm
// was most of the hub's core. Two occasions first make a light check,
// one direct get of the space's last view (no stream info, no consumer),
// and catch up in full only when it shows a need: after a reconnect, when
// that view is above the verified cursor (something was stored since the
// last catch-up); at a periodic check, when it is above the verified
// cursor and was not heard from its republished copy. A full catch-up
// reads the stream info (which finds a rebuilt stream, or says what is
// wrong), then, at start from a kept cursor and for the occasions above,
// the space's last view again, and creates a consumer only when that view
// is above the verified cursor (or the stream serves no direct gets); a
// direct get the hub does not answer fails the catch-up, retried later,
// instead of creating one. Every VerifyEvery-th periodic check is full. A
// light check the hub does not answer fails the catch-up (retried later,
// jittered, as a light check again); the second such failure in a row,
// then every eighth, goes on to the full catch-up, whose stream info says
// what is wrong. In steady state an agent holds no consumer on the hub
// and sends one request per feed per CheckPeriod.
//
// # Cursors
//
// The feed keeps two sequences. The verified cursor V: every view of the
// space stored at or below V has been handed to the handler (or
// superseded by a later one that was). It moves only at the end of a
// catch-up, to the stream's last sequence when it started; on a hub
// cluster, only to the last view the consumer delivered when that is
// below: an R1 consumer of the R3 stream may live on a replica that has
// not yet stored what the leader reported, so a light check (reason
// settle) follows a second later. The applied
// cursor C ≥ V: the highest sequence handed over. A republished view is
// applied when its sequence is above C. A catch-up reads from V+1, not
// C+1: after a leaf link drop, views republished after the reconnect can
// be applied before the agent learns of the reconnect, moving C past a
// view lost during the drop; reading from V+1 finds it. Views that arrive
// while a catch-up runs wait in the subscription's buffer and are applied
// afterwards only when above what the catch-up covered.
//
// Gap detection remembers the sequences applied above the verified cursor
// since the last catch-up (at most MaxUnverified, then a catch-up runs);
// they are not handed over again either:
// a per-subject table of the space would cost memory per view for every
// agent, this costs it per change between two catch-ups.
//
// # Relayed
//
// A feed of the shared space may share the hub's copies with its unit
// (Options.Relay): one agent of the unit gets each view in the hub's
// queue group of the unit and relays it on the unit's routes, where
// every agent follows it; what a peer relays is applied only when the
// cloud signed it. Such a feed keeps order per subject rather than over
// the space, since views relayed by different agents overtake each other
// (relay.go).
//
// # Handler contract
//
// For each subject, the sequences handed to Apply never decrease; the
// same (subject, sequence) may be handed over again (a catch-up reading
// from V+1 redelivers a subject's last view that was already applied from
// its republished copy), so Apply must be idempotent for it. Sequences
// of different subjects may arrive out of order (a catch-up delivers a
// view lost during a drop after later views of other subjects). VIEWS
// keeps the last view of each subject, which is what makes this hold
// without a per-subject table: a catch-up from V+1 delivers only a
// subject's latest view, at or above any of it applied before. When the
// stream was rebuilt (its last sequence is below a cursor, or it was
// created anew since the last catch-up) Reset is called, both cursors go
// to 0 and the catch-up reads the whole space again: sequences then start
// over, and the handler must drop its own sequence guard in Reset.
// Apply's error is logged and counted (reason failed); the view is not
// tried again. A relayed feed adds one exception: a unit peer may relay a
// view the cloud signed under a sequence it forged (the hub's headers are
// not signed); the next catch-up finds it out, and the stream's next view
// of that subject then comes with a lower sequence. Its content is never
// the peer's: a handler that must not go back keeps its own order by
// content (the proxy refuses a relayed view older than the object's held
// one, Relay.Admit).
package viewfeed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
)

// Msg is one view handed to the handler.
type Msg struct {
	// Subject is the view's subject in VIEWS (atoll.view.…).
	Subject string
	// Seq is its stream sequence.
	Seq    uint64
	Header nats.Header
	Data   []byte
	// Time is when the stream stored it (zero when unknown).
	Time time.Time
}

// reader reads one catch-up's consumer.
type reader struct {
	f       *Feed
	pending uint64 // views still to deliver
	next    uint64 // the consumer sequence expected next
	top     uint64 // the last stream sequence delivered
	applied int
	timeout time.Duration // bounds each fetch
}

// fetch pulls the next batch (its request bounded by cctx) and hands its
// views to the handler (with the feed's ctx). The hub sends idle
// heartbeats for the pull: a request or its deliveries lost on the way (a
// unit's routes changing under the leaf that carries them) fail the fetch
// after two missed heartbeats instead of at its deadline.
func (r *reader) fetch(ctx, cctx context.Context, cons jetstream.Consumer) error {
	fctx, cancel := context.WithTimeout(cctx, r.timeout)
	defer cancel()
	batch, err := cons.Fetch(int(min(r.pending, uint64(r.f.cfg.Batch))), jetstream.FetchContext(fctx),
		jetstream.FetchHeartbeat(fetchHeartbeat))
	if err != nil {
		return err
	}
	got := 0
	for m := range batch.Messages() {
		got++
		md, err := m.Metadata()
		if err != nil {
			return err
		}
		if md.Sequence.Consumer != r.next {
			return fmt.Errorf("%w (delivery %d, expected %d)", errLostDelivery, md.Sequence.Consumer, r.next)
		}
		r.next++
		r.pending, r.top = md.NumPending, md.Sequence.Stream
		if r.f.heard(md.Sequence.Stream, m.Subject()) {
			r.f.m.skipped.WithLabelValues(r.f.o.Name, skipSeen).Inc()
			continue
		}
		r.applied++
		r.f.apply(ctx, Msg{Subject: m.Subject(), Seq: md.Sequence.Stream, Header: m.Headers(), Data: m.Data(), Time: md.Timestamp}, viaCatchUp)
		// Seen: a catch-up that fails after this (the link dropping under
		// it) and is tried again does not hand it over again.
		r.f.seen[md.Sequence.Stream] = m.Subject()
	}
	if got == 0 {
		return fmt.Errorf("nothing delivered with %d pending: %w", r.pending, batch.Error())
	}
	return nil
}

// CatchUp describes a catch-up that ended.
type CatchUp struct {
	// Verified is the verified cursor: every view of the space stored
	// at or below it has been handed over. A handler that keeps a cursor
	// across restarts keeps this one (Options.Start).
	Verified uint64
	// Created is when the stream read was created (Options.Created).
	Created time.Time
	// Reloaded is set when the catch-up read the whole space again after
	// Reset.
	Reloaded bool
}

// Options say what a feed follows and who applies it.
type Options struct {
	// Name labels the feed's logs and metrics ("assignment", "hosts").
	Name string
	// Filter is the space followed: a view subject or a filter in
	// atoll.view.> the agent may read.
	Filter string
	// Relay, when set, shares the hub's copies of the views with the
	// node's unit (the shared space only; see Relay).
	Relay *Relay
	// Start is the verified cursor kept by an earlier run (0: none, the
	// whole space is read), and Created the creation time of the stream
	// it belongs to (zero: unknown): a stream created at another time is
	// read again in full.
	Start   uint64
	Created time.Time
	// Apply hands one view to the handler (see the package's contract),
	// with the context Run was given.
	Apply func(ctx context.Context, m Msg) error
	// Reset, when set, is called before the space is read again from the
	// start of a rebuilt stream.
	Reset func(ctx context.Context)
	// CaughtUp, when set, is called after every catch-up.
	CaughtUp func(ctx context.Context, c CatchUp)
}

// Link is the agent's connection to its node's server and the hub's
// JetStream through it (*hublink.Link).
type Link interface {
	Conn() *nats.Conn
	JetStream() jetstream.JetStream
}

// Node is the node's server, which tells the leaf link's reconnects
// (*natsnode.Node).
type Node interface {
	HubLink() natsnode.HubLink
}

// Feed follows one view space. Create it with New, run it with Run.
type Feed struct {
	cfg  Config
	link Link
	node Node
	o    Options
	sub  string // the republished filter
	log  *slog.Logger
	m    *Metrics
	up   chan struct{} // closed after the first catch-up

	// Owned by Run's goroutine.
	applied, verified uint64
	created           time.Time
	seen              map[uint64]string // sequences applied above verified → their subjects
	settle            bool              // the last catch-up asks for a light check in settleDelay
	// Of the last full catch-up: the stream read (its last view of the
	// space is what a light check asks for), the hub's time when it
	// started, and the periodic checks since.
	stream    jetstream.Stream
	caughtAt  time.Time
	caughtSeq uint64 // the stream's last sequence at caughtAt
	periodics int
	refusals  uint64    // relayed views refused
	forged    int       // parked views the last catch-up did not cover (unpark)
	lastReset time.Time // the last catch-up a peer's relay reset called for
	// parked are relayed views whose predecessor on their subject has
	// not arrived yet, by that predecessor's sequence (park).
	parked map[uint64]parkedView
}

// New returns a feed of o.Filter. m may be nil (metrics not exported).
func New(cfg Config, link Link, node Node, o Options, log *slog.Logger, m *Metrics) (*Feed, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := events.ValidToken(o.Name); err != nil {
		return nil, fmt.Errorf("viewfeed: name: %w", err)
	}
	if o.Apply == nil {
		return nil, fmt.Errorf("viewfeed %s: no Apply", o.Name)
	}
	if link == nil || node == nil {
		return nil, fmt.Errorf("viewfeed %s: no link or node", o.Name)
	}
	if o.Relay != nil {
		if o.Filter != events.SharedSpaceSubjects() {
			return nil, fmt.Errorf("viewfeed %s: only the shared space (%s) is relayed, not %s", o.Name, events.SharedSpaceSubjects(), o.Filter)
		}
		if err := o.Relay.validate(); err != nil {
			return nil, fmt.Errorf("viewfeed %s: %w", o.Name, err)
		}
	}
	sub, err := events.Republished(o.Filter)
	if err != nil {
		return nil, fmt.Errorf("viewfeed %s: filter: %w", o.Name, err)
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	m.init(o.Name)
	return &Feed{
		cfg: cfg, link: link, node: node, o: o, sub: sub, m: m,
		log:     log.With("feed", o.Name, "filter", o.Filter),
		up:      make(chan struct{}),
		applied: o.Start, verified: o.Start, created: o.Created,
		seen: map[uint64]string{}, parked: map[uint64]parkedView{},
	}, nil
}

// Ready is nil once the feed has caught up with the stream at least once.
func (f *Feed) Ready() error {
	select {
	case <-f.up:
		return nil
	default:
		return fmt.Errorf("view feed %s has not caught up with the stream yet", f.o.Name)
	}
}

// CaughtUp is closed after the feed's first catch-up.
func (f *Feed) CaughtUp() <-chan struct{} { return f.up }

// requestTimeout bounds one request of a catch-up to the hub after
// failures catch-ups in a row failed: 2 s, doubling with each failure up
// to 10 s. A reply lost on the way costs the first bound, not the last (a
// catch-up blocks the feed's views pushed meanwhile); a hub slow to answer
// gets longer with every try.
func requestTimeout(failures uint64) time.Duration {
	d := 2 * time.Second
	for range min(failures, 3) {
		d *= 2
	}
	return min(d, 10*time.Second)
}

// fetchHeartbeat is the idle heartbeat a catch-up's fetch asks the hub
// for: a lost pull fails after two missed ones. It stays below half of
// the shortest fetch's expiry (requestTimeout(0), less the client's
// margin), as the client requires.
const fetchHeartbeat = 500 * time.Millisecond

// diagnose reports whether a catch-up that follows failures failed ones
// in a row, and whose light check the hub did not answer, goes on to the
// full catch-up, whose stream info says what is wrong (a stream that is
// gone gives a direct get no answer across the leaf link, only a
// timeout): the second, then every diagnoseEvery-th. The others fail and
// are retried later, as light checks again: a hub too busy to answer one
// request is not asked for a stream info, which nats-server queues apart
// and drops whole at 10,000 (a fleet's feeds escalating together after a
// hub restart kept that queue overflowing).
func diagnose(failures uint64) bool {
	n := failures + 1
	return n >= lightTries && (n-lightTries)%diagnoseEvery == 0
}

const (
	lightTries    = 2
	diagnoseEvery = 8
)

// Run follows the space until ctx is done. It returns an error only when
// it cannot subscribe.
func (f *Feed) Run(ctx context.Context) error {
	nc := f.link.Conn()
	if nc == nil {
		return fmt.Errorf("viewfeed %s: no connection", f.o.Name)
	}
	ch := make(chan *nats.Msg, f.cfg.Buffer)
	subs, err := f.subscribe(nc, ch)
	if err != nil {
		return err
	}
	defer subs.close()
	// The interest is on its way to the hub before the catch-up's
	// consumer is asked for on the same leaf link.
	if err := nc.Flush(); err != nil {
		f.log.Debug("flush after subscribing", "err", err)
	}
	f.log.Info("following views", "subject", f.sub, "from_seq", f.verified, "relayed", f.o.Relay != nil)

	check := time.NewTicker(f.cfg.CheckPeriod)
	defer check.Stop()
	poll := time.NewTicker(f.cfg.LeafPoll)
	defer poll.Stop()
	leaf := f.node.HubLink().ID
	var retry, settle, resetAgain <-chan time.Time
	if f.o.Relay != nil && leaf != 0 {
		// A restarted agent's old leaf connection may still take views
		// at the hub for a moment.
		f.announceReset(nc)
	}
	polls := 0
	failures := uint64(0)
	warned := false
	// due is the reason of the catch-up to run ("" for none), since when.
	due, dueSince := ReasonStart, time.Now()
	want := func(reason string) {
		if due == "" {
			due, dueSince = reason, time.Now()
		}
	}
	behind := f.m.behind.WithLabelValues(f.o.Name)
	for {
		if due != "" && retry == nil {
			if err := f.catchUp(ctx, due, failures); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				failures++
				wait := jittered(eventbus.DefaultBackoff(failures))
				f.m.catchupErrors.WithLabelValues(f.o.Name).Inc()
				// Expected while the hub is unreachable; a few in a
				// row with the link up (a permission, a missing
				// stream) are worth one WARN until one works again.
				level := slog.LevelDebug
				if failures >= warnAfter && !warned && leaf != 0 {
					level, warned = slog.LevelWarn, true
				}
				f.log.Log(ctx, level, "catch-up failed; retrying; a view missed meanwhile is not applied until one works", "reason", due, "attempt", failures, "retry_in", wait, "err", err)
				retry = time.After(wait)
			} else {
				if warned {
					f.log.Info("catching up with the stream works again", "failed", failures)
				}
				failures, warned, due = 0, false, ""
				behind.Set(0)
				if f.forged > 0 {
					f.m.skipped.WithLabelValues(f.o.Name, skipRefused).Add(float64(f.forged))
					f.log.Warn("views relayed by a unit peer carried sequences the stream never gave them; following the republished views directly for a while", "views", f.forged)
					f.forged = 0
					subs.refused(f)
				}
				if f.settle {
					f.settle, settle = false, time.After(settleDelay)
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case msg := <-ch:
			if r := f.receive(ctx, nc, subs, msg); r != "" {
				want(r)
			}
		case <-retry:
			retry = nil
		case <-check.C:
			want(ReasonPeriodic)
		case <-settle:
			settle = nil
			want(ReasonSettle)
		case <-resetAgain:
			resetAgain = nil
			f.announceReset(nc)
		case <-poll.C:
			if now := f.node.HubLink().ID; now != leaf {
				leaf = now
				if now != 0 {
					// Whatever was republished while the link was down
					// went into the void: read it from the stream.
					// A new link: the failures over the old one say
					// nothing about it.
					f.log.Info("leaf link to the hub is back; catching up")
					due, dueSince, retry, failures = ReasonReconnect, time.Now(), nil, 0
					if f.o.Relay != nil {
						f.announceReset(nc)
						resetAgain = time.After(relayResetAgain)
					}
				}
			}
			if n := subs.dropped(); n > 0 {
				f.log.Warn("the subscription dropped views (slow consumer); catching up", "dropped", n)
				want(ReasonSlowConsumer)
			}
			if r := f.overdue(); r != "" {
				want(r)
			}
			if polls++; f.o.Relay != nil && polls%meshPolls == 0 {
				if r := subs.followMesh(f); r != "" {
					want(r)
				}
			}
			// Behind counts while the link is up: a hub out of reach is
			// another alert's business.
			if due != "" && leaf != 0 {
				behind.Set(time.Since(dueSince).Seconds())
			} else {
				behind.Set(0)
			}
		}
	}
}

// jittered is d less up to half of it, at random: feeds that failed
// together (every agent of a restarted hub's fleet) do not retry
// together.
func jittered(d time.Duration) time.Duration {
	return d - rand.N(d/2+1)
}

// settleDelay is how long after a catch-up whose consumer may have read
// a lagging replica the light check runs: replicas apply what their
// leader stored within milliseconds.
const settleDelay = time.Second

// warnAfter is how many catch-ups in a row may fail with the leaf link up
// before one WARN.
const warnAfter = 3

// core handles one republished view and returns the reason for a
// catch-up it calls for ("" for none).
func (f *Feed) core(ctx context.Context, msg *nats.Msg, via string) string {
	subj := msg.Header.Get(jetstream.SubjectHeader)
	seq, err := parseSeq(msg.Header)
	if err != nil || seq == 0 || !events.SubjectMatches(f.o.Filter, subj) {
		f.m.skipped.WithLabelValues(f.o.Name, skipInvalid).Inc()
		f.log.Debug("ignoring a republished view without a sequence or outside the filter", "subject", msg.Subject, "view", subj)
		return ""
	}
	if f.heard(seq, subj) {
		f.m.skipped.WithLabelValues(f.o.Name, skipSeen).Inc()
		return ""
	}
	var at time.Time
	if ts := msg.Header.Get(jetstream.TimeStampHeaer); ts != "" {
		at, _ = time.Parse(time.RFC3339Nano, ts)
	}
	if seq <= f.applied {
		switch {
		case seq > f.verified && f.o.Relay != nil:
			// The unit's agents relay the views the hub gave each of
			// them, over routes of their own: views of different
			// subjects arrive out of order all the time, and are
			// applied (after the gap check below, which holds a view
			// back until its subject's previous one is there). One
			// older than a view applied of its own subject does not
			// come that way: a sequence a peer forged may stand
			// behind that one, so the stream decides.
			if f.newer(seq, subj) {
				f.log.Info("a view arrived after a later one of its subject; catching up", "subject", subj, "seq", seq, "applied", f.applied)
				return ReasonOutOfOrder
			}
		case seq > f.verified:
			// Older than one applied, and never seen: it overtook
			// nothing we can tell apart without the stream.
			f.log.Info("a view arrived after a later one; catching up", "subject", subj, "seq", seq, "applied", f.applied)
			return ReasonOutOfOrder
		default:
			if f.storedSince(at, seq) {
				f.log.Warn("a view stored after the last catch-up has a sequence below it: the views stream may have been rebuilt; catching up", "subject", subj, "seq", seq, "verified", f.verified)
				return ReasonRebuilt
			}
			f.m.skipped.WithLabelValues(f.o.Name, skipSeen).Inc()
			return ""
		}
	}
	reason := ""
	prev, _ := strconv.ParseUint(msg.Header.Get(jetstream.LastSequenceHeader), 10, 64)
	if prev != 0 && prev > f.verified && !f.heard(prev, subj) && f.o.Relay != nil && f.park(prev, seq, msg, via) {
		// Its predecessor is likely on its way through another agent
		// of the unit (park).
		return ""
	}
	if prev != 0 && prev > f.verified && !f.heard(prev, subj) {
		f.m.gaps.WithLabelValues(f.o.Name).Inc()
		f.log.Info("a view was lost on the way; catching up", "subject", subj, "seq", seq, "previous_seq", prev, "verified", f.verified)
		reason = ReasonGap
	}
	f.apply(ctx, Msg{Subject: subj, Seq: seq, Header: msg.Header, Data: msg.Data, Time: at}, via)
	f.applied = max(f.applied, seq)
	f.seen[seq] = subj
	if reason == "" && len(f.seen) >= f.cfg.MaxUnverified {
		reason = ReasonUnverified
	}
	if next, ok := f.parked[seq]; ok {
		// The view that waited for this one.
		delete(f.parked, seq)
		if r := f.core(ctx, next.msg, next.via); reason == "" {
			reason = r
		}
	}
	return reason
}

func (f *Feed) apply(ctx context.Context, m Msg, via string) {
	if err := f.o.Apply(ctx, m); err != nil {
		f.m.skipped.WithLabelValues(f.o.Name, skipFailed).Inc()
		f.log.Warn("the handler refused a view", "subject", m.Subject, "seq", m.Seq, "err", err)
		return
	}
	f.m.applied.WithLabelValues(f.o.Name, via).Inc()
}

// errLostDelivery: a catch-up's consumer skipped a delivery.
var errLostDelivery = errors.New("a delivery of the catch-up was lost")

// errLeafChanged ends a catch-up whose leaf link was replaced.
var errLeafChanged = errors.New("the leaf link to the hub changed")

// catchUp reads the space from the verified cursor on with a short-lived
// consumer until nothing is pending, then moves the verified cursor to
// the stream's last sequence when it started.
func (f *Feed) catchUp(ctx context.Context, reason string, failures uint64) error {
	js := f.link.JetStream()
	if js == nil {
		return errors.New("no hub link")
	}
	// A request sent into a leaf link that then drops waits for its
	// timeout; the reconnect's catch-up should not: a new leaf
	// connection ends this one.
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func(leaf uint64) {
		t := time.NewTicker(f.cfg.LeafPoll)
		defer t.Stop()
		for {
			select {
			case <-cctx.Done():
				return
			case <-t.C:
				if f.node.HubLink().ID != leaf {
					cancel(errLeafChanged)
					return
				}
			}
		}
	}(f.node.HubLink().ID)
	if reason == ReasonPeriodic {
		f.periodics++
	}
	if f.lightCheck(reason) {
		quiet, err := f.quiet(cctx, reason, requestTimeout(failures))
		if err != nil {
			if !diagnose(failures) {
				return fmt.Errorf("read the space's last view: %w", errors.Join(err, context.Cause(cctx)))
			}
			f.log.Debug("cannot read the space's last view; reading the stream info", "reason", reason, "err", err)
		}
		if quiet {
			f.m.catchups.WithLabelValues(f.o.Name, reason).Inc()
			return nil
		}
	}
	timeout := requestTimeout(failures)
	rctx, rcancel := context.WithTimeout(cctx, timeout)
	str, err := js.Stream(rctx, events.StreamViews)
	rcancel()
	if err != nil {
		return fmt.Errorf("stream %s: %w", events.StreamViews, errors.Join(err, context.Cause(cctx)))
	}
	info := str.CachedInfo()
	reload := false
	top := max(f.applied, f.verified)
	if f.o.Relay != nil {
		// What was applied may carry a sequence a unit peer forged
		// (dropForged, below); the verified cursor is the stream's own.
		top = f.verified
	}
	if top > info.State.LastSeq || (!f.created.IsZero() && !f.created.Equal(info.Created)) {
		f.log.Warn("the views stream was rebuilt; reading the space again", "applied", f.applied, "verified", f.verified,
			"stream_last_seq", info.State.LastSeq, "created", info.Created, "held_created", f.created)
		if f.o.Reset != nil {
			f.o.Reset(ctx)
		}
		f.applied, f.verified, reload = 0, 0, true
		clear(f.seen)
	}
	if f.o.Relay != nil {
		f.forged += f.dropForged(info.State.LastSeq)
	}
	if !reload && f.verified > 0 && info.Config.AllowDirect && mayBeQuiet(reason) {
		// The cheap path: when the space's last view is at or below the
		// verified cursor, nothing was stored there since, and no
		// consumer is needed. The cursor stays where it is: a replica
		// may answer a direct get slightly behind.
		rctx, rcancel = context.WithTimeout(cctx, timeout)
		last, err := str.GetLastMsgForSubject(rctx, f.o.Filter)
		rcancel()
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound) || (err == nil && last.Sequence <= f.verified):
			f.stream, f.caughtAt, f.caughtSeq, f.created, f.periodics = str, info.TimeStamp, info.State.LastSeq, info.Created, 0
			f.log.Debug("nothing stored in the space since the last catch-up", "reason", reason, "verified", f.verified)
			if reason == ReasonPeriodic {
				f.m.catchups.WithLabelValues(f.o.Name, reason).Inc()
				return nil
			}
			f.forged += f.unpark()
			f.caughtUp(ctx, reason, 0, false)
			return nil
		case err != nil:
			// A hub that does not answer a direct get gets no consumer:
			// creating one costs it a check against every leaf link's
			// permissions (its subscriptions), and deleting it as much
			// again; a fleet's worth of them in a reconnect storm was
			// most of a hub's core. Retried later.
			return fmt.Errorf("read the space's last view: %w", errors.Join(err, context.Cause(cctx)))
		}
	}
	cfg := jetstream.ConsumerConfig{
		FilterSubject:     f.o.Filter,
		AckPolicy:         jetstream.AckNonePolicy,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: f.cfg.CatchUpLinger,
		MemoryStorage:     true,
		Replicas:          1,
	}
	if f.verified > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, f.verified+1
	}
	rctx, rcancel = context.WithTimeout(cctx, timeout)
	cons, err := js.CreateConsumer(rctx, events.StreamViews, cfg)
	rcancel()
	if err != nil {
		return fmt.Errorf("catch-up consumer on %s: %w", f.o.Filter, errors.Join(err, context.Cause(cctx)))
	}
	f.m.consumers.WithLabelValues(f.o.Name, reason).Inc()
	r := reader{f: f, pending: cons.CachedInfo().NumPending, next: 1, timeout: timeout}
	for r.pending > 0 {
		if err := r.fetch(ctx, cctx, cons); err != nil {
			return fmt.Errorf("catch-up on %s: %w", f.o.Filter, errors.Join(err, context.Cause(cctx)))
		}
	}
	n, top := r.applied, r.top
	// Every view of the space stored up to the stream's last sequence at
	// the start has been handed over (or superseded by one that was)...
	covered := max(info.State.LastSeq, top)
	if clustered(info) && top < info.State.LastSeq {
		// ...unless the consumer lives on a replica that had not yet
		// stored what the stream's leader reported (an R1 consumer of
		// an R3 stream is placed on any of its replicas): then only
		// what it delivered is certain, and a light check a moment
		// later looks for a view stored above it.
		covered, f.settle = top, true
	}
	f.verified = max(f.verified, covered)
	f.applied = max(f.applied, f.verified)
	for s := range f.seen {
		if s <= f.verified {
			delete(f.seen, s)
		}
	}
	f.created = info.Created
	f.stream, f.caughtAt, f.caughtSeq, f.periodics = str, info.TimeStamp, info.State.LastSeq, 0
	f.forged += f.unpark()
	f.caughtUp(ctx, reason, n, reload)
	return nil
}

// caughtUp ends a catch-up that handed n views over: the feed is ready,
// and the handler learns the verified cursor.
func (f *Feed) caughtUp(ctx context.Context, reason string, n int, reload bool) {
	f.m.catchups.WithLabelValues(f.o.Name, reason).Inc()
	level := slog.LevelDebug
	if reason != ReasonPeriodic {
		level = slog.LevelInfo
	}
	f.log.Log(ctx, level, "caught up with the stream", "reason", reason, "views", n, "verified", f.verified, "reloaded", reload)
	select {
	case <-f.up:
	default:
		close(f.up)
	}
	if f.o.CaughtUp != nil {
		f.o.CaughtUp(ctx, CatchUp{Verified: f.verified, Created: f.created, Reloaded: reload})
	}
}

// mayBeQuiet reports whether a catch-up for reason may find nothing
// stored in the space since the last one (reasons that saw a view
// missing know better).
func mayBeQuiet(reason string) bool {
	switch reason {
	case ReasonStart, ReasonPeriodic, ReasonReconnect, ReasonSettle, ReasonMesh, ReasonRefused, ReasonPeerReconnect:
		return true
	}
	return false
}

// clustered reports whether the stream is replicated across a hub
// cluster's servers.
func clustered(info *jetstream.StreamInfo) bool {
	return info.Cluster != nil && len(info.Cluster.Replicas) > 0
}

// newer reports whether a view of subject above seq was applied since
// the last catch-up (a relayed feed keeps order per subject).
func (f *Feed) newer(seq uint64, subject string) bool {
	for s, subj := range f.seen {
		if s > seq && subj == subject {
			return true
		}
	}
	return false
}

// parseSeq is the stream sequence the hub put on a republished view.
func parseSeq(h nats.Header) (uint64, error) {
	return strconv.ParseUint(h.Get(jetstream.SequenceHeader), 10, 64)
}

// heard reports whether the view of subject with sequence seq was applied
// above the verified cursor since the last catch-up. The subject is
// compared too: a sequence a unit peer relayed with the wrong subject
// (Relay) must not hide the view that truly has it.
func (f *Feed) heard(seq uint64, subject string) bool {
	s, ok := f.seen[seq]
	return ok && s == subject
}

// storedSince reports whether a view with sequence seq stored at at (the
// hub's time) was stored after the last full catch-up began with a
// sequence at or below the stream's last one then: a stream whose
// sequences started over. (Views stored while the catch-up ran may be
// below the verified cursor, not below that.) It only calls for a full
// catch-up, whose stream info decides (a hub cluster's servers' clocks may
// differ a little: the cost of a wrong guess is one catch-up).
func (f *Feed) storedSince(at time.Time, seq uint64) bool {
	return !at.IsZero() && !f.caughtAt.IsZero() && at.After(f.caughtAt) && seq <= f.caughtSeq
}

// lightCheck reports whether a catch-up for reason may first read only
// the space's last view (one request, no stream info, no consumer): a
// periodic check other than every VerifyEvery-th, and the catch-up after
// a reconnect, once a full catch-up has read the stream.
func (f *Feed) lightCheck(reason string) bool {
	if f.stream == nil {
		return false
	}
	if reason == ReasonSettle {
		return true
	}
	if f.verified == 0 {
		return false
	}
	switch reason {
	case ReasonPeriodic:
		return f.periodics < f.cfg.VerifyEvery
	case ReasonReconnect, ReasonMesh, ReasonRefused, ReasonPeerReconnect:
		return true
	}
	return false
}

// quiet reads the space's last view and reports whether a full catch-up
// can be left out:
//   - none at all, or at or below the verified cursor: nothing was stored
//     in the space since the last full catch-up, so nothing can have been
//     missed (unless it was stored after that catch-up with a lower
//     sequence: the stream was rebuilt);
//   - for a periodic check, a view already applied from its republished
//     copy: what was stored since was heard, as far as anything but a
//     full catch-up can tell (gaps on a subject show on its next view;
//     every VerifyEvery-th check is full).
//
// After a reconnect only the first holds: views republished after the
// reconnect may have been heard while others were lost during the drop.
func (f *Feed) quiet(ctx context.Context, reason string, timeout time.Duration) (bool, error) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	last, err := f.stream.GetLastMsgForSubject(rctx, f.o.Filter)
	cancel()
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return true, nil
	case err != nil:
		return false, err
	case last.Sequence <= f.verified:
		if f.storedSince(last.Time, last.Sequence) {
			f.log.Warn("the space's last view was stored after the last catch-up with a sequence below it: the views stream may have been rebuilt", "seq", last.Sequence, "verified", f.verified)
			return false, nil
		}
		f.log.Debug("nothing stored in the space since the last catch-up", "reason", reason, "verified", f.verified)
		return true, nil
	}
	if f.heard(last.Sequence, last.Subject) && (reason == ReasonPeriodic || reason == ReasonSettle) {
		f.log.Debug("the space's last view was heard", "seq", last.Sequence, "verified", f.verified)
		return true, nil
	}
	return false, nil
}
