// Package membership keeps the edge node in its unit. It follows the
// cloud's NodeAssignment for this node (which unit, which route
// credentials) and the UnitView of that unit (the members and their route
// URLs), applies them to the node's NATS server as its mesh, and tells
// other components (the prober, the voter) who the unit's members are.
//
// Both views come through view feeds (edge/viewfeed): the hub's
// republished copy, caught up from the VIEWS stream at start, after every
// reconnect of the leaf link, on a gap and every check period, so the
// agent holds no consumer on the hub in steady state. Applying a view is
// idempotent and ignores a sequence older than the one held, as the feed
// asks; a rebuilt stream resets the sequences held.
//
// The last assignment and view are kept on disk, so a node that restarts
// while its cloud link is down rejoins its unit from what it knew.
package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/edge/viewfeed"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/atomicfile"
	"github.com/atoll-edge/atoll/internal/hublink"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Node is the edge NATS server membership configures (*natsnode.Node).
type Node interface {
	Name() string
	// SetMesh sets the server's unit routes.
	SetMesh(natsnode.Mesh) error
}

// View is the unit as the node currently knows it.
type View struct {
	// Unit is empty while the node is in no unit.
	Unit    string
	Members []*atollv1.UnitMember
}

// Membership follows the cloud's views of this node and its unit.
type Membership struct {
	cfg   Config
	node  Node
	link  *hublink.Link
	feeds *viewfeed.Feeds
	log   *slog.Logger

	// assignMu serializes applying assignments; it is never taken by the
	// unit view's feed, which setAssignment may wait for.
	assignMu sync.Mutex

	mu         sync.Mutex
	assignment *atollv1.NodeAssignment
	assignSeq  uint64 // stream sequence of the assignment held (0: unknown)
	unitView   *atollv1.UnitView
	viewSeq    uint64 // stream sequence of the unit view held
	watchers   []chan struct{}
	unitCancel context.CancelFunc
	unitDone   chan struct{}
	views      jetstream.Stream // the VIEWS stream, for reading a view before joining

	saveMu  sync.Mutex
	unsaved map[string]proto.Message // by file: the state a full or failing disk refused
}

// saveRetry is how often state the disk refused is written again.
const saveRetry = 10 * time.Second

// New returns the membership of node, following views with feeds and
// reading a new unit's view over link before joining it.
func New(cfg Config, node Node, link *hublink.Link, feeds *viewfeed.Feeds, log *slog.Logger) (*Membership, error) {
	m := &Membership{cfg: cfg, node: node, link: link, feeds: feeds, log: log.With("component", "membership")}
	// The unit kept by an earlier run, set on the node before its server
	// starts: it starts in its unit (edge/natsnode).
	m.restore()
	return m, nil
}

// Current returns the unit as currently known.
func (m *Membership) Current() View {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.viewLocked()
}

func (m *Membership) viewLocked() View {
	v := View{Unit: m.assignment.GetUnit()}
	if v.Unit != "" && m.unitView.GetUnit() == v.Unit {
		v.Members = m.unitView.GetMembers()
	}
	return v
}

// Fingerprints are the fingerprints of the assignment and unit view the
// agent holds (empty: none), which the reporter sends to the cloud.
func (m *Membership) Fingerprints() (assignment, unitView string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if v := m.viewLocked(); v.Unit != "" && m.unitView.GetUnit() == v.Unit {
		unitView = m.unitView.GetFingerprint()
	}
	return m.assignment.GetFingerprint(), unitView
}

// Ready reports why the node cannot take part in its unit: it has no
// assignment (neither from the cloud nor kept on disk), or it is assigned
// to a unit whose view it does not hold. A node assigned to no unit is
// ready: it checks only itself. Kept state counts, so a node that
// restarts while the cloud is unreachable is ready with what it last
// knew.
func (m *Membership) Ready(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.assignment == nil:
		return errors.New("no assignment from the cloud yet")
	case m.assignment.GetUnit() != "" && m.unitView.GetUnit() != m.assignment.GetUnit():
		return fmt.Errorf("no view of unit %q yet", m.assignment.GetUnit())
	}
	return nil
}

