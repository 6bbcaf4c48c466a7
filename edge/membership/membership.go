// Package membership keeps the edge node in its unit. It follows the
// cloud's NodeAssignment for this node (which unit, which route
// credentials) and the UnitView of that unit (the members and their route
// URLs), applies them to the node's NATS server as its mesh, and tells
// other components (the prober, the voter) who the unit's members are.
//
// Following alone is not trusted to converge: a delivery can be lost on
// the way (an ordered consumer acknowledges nothing, so the server counts
// a message sent into a reply subject that had just lost its interest as
// delivered), and an ordered consumer that resumes after a hub restart can
// wait past the end of a recreated stream. So the agent also compares
// what it holds with the last value the VIEWS stream stores on each of its
// subjects, every CheckPeriod and after every reconnect of its leaf link;
// when it is behind, it applies the stored value, restarts the follower,
// and counts and logs the catch-up (see check.go).
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

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Node is the edge NATS server membership configures (*natsnode.Node).
type Node interface {
	Name() string
	// SetMesh sets the server's unit routes.
	SetMesh(natsnode.Mesh) error
	// Status tells whether the leaf link to the hub is up.
	Status() natsnode.Status
}

// View is the unit as the node currently knows it.
type View struct {
	// Unit is empty while the node is in no unit.
	Unit    string
	Members []*atollv1.UnitMember
}

// Membership follows the cloud's views of this node and its unit.
type Membership struct {
	cfg     Config
	node    Node
	link    *hublink.Link
	log     *slog.Logger
	evm     *events.Metrics
	metrics *metrics
	now     func() time.Time

	// assignMu serializes applying assignments (the follower and the
	// check); it is never taken by the unit view's follower, which
	// setAssignment may wait for.
	assignMu sync.Mutex

	mu         sync.Mutex
	assignment *atollv1.NodeAssignment
	assignSeq  uint64 // stream sequence of the assignment held (0: unknown)
	unitView   *atollv1.UnitView
	viewSeq    uint64            // stream sequence of the unit view held
	behind     map[string]string // view kind → why, while found behind
	suspect    map[string]uint64 // view kind → a stored sequence below the held one, seen once
	watchers   []chan struct{}
	assignCons *events.Consumer
	unitCons   *events.Consumer
	unitCancel context.CancelFunc
	unitDone   chan struct{}
	views      jetstream.Stream // the VIEWS stream, for the check
	// failedChecks counts checks in a row that could not read the
	// stream; checkWarned is set once that was logged at WARN.
	failedChecks int
	checkWarned  bool
}

