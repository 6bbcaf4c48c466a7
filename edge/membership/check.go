package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/events"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// leafPoll is how often watch looks for a reconnect of the leaf link.
const leafPoll = 250 * time.Millisecond

// watch checks the views every CheckPeriod and after every reconnect of
// the node's leaf link, until ctx is done.
func (m *Membership) watch(ctx context.Context) {
	t := time.NewTicker(m.cfg.CheckPeriod)
	defer t.Stop()
	leaf := time.NewTicker(leafPoll)
	defer leaf.Stop()
	connected := m.node.Status().HubConnected
	var recheck <-chan time.Time // a value read lower than the one held: look again soon
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-recheck:
			recheck = nil
		case <-leaf.C:
			now := m.node.Status().HubConnected
			back := now && !connected
			connected = now
			if !back {
				continue
			}
			// Whatever was published while the link was down may have
			// been sent into the void: look now.
			m.log.Info("leaf link to the hub is back; checking the views held")
		}
		m.check(ctx)
		m.mu.Lock()
		suspect := len(m.suspect) > 0
		m.mu.Unlock()
		if suspect && recheck == nil {
			recheck = time.After(suspectRecheck)
		}
	}
}

// suspectRecheck is how soon a check that read a lower sequence than the
// one held (a read racing a delivery, or a recreated stream) is repeated,
// rather than a whole CheckPeriod later.
const suspectRecheck = 2 * time.Second

// stored is the last message the stream holds on a subject.
type stored struct {
	msg proto.Message
	fp  string
	seq uint64
	at  time.Time
}

// check compares the assignment and the unit view held with the last
// values the stream stores on their subjects, and catches up on each one
// that is behind: it applies the stored value and restarts the follower.
// An error (the hub unreachable) leaves everything as it is: an agent
// keeps what it has while it cannot tell.
func (m *Membership) check(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, max(m.cfg.CheckPeriod, 2*time.Second))
	defer cancel()
	subj, err := events.AssignmentSubject(m.node.Name())
	if err != nil {
		return
	}
	st, found, err := m.last(cctx, subj, &atollv1.NodeAssignment{})
	if err != nil {
		m.checkFailed(viewAssignment, err)
		return
	}
	m.mu.Lock()
	held, heldSeq, cons := m.assignment, m.assignSeq, m.assignCons
	m.mu.Unlock()
	if found && m.behindOn(viewAssignment, held.GetFingerprint(), heldSeq, held != nil, st) {
		m.setAssignment(ctx, st.msg.(*atollv1.NodeAssignment), st.seq, true)
		if cons != nil {
			cons.Restart()
		}
	}

	m.mu.Lock()
	unit := m.assignment.GetUnit()
	view, viewSeq, ucons := m.unitView, m.viewSeq, m.unitCons
	m.mu.Unlock()
	if unit == "" {
		m.clear(viewUnit)
		m.checkOK()
		return
	}
	if view.GetUnit() != unit {
		view, viewSeq = nil, 0
	}
	subj, err = events.UnitViewSubject(unit)
	if err != nil {
		return
	}
	st, found, err = m.last(cctx, subj, &atollv1.UnitView{})
	if err != nil {
		m.checkFailed(viewUnit, err)
		return
	}
	m.checkOK()
	if found && m.behindOn(viewUnit, view.GetFingerprint(), viewSeq, view != nil, st) {
		m.setUnitView(st.msg.(*atollv1.UnitView), st.seq, true)
		if ucons != nil {
			ucons.Restart()
		}
	}
}

// checkWarnAfter is how many checks in a row may fail while the leaf link
// is up before one WARN says the agent cannot tell whether it is behind.
const checkWarnAfter = 3

// checkFailed counts a check that could not read the stream. While the
// hub is unreachable that is expected (DEBUG); failing with the link up
// (a permission, a missing stream) it is worth one WARN until a check
// succeeds again.
func (m *Membership) checkFailed(kind string, err error) {
	m.metrics.checkErrors.Inc()
	m.mu.Lock()
	m.failedChecks++
	n := m.failedChecks
	warn := n >= checkWarnAfter && !m.checkWarned && m.node.Status().HubConnected
	if warn {
		m.checkWarned = true
	}
	m.mu.Unlock()
	if warn {
		m.log.Warn("cannot compare the views held with the stream; a view this agent missed is not caught up until this works", "view", kind, "failed_checks", n, "err", err)
		return
	}
	m.log.Debug("cannot check a view against the stream", "view", kind, "err", err)
}

