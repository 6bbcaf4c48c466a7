package viewfeed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/events"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Relay makes a feed of the shared space (events.SharedSpaceSubjects)
// share the hub's copies with the node's unit: the hub sends each
// republished shared view to one agent of the unit (the queue group
// events.ViewRelayQueue), which applies it and publishes it again on the
// unit's routes (events.RelayedView); every agent of the unit follows
// those. A change to a shared view then crosses the hub's leaf links once
// per unit, not once per node.
//
// What a peer relays is taken only when signed by the cloud (the views'
// Atoll-Signature, checked against Key) and admitted by Admit. A feed
// whose node lacks a route to some member of its unit (Meshed false: a
// member down, a route cut) also follows the republished views itself,
// as a feed without Relay does, and catches up when it finds itself so
// (a view that member relayed meanwhile did not reach it).
type Relay struct {
	// Unit is the node's unit, and Node the node's name.
	Unit, Node string
	// Key returns the key the cloud signs the views with (the node's
	// natsnode.Node.CloudKey); "" when the node has none, linking without
	// identity: a relayed view is then taken unsigned, as everything on
	// the unit's routes is.
	Key func() string
	// Meshed reports whether the node has a route to every other member
	// of its unit (natsnode.Node.Meshed).
	Meshed func() bool
	// Admit, when set, checks a relayed view that carries the cloud's
	// signature before it is applied (freshness, no replay of an older
	// one); an error refuses it.
	Admit func(m Msg) error
}

func (r *Relay) validate() error {
	if err := events.ValidUnit(r.Unit); err != nil {
		return fmt.Errorf("relay: unit: %w", err)
	}
	if err := events.ValidName(r.Node); err != nil {
		return fmt.Errorf("relay: node: %w", err)
	}
	if r.Key == nil || r.Meshed == nil {
		return errors.New("relay: no Key or Meshed")
	}
	return nil
}

// meshPolls is how many LeafPolls pass between two looks at the unit's
// routes (a server's route list is built for every ask).
const meshPolls = 4

// relayOut publishes a view the hub sent this agent for its unit on the
// unit's routes, as it came (payload and headers: the hub's sequences and
// the cloud's signature).
func (f *Feed) relayOut(nc *nats.Conn, msg *nats.Msg) {
	view := msg.Header.Get(jetstream.SubjectHeader)
	subj, err := events.RelayedView(f.o.Relay.Unit, view)
	if err != nil {
		f.log.Debug("not relaying a view outside the shared space", "view", view, "err", err)
		return
	}
	if err := nc.PublishMsg(&nats.Msg{Subject: subj, Header: msg.Header, Data: msg.Data}); err != nil {
		f.log.Debug("relaying a view failed", "view", view, "err", err)
		return
	}
	f.m.relayed.WithLabelValues(f.o.Name).Inc()
}

// relayIn checks a view a unit peer relayed (or this agent did: its own
// copies come back too) and returns it as the hub republished it, or an
// error saying why it is refused.
func (f *Feed) relayIn(msg *nats.Msg) (*nats.Msg, error) {
	unit, view, err := events.ParseRelayedView(msg.Subject)
	if err != nil {
		return nil, err
	}
	if unit != f.o.Relay.Unit {
		return nil, fmt.Errorf("relayed for unit %q, not %q", unit, f.o.Relay.Unit)
	}
	if got := msg.Header.Get(jetstream.SubjectHeader); got != view {
		return nil, fmt.Errorf("relayed on %s with view subject %q", msg.Subject, got)
	}
	if key := f.o.Relay.Key(); key != "" {
		if err := events.VerifyCloud(view, msg.Header, msg.Data, key); err != nil {
			return nil, err
		}
		if f.o.Relay.Admit != nil {
			seq, _ := parseSeq(msg.Header)
			if err := f.o.Relay.Admit(Msg{Subject: view, Seq: seq, Header: msg.Header, Data: msg.Data}); err != nil {
				return nil, err
			}
		}
	}
	return msg, nil
}

