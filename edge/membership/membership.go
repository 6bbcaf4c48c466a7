// Package membership keeps the edge node in its unit. It follows the
// cloud's NodeAssignment for this node (which unit, which route
// credentials) and the UnitView of that unit (the members and their route
// URLs), applies them to the node's NATS server as its mesh, and tells
// other components (the prober) who the unit's members are.
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

	"github.com/atoll-edge/atoll/internal/admin"

	"go.uber.org/fx"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/hublink"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Config tunes membership.
type Config struct {
	// StateDir keeps the last assignment and unit view (empty: nothing is
	// kept and a restart waits for the cloud).
	StateDir string
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
	node    *natsnode.Node
	link    *hublink.Link
	log     *slog.Logger
	metrics *events.Metrics

	mu         sync.Mutex
	assignment *atollv1.NodeAssignment
	unitView   *atollv1.UnitView
	watchers   []chan struct{}
	unitCancel context.CancelFunc
	unitDone   chan struct{}
}

// New returns the membership of node, following views over link.
func New(cfg Config, node *natsnode.Node, link *hublink.Link, log *slog.Logger, metrics *events.Metrics) *Membership {
	return &Membership{cfg: cfg, node: node, link: link, log: log.With("component", "membership"), metrics: metrics}
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

// Ready reports why the node cannot yet take part in its unit: it has no
// assignment (neither from the cloud nor kept on disk), or it is assigned
// to a unit whose view it does not hold. A node assigned to no unit is
// ready: it checks only itself. Kept state counts, so a node that restarts
// while the cloud is unreachable is ready with what it last knew.
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
	m.restore()
	m.followUnit(ctx, m.Current().Unit)
	spec, err := events.AssignmentFollower(m.node.Name())
	if err != nil {
		return err
	}
	err = events.Consume(ctx, m.link.JetStream(), spec,
		func(_ context.Context, ev events.Event[*atollv1.NodeAssignment]) error {
			m.setAssignment(ctx, ev.Msg)
			return nil
		},
		events.ConsumeOptions{Logger: m.log, Metrics: m.metrics})
	m.mu.Lock()
	cancel, done := m.unitCancel, m.unitDone
	m.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	return err
}

func (m *Membership) setAssignment(ctx context.Context, a *atollv1.NodeAssignment) {
	m.mu.Lock()
	if proto.Equal(a, m.assignment) {
		m.mu.Unlock()
		return
	}
	unitChanged := a.GetUnit() != m.assignment.GetUnit()
	m.assignment = a
	cancel, done := m.unitCancel, m.unitDone
	m.mu.Unlock()
	m.log.Info("assignment received", "unit", a.GetUnit())
	m.save("assignment.pb", a)
	if unitChanged {
		if cancel != nil {
			cancel()
			<-done
		}
		m.followUnit(ctx, a.GetUnit())
	}
	m.apply()
}

// followUnit follows the view of unit in the background.
func (m *Membership) followUnit(ctx context.Context, unit string) {
	if unit == "" {
		m.mu.Lock()
		m.unitCancel, m.unitDone = nil, nil
		m.mu.Unlock()
		return
	}
	spec, err := events.UnitViewFollower(unit)
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
		err := events.Consume(uctx, m.link.JetStream(), spec,
			func(_ context.Context, ev events.Event[*atollv1.UnitView]) error { m.setUnitView(ev.Msg); return nil },
			events.ConsumeOptions{Logger: m.log, Metrics: m.metrics})
		if err != nil {
			m.log.Error("following unit view stopped", "unit", unit, "err", err)
		}
	}()
}

func (m *Membership) setUnitView(v *atollv1.UnitView) {
	m.mu.Lock()
	if v.GetUnit() != m.assignment.GetUnit() || v.GetFingerprint() == m.unitView.GetFingerprint() {
		m.mu.Unlock()
		return
	}
	m.unitView = v
	m.mu.Unlock()
	m.log.Info("unit view received", "unit", v.GetUnit(), "members", len(v.GetMembers()))
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

// Module runs membership with the app.
var Module = fx.Module("membership",
	fx.Provide(New),
	fx.Invoke(func(lc fx.Lifecycle, m *Membership, log *slog.Logger, adm *admin.Server) {
		adm.AddReadiness("membership", m.Ready)
		fxrun.Background(lc, log, "membership", m.Run)
	}),
)