// Changes returns a channel that receives a value after every change of
// the view (changes may coalesce; read Current for the latest).
func (m *Membership) Changes() <-chan struct{} {
	ch := make(chan struct{}, 1)
	m.mu.Lock()
	m.watchers = append(m.watchers, ch)
	m.mu.Unlock()
	return ch
}

// Run follows the node's assignment, and the view of its unit, until ctx
// is done.
func (m *Membership) Run(ctx context.Context) error {
	subj, err := events.AssignmentSubject(m.node.Name())
	if err != nil {
		return err
	}
	feed, err := m.feeds.New(viewfeed.Options{Name: "assignment", Filter: subj,
		Apply: func(ctx context.Context, msg viewfeed.Msg) error {
			var a atollv1.NodeAssignment
			if err := decode(msg, &a); err != nil {
				return err
			}
			m.setAssignment(ctx, &a, msg.Seq)
			return nil
		},
		Reset: func(context.Context) {
			m.mu.Lock()
			m.assignSeq = 0
			m.mu.Unlock()
		}})
	if err != nil {
		return err
	}
	m.followUnit(ctx, m.Current().Unit)
	savingCtx, stopSaving := context.WithCancel(ctx)
	saving := make(chan struct{})
	go func() {
		defer close(saving)
		m.keepSaving(savingCtx)
	}()
	defer func() { stopSaving(); <-saving }()
	err = feed.Run(ctx)
	m.mu.Lock()
	cancel, done := m.unitCancel, m.unitDone
	m.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	return err
}

// decode decodes a view handed over by a feed.
func decode(msg viewfeed.Msg, into proto.Message) error {
	return events.DecodeMsg(&nats.Msg{Subject: msg.Subject, Header: msg.Header, Data: msg.Data}, into)
}

// same reports whether two views are the same value: the same
// fingerprint, or equal when they carry none.
func same(a, b interface {
	proto.Message
	GetFingerprint() string
}) bool {
	if a.GetFingerprint() != "" || b.GetFingerprint() != "" {
		return a.GetFingerprint() == b.GetFingerprint()
	}
	return proto.Equal(a, b)
}

// setAssignment applies a, stored at stream sequence seq. An assignment
// older than the one held is ignored, and the one held again changes
// nothing (a feed may hand it over twice).
func (m *Membership) setAssignment(ctx context.Context, a *atollv1.NodeAssignment, seq uint64) {
	m.assignMu.Lock()
	defer m.assignMu.Unlock()
	m.mu.Lock()
	if seq != 0 && seq < m.assignSeq {
		m.mu.Unlock()
		m.log.Debug("ignoring an assignment older than the one held", "seq", seq, "held_seq", m.assignSeq)
		return
	}
	m.assignSeq = seq
	if m.assignment != nil && same(a, m.assignment) {
		m.mu.Unlock()
		return
	}
	unitChanged := a.GetUnit() != m.assignment.GetUnit()
	m.assignment = a
	cancel, done := m.unitCancel, m.unitDone
	m.mu.Unlock()
	m.log.Info("assignment received", "unit", a.GetUnit(), "fingerprint", a.GetFingerprint())
	m.save("assignment.pb", a)
	if unitChanged {
		if cancel != nil {
			cancel()
			<-done
		}
		m.prefetchView(ctx, a.GetUnit())
		m.followUnit(ctx, a.GetUnit())
	}
	m.apply()
}