func (m *Membership) checkOK() {
	m.metrics.checks.Inc()
	m.mu.Lock()
	warned := m.checkWarned
	m.failedChecks, m.checkWarned = 0, false
	m.mu.Unlock()
	if warned {
		m.log.Info("comparing the views held with the stream works again")
	}
}

// last reads the last message stored on subj, decoded as like; found is
// false when the subject holds none.
func (m *Membership) last(ctx context.Context, subj string, like proto.Message) (stored, bool, error) {
	m.mu.Lock()
	views := m.views
	m.mu.Unlock()
	if views == nil {
		js := m.link.JetStream()
		if js == nil {
			return stored{}, false, errors.New("no hub link")
		}
		st, err := js.Stream(ctx, events.StreamViews)
		if err != nil {
			return stored{}, false, fmt.Errorf("stream %s: %w", events.StreamViews, err)
		}
		views = st
		m.mu.Lock()
		m.views = st
		m.mu.Unlock()
	}
	raw, err := views.GetLastMsgForSubject(ctx, subj)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return stored{}, false, nil
	case err != nil:
		return stored{}, false, fmt.Errorf("last value of %s: %w", subj, err)
	}
	if err := events.DecodeMsg(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}, like); err != nil {
		return stored{}, false, fmt.Errorf("last value of %s: %w", subj, err)
	}
	fp := ""
	if f, ok := like.(interface{ GetFingerprint() string }); ok {
		fp = f.GetFingerprint()
	}
	return stored{msg: like, fp: fp, seq: raw.Sequence, at: raw.Time}, true, nil
}

// behindOn judges one view: current when the value held is the stored
// one (by fingerprint, or by sequence for values without one). A stored
// value with a lower sequence than the one held is taken only when the
// next check still sees a lower one: once, it may be a read racing a
// delivery; twice, the stream was recreated and its sequences started
// over. It logs, counts and
// records (for readiness and the behind gauge) a view found behind.
func (m *Membership) behindOn(kind, heldFP string, heldSeq uint64, holds bool, st stored) bool {
	current := holds && ((heldFP != "" && heldFP == st.fp) || (heldFP == "" && st.fp == "" && heldSeq == st.seq))
	if current {
		m.clear(kind)
		return false
	}
	m.mu.Lock()
	if _, once := m.suspect[kind]; holds && st.seq < heldSeq && !once {
		m.suspect[kind] = st.seq
		m.mu.Unlock()
		return false
	}
	delete(m.suspect, kind)
	lag := m.now().Sub(st.at)
	if lag < 0 {
		lag = 0
	}
	why := fmt.Sprintf("the stream has held fingerprint %q (seq %d) for %s; the agent holds %q", st.fp, st.seq, lag.Round(time.Millisecond), heldFP)
	if !holds {
		why = fmt.Sprintf("the stream has held fingerprint %q (seq %d) for %s; the agent holds none", st.fp, st.seq, lag.Round(time.Millisecond))
	}
	m.behind[kind] = why
	m.mu.Unlock()
	label := labelOf(kind)
	m.metrics.behind.WithLabelValues(label).Set(lag.Seconds())
	m.metrics.catchups.WithLabelValues(label).Inc()
	m.metrics.lag.WithLabelValues(label).Observe(lag.Seconds())
	// A value stored less than a check period ago may simply not have
	// reached the follower yet (a follower still being created): worth
	// an INFO. Older, the follower missed it.
	level := slog.LevelWarn
	if lag <= m.cfg.CheckPeriod {
		level = slog.LevelInfo
	}
	m.log.Log(context.Background(), level, "view behind the stream; catching up from the stored value and restarting its follower",
		"view", kind, "stored_fingerprint", st.fp, "stored_seq", st.seq, "held_fingerprint", heldFP, "held_seq", heldSeq, "behind", lag)
	return true
}

// clear records kind as current.
func (m *Membership) clear(kind string) {
	m.mu.Lock()
	delete(m.behind, kind)
	delete(m.suspect, kind)
	m.mu.Unlock()
	m.metrics.behind.WithLabelValues(labelOf(kind)).Set(0)
}