// subscriptions are a feed's core subscriptions, all delivering into one
// channel: the republished views (direct; with Relay only while the node
// is not meshed with its whole unit) and, with Relay, the unit's queue
// group on them and the views relayed on the unit's routes.
type subscriptions struct {
	nc                      *nats.Conn
	ch                      chan *nats.Msg
	subject                 string // the republished views
	direct, queue, relayed  *nats.Subscription
	droppedDirect, droppedQ int
	droppedR                int
	// refusedAt is when a relayed view was last refused: the feed
	// follows the republished views itself for directAfterRefusal after.
	refusedAt time.Time
}

// directAfterRefusal is how long a feed follows the republished views
// itself after it refused a view a unit peer relayed (a peer replaying or
// forging views, or this node's clock too far from the cloud's).
const directAfterRefusal = 10 * time.Minute

// subscribe starts the feed's subscriptions.
func (f *Feed) subscribe(nc *nats.Conn, ch chan *nats.Msg) (*subscriptions, error) {
	s := &subscriptions{nc: nc, ch: ch, subject: f.sub}
	if f.o.Relay == nil || !f.o.Relay.Meshed() {
		if err := s.follow(); err != nil {
			return nil, fmt.Errorf("viewfeed %s: subscribe %s: %w", f.o.Name, f.sub, err)
		}
	}
	f.m.direct.WithLabelValues(f.o.Name).Set(boolGauge(s.direct != nil))
	if f.o.Relay == nil {
		return s, nil
	}
	if s.direct == nil {
		f.log.Info("routed to every member of the unit: following the views its agents relay")
	} else {
		f.log.Info("not routed to every member of the unit yet: following the republished views directly")
	}
	var err error
	if s.queue, err = nc.ChanQueueSubscribe(f.sub, events.ViewRelayQueue(f.o.Relay.Unit), ch); err != nil {
		s.close()
		return nil, fmt.Errorf("viewfeed %s: subscribe %s in the unit's queue group: %w", f.o.Name, f.sub, err)
	}
	filter, err := events.RelayedViewSubjects(f.o.Relay.Unit)
	if err == nil {
		s.relayed, err = nc.ChanSubscribe(filter, ch)
	}
	if err != nil {
		s.close()
		return nil, fmt.Errorf("viewfeed %s: subscribe to the unit's relayed views: %w", f.o.Name, err)
	}
	return s, nil
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// follow subscribes to the republished views themselves.
func (s *subscriptions) follow() error {
	sub, err := s.nc.ChanSubscribe(s.subject, s.ch)
	if err != nil {
		return err
	}
	s.direct, s.droppedDirect = sub, 0
	return nil
}

func (s *subscriptions) close() {
	for _, sub := range []*nats.Subscription{s.direct, s.queue, s.relayed} {
		if sub != nil {
			_ = sub.Unsubscribe()
		}
	}
}

// dropped is how many views the subscriptions dropped since the last ask.
func (s *subscriptions) dropped() int {
	n := 0
	for _, d := range []struct {
		sub  *nats.Subscription
		last *int
	}{{s.direct, &s.droppedDirect}, {s.queue, &s.droppedQ}, {s.relayed, &s.droppedR}} {
		if d.sub == nil {
			continue
		}
		if c, err := d.sub.Dropped(); err == nil && c > *d.last {
			n += c - *d.last
			*d.last = c
		}
	}
	return n
}

// followMesh follows the republished views directly while the node lacks
// a route to a member of its unit, and stops once it has them all. It
// returns ReasonMesh when it starts to: views relayed by that member
// meanwhile were lost.
func (s *subscriptions) followMesh(f *Feed) string {
	meshed := f.o.Relay.Meshed() && time.Since(s.refusedAt) >= directAfterRefusal
	switch {
	case meshed && s.direct != nil:
		if err := s.direct.Unsubscribe(); err != nil {
			f.log.Debug("unsubscribing from the republished views", "err", err)
		}
		s.direct = nil
		f.log.Info("routed to every member of the unit: following the views its agents relay")
	case !meshed && s.direct == nil:
		if err := s.follow(); err != nil {
			f.log.Warn("cannot follow the republished views; relying on catch-ups", "err", err)
			return ""
		}
		f.m.direct.WithLabelValues(f.o.Name).Set(1)
		f.log.Info("no route to some member of the unit: following the republished views directly and catching up")
		return ReasonMesh
	default:
		return ""
	}
	f.m.direct.WithLabelValues(f.o.Name).Set(0)
	return ""
}

// receive handles one view from any of the subscriptions and returns the
// reason for a catch-up it calls for ("" for none).
func (f *Feed) receive(ctx context.Context, nc *nats.Conn, s *subscriptions, msg *nats.Msg) string {
	switch {
	case msg.Sub != nil && msg.Sub == s.queue:
		f.relayOut(nc, msg)
	case msg.Sub != nil && msg.Sub == s.relayed && strings.HasSuffix(msg.Subject, resetSuffix):
		return f.peerReset(msg)
	case msg.Sub != nil && msg.Sub == s.relayed:
		// This agent's own copies come back too: known ones are left
		// before the signature is checked.
		if seq, err := parseSeq(msg.Header); err == nil && f.heard(seq, msg.Header.Get(jetstream.SubjectHeader)) {
			f.m.skipped.WithLabelValues(f.o.Name, skipSeen).Inc()
			return ""
		}
		if _, err := f.relayIn(msg); err != nil {
			f.m.skipped.WithLabelValues(f.o.Name, skipRefused).Inc()
			f.refusals++
			level := slog.LevelDebug
			if f.refusals == 1 || f.refusals%refusalLogEvery == 0 {
				level = slog.LevelWarn
			}
			f.log.Log(ctx, level, "refused a view relayed by a unit peer; following the republished views directly for a while", "subject", msg.Subject, "refused", f.refusals, "err", err)
			return s.refused(f)
		}
		return f.core(ctx, msg, viaRelay)
	}
	return f.core(ctx, msg, viaCore)
}

// refused follows the republished views directly for directAfterRefusal
// and returns ReasonRefused when it starts to: the refused view may be
// the only copy the node got.
func (s *subscriptions) refused(f *Feed) string {
	s.refusedAt = time.Now()
	if s.direct != nil {
		return ""
	}
	if err := s.follow(); err != nil {
		f.log.Warn("cannot follow the republished views; relying on catch-ups", "err", err)
		return ""
	}
	f.m.direct.WithLabelValues(f.o.Name).Set(1)
	return ReasonRefused
}

// parkedView is a relayed view waiting for its predecessor.
type parkedView struct {
	seq   uint64
	msg   *nats.Msg
	via   string
	since time.Time
}

// gapGrace is how long a relayed view waits for its subject's previous
// view before the feed takes it as lost and catches up. The unit's agents
// relay the views the hub gives each of them over routes of their own, so
// a view may overtake its predecessor by the time one hop takes.
const gapGrace = time.Second

// park holds the view with sequence seq until its predecessor prev
// arrives (core applies it then) and reports whether it did: not when as
// many views wait as gap detection remembers, or another view already
// waits for prev (a duplicate).
func (f *Feed) park(prev, seq uint64, msg *nats.Msg, via string) bool {
	if p, ok := f.parked[prev]; ok {
		return p.seq == seq
	}
	if len(f.parked) >= f.cfg.MaxUnverified {
		return false
	}
	f.parked[prev] = parkedView{seq: seq, msg: msg, via: via, since: time.Now()}
	return true
}

// overdue returns ReasonGap when a parked view waited gapGrace for its
// predecessor: that one was lost. The catch-up it calls for applies what
// the stream holds, and drops what waits (unpark).
func (f *Feed) overdue() string {
	for prev, p := range f.parked {
		if time.Since(p.since) >= gapGrace {
			f.m.gaps.WithLabelValues(f.o.Name).Inc()
			f.log.Info("a view was lost on the way; catching up", "view_seq", p.seq, "previous_seq", prev, "verified", f.verified)
			return ReasonGap
		}
	}
	return ""
}

// unpark forgets every parked view after a catch-up and returns how many
// carry a sequence the stream had not reached when the catch-up began.
// The feed handles its views one at a time, so each parked view was
// received, hence stored, before the catch-up began: one of the hub's is
// at or below the stream's last sequence then (and the catch-up covered
// it, or, on a hub cluster whose consumer read a replica behind, the
// settle check that follows does). One above carries sequences the stream
// never gave it: a unit peer replayed a signed view under forged ones.
func (f *Feed) unpark() int {
	forged := 0
	for _, p := range f.parked {
		if p.seq > f.verified && p.seq > f.caughtSeq {
			forged++
		}
	}
	clear(f.parked)
	return forged
}

// dropForged forgets the views applied with a sequence above last, the
// stream's last when a catch-up began, and returns how many. The feed
// handles its views one at a time, so every view it applied was stored
// before that: one above carried a sequence a unit peer forged (on a view
// the cloud signed, so its content passed), which must neither stand for
// a view the stream will give that sequence (heard) nor hide the
// subject's next views (newer).
func (f *Feed) dropForged(last uint64) int {
	n := 0
	f.applied = f.verified
	for s := range f.seen {
		if s > last {
			delete(f.seen, s)
			n++
			continue
		}
		f.applied = max(f.applied, s)
	}
	return n
}

// resetSuffix ends a relay reset's subject (events.RelayResetFamily); no
// relayed view's subject has it in its place.
const resetSuffix = ".reset"

// Relay resets (events.RelayResetFamily). The hub may give the views an
// agent is to relay to its leaf connection until it finds that
// connection dead (up to 12 s of pings), and they go nowhere: the unit's
// other agents learn of a lost view only from the next view of its
// subject. So an agent whose leaf link comes up (a reconnect, a start)
// tells its unit, at once and again relayResetAgain later (once the hub
// has surely dropped the old connection), and the others catch up
// (peer_reconnect, a light check first). A peer sending resets costs at
// most one catch-up per resetMinInterval.
const (
	relayResetAgain  = 15 * time.Second
	resetMinInterval = 10 * time.Second
)

// announceReset tells the unit that views this agent was to relay may be
// lost.
func (f *Feed) announceReset(nc *nats.Conn) {
	subj, err := events.RelayResetSubject(f.o.Relay.Unit, f.o.Relay.Node)
	if err == nil {
		err = events.Publish(nc, subj, &atollv1.ViewRelayReset{Node: f.o.Relay.Node, Time: timestamppb.Now()}, "")
	}
	if err != nil {
		f.log.Debug("telling the unit of a new leaf link failed", "err", err)
	}
}

// peerReset handles a unit peer's relay reset and returns the catch-up it
// calls for ("" for none).
func (f *Feed) peerReset(msg *nats.Msg) string {
	t, err := events.RelayResetFamily.Parse(msg.Subject)
	if err != nil || t[0] != f.o.Relay.Unit || t[1] == f.o.Relay.Node {
		return ""
	}
	if time.Since(f.lastReset) < resetMinInterval {
		return ""
	}
	f.lastReset = time.Now()
	f.log.Info("a unit peer's leaf link changed: views it was to relay may be lost; catching up", "peer", t[1])
	return ReasonPeerReconnect
}

// refusalLogEvery: after the first refused relayed view, one in this many
// is logged at WARN (a peer sending garbage must not flood the log).
const refusalLogEvery = 1000