// prefetchView reads unit's view from the stream before the node joins
// the unit. Joining renames the node's NATS cluster, which restarts its
// leaf link: the view's feed, started then, catches up once the link is
// back. With the view read first the node joins with its members at once.
// Failing, it leaves the view to the feed.
func (m *Membership) prefetchView(ctx context.Context, unit string) {
	if unit == "" {
		return
	}
	subj, err := events.UnitViewSubject(unit)
	if err != nil {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, prefetchTimeout)
	defer cancel()
	v := &atollv1.UnitView{}
	seq, err := m.last(pctx, subj, v)
	if err != nil {
		m.log.Debug("unit view not read before joining; its feed brings it", "unit", unit, "err", err)
		return
	}
	m.mu.Lock()
	if v.GetUnit() != m.assignment.GetUnit() {
		m.mu.Unlock()
		return
	}
	m.unitView, m.viewSeq = v, seq
	m.mu.Unlock()
	m.log.Info("unit view received", "unit", v.GetUnit(), "members", len(v.GetMembers()), "fingerprint", v.GetFingerprint(), "from", "stream")
	m.save("unitview.pb", v)
}

// prefetchTimeout bounds the read of a unit's view before joining it. The
// read only saves the feed's first catch-up: a hub answers it in
// milliseconds, and a request lost with a leaf link that restarts under
// it (a site's own agent joining a unit renames the cluster) would hold
// the assignment's feed, and the view, for as long as this waits.
const prefetchTimeout = 500 * time.Millisecond

// followUnit follows the view of unit in the background.
func (m *Membership) followUnit(ctx context.Context, unit string) {
	if unit == "" {
		m.mu.Lock()
		m.unitCancel, m.unitDone = nil, nil
		m.mu.Unlock()
		return
	}
	subj, err := events.UnitViewSubject(unit)
	if err != nil {
		m.log.Error("cannot follow unit", "unit", unit, "err", err)
		return
	}
	// The view held (read before joining, or kept) is the last of its one
	// subject: the feed starts after it, and finds a rebuilt stream by it.
	m.mu.Lock()
	var start uint64
	if m.unitView.GetUnit() == unit {
		start = m.viewSeq
	}
	m.mu.Unlock()
	feed, err := m.feeds.New(viewfeed.Options{Name: "unit_view", Filter: subj, Start: start,
		Apply: func(_ context.Context, msg viewfeed.Msg) error {
			var v atollv1.UnitView
			if err := decode(msg, &v); err != nil {
				return err
			}
			m.setUnitView(&v, msg.Seq)
			return nil
		},
		Reset: func(context.Context) {
			m.mu.Lock()
			m.viewSeq = 0
			m.mu.Unlock()
		}})
	if err != nil {
		m.log.Error("cannot follow unit", "unit", unit, "err", err)
		return
	}
	uctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	m.mu.Lock()
	m.unitCancel, m.unitDone = cancel, done
	m.mu.Unlock()
	go func() {
		defer close(done)
		if err := feed.Run(uctx); err != nil {
			m.log.Error("following unit view stopped", "unit", unit, "err", err)
		}
	}()
}

// setUnitView applies v, stored at stream sequence seq (see setAssignment).
func (m *Membership) setUnitView(v *atollv1.UnitView, seq uint64) {
	m.mu.Lock()
	if v.GetUnit() != m.assignment.GetUnit() {
		m.mu.Unlock()
		return
	}
	if seq != 0 && seq < m.viewSeq && m.unitView.GetUnit() == v.GetUnit() {
		m.mu.Unlock()
		m.log.Debug("ignoring a unit view older than the one held", "seq", seq, "held_seq", m.viewSeq)
		return
	}
	m.viewSeq = seq
	if m.unitView.GetUnit() == v.GetUnit() && same(v, m.unitView) {
		m.mu.Unlock()
		return
	}
	m.unitView = v
	m.mu.Unlock()
	m.log.Info("unit view received", "unit", v.GetUnit(), "members", len(v.GetMembers()), "fingerprint", v.GetFingerprint())
	m.save("unitview.pb", v)
	m.apply()
}