// New returns the membership of node, following views over link. reg may
// be nil (metrics not exported).
func New(cfg Config, node Node, link *hublink.Link, log *slog.Logger, evm *events.Metrics, reg prometheus.Registerer) (*Membership, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Membership{
		cfg: cfg, node: node, link: link, log: log.With("component", "membership"), evm: evm,
		metrics: newMetrics(reg), now: time.Now,
		behind: map[string]string{}, suspect: map[string]uint64{},
	}, nil
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
// assignment (neither from the cloud nor kept on disk), it is assigned to
// a unit whose view it does not hold, or the last check found the
// assignment or the unit view behind the stream and it could not catch
// up. A node assigned to no unit is ready: it checks only itself. Kept
// state counts, so a node that restarts while the cloud is unreachable is
// ready with what it last knew.
func (m *Membership) Ready(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.assignment == nil:
		return errors.New("no assignment from the cloud yet")
	case m.behind[viewAssignment] != "":
		return fmt.Errorf("assignment behind the stream: %s", m.behind[viewAssignment])
	case m.assignment.GetUnit() != "" && m.unitView.GetUnit() != m.assignment.GetUnit():
		return fmt.Errorf("no view of unit %q yet", m.assignment.GetUnit())
	case m.behind[viewUnit] != "":
		return fmt.Errorf("view of unit %q behind the stream: %s", m.assignment.GetUnit(), m.behind[viewUnit])
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

// Run follows the node's assignment, and the view of its unit, and checks
// both against the stream, until ctx is done.
func (m *Membership) Run(ctx context.Context) error {
	m.restore()
	spec, err := events.AssignmentFollower(m.node.Name())
	if err != nil {
		return err
	}
	cons, err := events.NewConsumer(m.link.JetStream(), spec,
		func(_ context.Context, ev events.Event[*atollv1.NodeAssignment]) error {
			m.setAssignment(ctx, ev.Msg, ev.Sequence, false)
			return nil
		},
		events.EdgeFollow(events.ConsumeOptions{Logger: m.log, Metrics: m.evm}))
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.assignCons = cons
	m.mu.Unlock()
	m.followUnit(ctx, m.Current().Unit)

	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); m.watch(ctx) }()
	err = cons.Run(ctx)
	wg.Wait()
	m.mu.Lock()
	cancel, done := m.unitCancel, m.unitDone
	m.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	return err
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

// setAssignment applies a, stored at stream sequence seq. A delivery older
// than the assignment held (fromCheck false: in flight while the check
// applied a newer one) is ignored; the check's value is the stream's.
func (m *Membership) setAssignment(ctx context.Context, a *atollv1.NodeAssignment, seq uint64, fromCheck bool) {
	m.assignMu.Lock()
	defer m.assignMu.Unlock()
	m.mu.Lock()
	if !fromCheck && seq != 0 && seq < m.assignSeq {
		m.mu.Unlock()
		m.log.Debug("ignoring an assignment older than the one held", "seq", seq, "held_seq", m.assignSeq)
		return
	}
	m.assignSeq = seq
	if m.assignment != nil && same(a, m.assignment) {
		delete(m.behind, viewAssignment)
		m.mu.Unlock()
		return
	}
	unitChanged := a.GetUnit() != m.assignment.GetUnit()
	m.assignment = a
	delete(m.behind, viewAssignment)
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
// leaf link: the view's follower, created then, waits for the link, and
// a delivery on the way can be lost. With the view read first the node
// joins with its members at once. Failing, it leaves the view to the
// follower and the check.
func (m *Membership) prefetchView(ctx context.Context, unit string) {
	if unit == "" {
		return
	}
	subj, err := events.UnitViewSubject(unit)
	if err != nil {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, found, err := m.last(pctx, subj, &atollv1.UnitView{})
	if err != nil || !found {
		m.log.Debug("unit view not read before joining; its follower brings it", "unit", unit, "found", found, "err", err)
		return
	}
	v := st.msg.(*atollv1.UnitView)
	m.mu.Lock()
	if v.GetUnit() != m.assignment.GetUnit() {
		m.mu.Unlock()
		return
	}
	m.unitView, m.viewSeq = v, st.seq
	m.mu.Unlock()
	m.log.Info("unit view received", "unit", v.GetUnit(), "members", len(v.GetMembers()), "fingerprint", v.GetFingerprint(), "from", "stream")
	m.save("unitview.pb", v)
}

// followUnit follows the view of unit in the background.
func (m *Membership) followUnit(ctx context.Context, unit string) {
	if unit == "" {
		m.mu.Lock()
		m.unitCancel, m.unitDone, m.unitCons = nil, nil, nil
		m.mu.Unlock()
		return
	}
	spec, err := events.UnitViewFollower(unit)
	if err == nil {
		var cons *events.Consumer
		cons, err = events.NewConsumer(m.link.JetStream(), spec,
			func(_ context.Context, ev events.Event[*atollv1.UnitView]) error {
				m.setUnitView(ev.Msg, ev.Sequence, false)
				return nil
			},
			events.EdgeFollow(events.ConsumeOptions{Logger: m.log.With("unit", unit), Metrics: m.evm}))
		if err == nil {
			uctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			m.mu.Lock()
			m.unitCancel, m.unitDone, m.unitCons = cancel, done, cons
			m.mu.Unlock()
			go func() {
				defer close(done)
				if err := cons.Run(uctx); err != nil {
					m.log.Error("following unit view stopped", "unit", unit, "err", err)
				}
			}()
			return
		}
	}
	m.log.Error("cannot follow unit", "unit", unit, "err", err)
}

// setUnitView applies v, stored at stream sequence seq (see setAssignment).
func (m *Membership) setUnitView(v *atollv1.UnitView, seq uint64, fromCheck bool) {
	m.mu.Lock()
	if v.GetUnit() != m.assignment.GetUnit() {
		m.mu.Unlock()
		return
	}
	if !fromCheck && seq != 0 && seq < m.viewSeq && m.unitView.GetUnit() == v.GetUnit() {
		m.mu.Unlock()
		m.log.Debug("ignoring a unit view older than the one held", "seq", seq, "held_seq", m.viewSeq)
		return
	}
	m.viewSeq = seq
	if m.unitView.GetUnit() == v.GetUnit() && same(v, m.unitView) {
		delete(m.behind, viewUnit)
		m.mu.Unlock()
		return
	}
	m.unitView = v
	delete(m.behind, viewUnit)
	m.mu.Unlock()
	m.log.Info("unit view received", "unit", v.GetUnit(), "members", len(v.GetMembers()), "fingerprint", v.GetFingerprint())
	m.save("unitview.pb", v)
	m.apply()
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
	if err := writeAtomic(filepath.Join(m.cfg.StateDir, name), msg); err != nil {
		m.log.Warn("cannot keep membership state", "file", name, "err", err)
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

func writeAtomic(path string, msg proto.Message) error {
	b, err := proto.Marshal(msg)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
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