// last reads the last view stored on subj into like and returns its
// sequence (a direct get: the edge may read its own views' subjects).
func (m *Membership) last(ctx context.Context, subj string, like proto.Message) (uint64, error) {
	m.mu.Lock()
	views := m.views
	m.mu.Unlock()
	if views == nil {
		js := m.link.JetStream()
		if js == nil {
			return 0, errors.New("no hub link")
		}
		st, err := js.Stream(ctx, events.StreamViews)
		if err != nil {
			return 0, fmt.Errorf("stream %s: %w", events.StreamViews, err)
		}
		views = st
		m.mu.Lock()
		m.views = st
		m.mu.Unlock()
	}
	raw, err := views.GetLastMsgForSubject(ctx, subj)
	if err != nil {
		return 0, fmt.Errorf("last value of %s: %w", subj, err)
	}
	if err := events.DecodeMsg(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}, like); err != nil {
		return 0, fmt.Errorf("last value of %s: %w", subj, err)
	}
	return raw.Sequence, nil
}

// apply sets the node's mesh from the current assignment and view and
// notifies watchers.
func (m *Membership) apply() {
	m.mu.Lock()
	view := m.viewLocked()
	mesh := natsnode.Mesh{Unit: view.Unit}
	if view.Unit != "" {
		mesh.User, mesh.Password = m.assignment.GetRouteUser(), m.assignment.GetRoutePassword()
		for _, mem := range view.Members {
			if mem.GetRouteUrl() != "" {
				mesh.Peers = append(mesh.Peers, natsnode.Peer{Name: mem.GetName(), RouteURL: mem.GetRouteUrl()})
			}
		}
	}
	watchers := m.watchers
	m.mu.Unlock()
	if err := m.node.SetMesh(mesh); err != nil {
		m.log.Error("cannot apply unit mesh", "unit", mesh.Unit, "err", err)
	}
	for _, w := range watchers {
		select {
		case w <- struct{}{}:
		default:
		}
	}
}

func (m *Membership) save(name string, msg proto.Message) {
	if m.cfg.StateDir == "" {
		return
	}
	m.saveMu.Lock()
	defer m.saveMu.Unlock()
	m.saveLocked(name, msg)
}

// saveLocked writes msg to name, or keeps it for keepSaving when the disk
// refuses it: a reboot must find the newest state, not the one before a
// full disk.
func (m *Membership) saveLocked(name string, msg proto.Message) {
	b, err := proto.Marshal(msg)
	if err == nil {
		err = atomicfile.Write(filepath.Join(m.cfg.StateDir, name), b, 0o600)
	}
	if err != nil {
		if _, failing := m.unsaved[name]; !failing {
			m.log.Warn("cannot keep membership state; trying again", "file", name, "every", saveRetry.String(), "err", err)
		}
		if m.unsaved == nil {
			m.unsaved = map[string]proto.Message{}
		}
		m.unsaved[name] = msg
		return
	}
	if _, failing := m.unsaved[name]; failing {
		delete(m.unsaved, name)
		m.log.Info("membership state kept again", "file", name)
	}
}

// keepSaving writes again what the disk refused, every saveRetry, until
// ctx is done.
func (m *Membership) keepSaving(ctx context.Context) {
	if m.cfg.StateDir == "" {
		return
	}
	t := time.NewTicker(saveRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.saveMu.Lock()
		for name, msg := range m.unsaved {
			m.saveLocked(name, msg)
		}
		m.saveMu.Unlock()
	}
}

// restore applies the assignment and view kept by an earlier run.
func (m *Membership) restore() {
	if m.cfg.StateDir == "" {
		return
	}
	a, v := &atollv1.NodeAssignment{}, &atollv1.UnitView{}
	if err := readProto(filepath.Join(m.cfg.StateDir, "assignment.pb"), a); err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			m.log.Warn("ignoring kept assignment", "err", err)
		}
		return
	}
	if a.GetNode() != m.node.Name() {
		m.log.Warn("ignoring kept assignment of another node", "assigned_node", a.GetNode())
		return
	}
	m.mu.Lock()
	m.assignment = a
	if err := readProto(filepath.Join(m.cfg.StateDir, "unitview.pb"), v); err == nil && v.GetUnit() == a.GetUnit() {
		m.unitView = v
	}
	m.mu.Unlock()
	m.log.Info("restored membership from disk", "unit", a.GetUnit())
	m.apply()
}

func readProto(path string, msg proto.Message) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := proto.Unmarshal(b, msg); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
