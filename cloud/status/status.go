// Package status answers operators' status requests (`atoll status`). It
// runs the nats.go micro service events.CloudService ("atoll-cloud", so
// `nats micro ls` lists it) with the endpoint "status" on
// events.StatusSubject, in the queue group of the cloud replicas, and
// replies with a ClusterStatus built from memory: per edge unit its
// disruption state, and per node the cloud's view (the Node's Ready
// condition) next to its peers' verdict and whether the cloud protects it.
//
// A request that cannot be decoded is answered with no payload and micro's
// typed error headers (Nats-Service-Error, Nats-Service-Error-Code 400); a
// status that cannot be built is answered the same way with code 500. The
// responder never panics on input and never leaves a request unanswered.
package status

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/cloud/units"
	"github.com/atoll-edge/atoll/events"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// QueueGroup is the queue group of the cloud replicas: one of them answers
// each request.
const QueueGroup = events.CloudService

// Health is what the responder reads from the health service
// (*health.Service implements it).
type Health interface {
	// Judge is the cloud's reading of the votes about node.
	Tally(node string) health.Tally
	// UnitState is a unit's disruption state and the end of its hold.
	UnitState(unit string) (health.UnitState, time.Time)
	// Protected reports whether the cloud keeps node now.
	Protected(node string) bool
}

// Tunnels counts the tunnel sessions this replica relays, by node
// (*tunnel.Server implements it).
type Tunnels interface {
	SessionsByNode() map[string]int
}

// DefaultGather is how long the replica answering a status request waits
// for the other replicas' tunnel sessions.
const DefaultGather = 300 * time.Millisecond

// Views tells what a node's agent reports (*members.Service implements
// it): which views it holds older than the cloud published them ("" when
// current), and which of its probe credentials its peers refuse.
type Views interface {
	ViewsBehind(node string) string
	ProbeRefusals(node string) []*atollv1.ProbeRefusal
}

// Keys tells whether the cloud holds a valid identity key for a node's
// agent (*identity.Service implements it).
type Keys interface {
	NodeKey(node string) (string, bool)
}

// Responder answers status requests.
type Responder struct {
	health  Health
	views   Views   // nil: every node's views read "unknown", no refusal
	keys    Keys    // nil: no node reads as without a key
	tunnels Tunnels // nil: this replica relays no session
	gather  time.Duration
	nodes   corelisters.NodeLister
	units   units.Rule
	log     *slog.Logger
	now     func() time.Time

	mu  sync.Mutex
	nc  *nats.Conn
	svc micro.Service
}

// New returns a responder reading nodes (grouped into units by rule) and
// the health service h. It answers nothing until Start.
func New(h Health, nodes corelisters.NodeLister, rule units.Rule, log *slog.Logger) (*Responder, error) {
	switch {
	case h == nil:
		return nil, errors.New("status: no health service")
	case nodes == nil:
		return nil, errors.New("status: no node lister")
	case rule.Validate() != nil:
		return nil, fmt.Errorf("status: %w", rule.Validate())
	}
	return &Responder{health: h, nodes: nodes, units: rule, log: log.With("component", "status"), now: time.Now, gather: DefaultGather}, nil
}

// SetTunnels has the replica tell its tunnel sessions (every replica
// answers the "tunnels" endpoint, with none without it). Call it before
// Start.
func (r *Responder) SetTunnels(t Tunnels) { r.tunnels = t }

// SetGather sets how long a status request waits for the replicas'
// tunnel sessions (default DefaultGather). Call it before Start.
func (r *Responder) SetGather(d time.Duration) { r.gather = d }

// SetViews has node statuses name the views each agent is behind on and
// the probe credentials its peers refuse. Call it before Start.
func (r *Responder) SetViews(v Views) { r.views = v }

// SetKeys has node statuses say which reporting agents the cloud holds no
// key for. Call it before Start.
func (r *Responder) SetKeys(k Keys) { r.keys = k }

// Start adds the micro service with its status endpoint on nc and returns
// once the server has its subscriptions.
func (r *Responder) Start(nc *nats.Conn) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.svc != nil {
		return errors.New("status: already started")
	}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        events.CloudService,
		Version:     events.CloudServiceVersion,
		Description: "atoll-cloud: the health state of the edge units",
		QueueGroup:  QueueGroup,
	})
	if err != nil {
		return fmt.Errorf("status: add service %s: %w", events.CloudService, err)
	}
	f := events.StatusFamily
	err = svc.AddEndpoint(f.Endpoint, events.Endpoint(r.log, r.handle),
		micro.WithEndpointSubject(f.Pattern),
		micro.WithEndpointMetadata(map[string]string{
			"request": events.TypeName(f.Message), "reply": events.TypeName(f.Reply),
		}))
	if err != nil {
		_ = svc.Stop()
		return fmt.Errorf("status: endpoint %s on %s: %w", f.Endpoint, f.Pattern, err)
	}
	tf := events.TunnelsFamily
	err = svc.AddEndpoint(tf.Endpoint, events.Endpoint(r.log, r.handleTunnels),
		micro.WithEndpointSubject(tf.Pattern),
		micro.WithEndpointQueueGroupDisabled(), // every replica answers
		micro.WithEndpointMetadata(map[string]string{
			"request": events.TypeName(tf.Message), "reply": events.TypeName(tf.Reply),
		}))
	if err == nil {
		err = nc.Flush()
	}
	if err != nil {
		_ = svc.Stop()
		return fmt.Errorf("status: endpoint %s on %s: %w", tf.Endpoint, tf.Pattern, err)
	}
	r.nc, r.svc = nc, svc
	r.log.Info("serving", "service", events.CloudService, "endpoint", f.Endpoint, "subject", f.Pattern)
	return nil
}

// Stop stops the service: requests already received are answered, no new
// ones are taken.
func (r *Responder) Stop() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.svc == nil {
		return nil
	}
	err := r.svc.Stop()
	r.svc = nil
	if errors.Is(err, nats.ErrConnectionClosed) {
		return nil // nothing left to drain
	}
	return err
}

func (r *Responder) handle(_ context.Context, req *atollv1.StatusRequest) (proto.Message, error) {
	cs, err := r.Status(req.GetUnit())
	if err != nil {
		return nil, err
	}
	cs.Replica = r.replica()
	r.addTunnels(cs)
	return cs, nil
}

func (r *Responder) handleTunnels(_ context.Context, _ *atollv1.TunnelSessionsRequest) (proto.Message, error) {
	ts := &atollv1.TunnelSessions{Replica: r.replica(), Nodes: map[string]uint32{}}
	if r.tunnels != nil {
		for n, c := range r.tunnels.SessionsByNode() {
			ts.Nodes[n] = uint32(c)
		}
	}
	return ts, nil
}

// addTunnels sums every replica's tunnel sessions (GatherTunnels) into
// the node statuses.
func (r *Responder) addTunnels(cs *atollv1.ClusterStatus) {
	sums, answered, ok := r.GatherTunnels()
	if !ok {
		return
	}
	cs.TunnelReplicas = answered
	for _, u := range cs.GetUnits() {
		for _, n := range u.GetNodes() {
			n.TunnelSessions = sums[n.GetName()]
		}
	}
}

// GatherTunnels asks every replica (itself included) for its tunnel
// sessions, waits the gather window for answers and returns the sessions
// by node and how many replicas answered. Any replica may hold sessions
// to any node, so none alone knows them; a replica that does not answer
// in time is left out. ok is false when the request could not be sent
// (not started, or the connection failed).
func (r *Responder) GatherTunnels() (sessions map[string]uint32, replicas uint32, ok bool) {
	r.mu.Lock()
	nc := r.nc
	r.mu.Unlock()
	if nc == nil {
		return nil, 0, false
	}
	inbox := nc.NewRespInbox()
	replies := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(inbox, replies)
	if err != nil {
		r.log.Warn("tunnel sessions: subscribe", "err", err)
		return nil, 0, false
	}
	defer func() { _ = sub.Unsubscribe() }()
	req, err := events.NewMsg(events.TunnelsSubject, &atollv1.TunnelSessionsRequest{}, "")
	if err == nil {
		req.Reply = inbox
		err = nc.PublishMsg(req)
	}
	if err != nil {
		r.log.Warn("tunnel sessions: request", "err", err)
		return nil, 0, false
	}
	sums := map[string]uint32{}
	answered := uint32(0) // each replica answers once (several may share a hub server's name)
	timeout := time.NewTimer(r.gather)
	defer timeout.Stop()
	for {
		select {
		case m := <-replies:
			var ts atollv1.TunnelSessions
			if events.DecodeMsg(m, &ts) != nil {
				continue // an error answer
			}
			answered++
			for n, c := range ts.GetNodes() {
				sums[n] += c
			}
		case <-timeout.C:
			return sums, answered, true
		}
	}
}

func (r *Responder) replica() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nc == nil {
		return ""
	}
	return r.nc.ConnectedServerName()
}

// Status builds the status of unit, or of every unit when unit is empty.
// Units and their nodes are sorted by name; nodes without the unit label
// are not edge nodes and are left out. Replica is left empty.
func (r *Responder) Status(unit string) (*atollv1.ClusterStatus, error) {
	now := r.now()
	nodes, err := r.nodes.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("status: list nodes: %w", err)
	}
	byUnit := map[string][]*corev1.Node{}
	for _, n := range nodes {
		u := r.units.Of(n)
		if u == "" || (unit != "" && u != unit) {
			continue
		}
		byUnit[u] = append(byUnit[u], n)
	}
	cs := &atollv1.ClusterStatus{Time: timestamppb.New(now)}
	for _, u := range slices.Sorted(maps.Keys(byUnit)) {
		members := byUnit[u]
		slices.SortFunc(members, func(a, b *corev1.Node) int { return cmp.Compare(a.Name, b.Name) })
		state, hold := r.health.UnitState(u)
		us := &atollv1.UnitStatus{Unit: u, State: string(state), HoldUntil: timestamp(hold)}
		for _, n := range members {
			us.Nodes = append(us.Nodes, r.nodeStatus(n))
		}
		cs.Units = append(cs.Units, us)
	}
	return cs, nil
}

func (r *Responder) nodeStatus(n *corev1.Node) *atollv1.NodeStatus {
	j := r.health.Tally(n.Name)
	behind := r.viewsBehind(n.Name)
	return &atollv1.NodeStatus{
		Name:           n.Name,
		Ready:          string(health.ReadyStatus(n)),
		Verdict:        j.Verdict,
		HealthyVotes:   uint32(j.Healthy),
		UnhealthyVotes: uint32(j.Unhealthy),
		UndecidedVotes: uint32(j.Undecided),
		Normal:         j.Normal,
		Abnormal:       j.Abnormal,
		Checkers:       j.Checkers,
		VerdictSince:   timestamp(j.Since),
		LastVote:       timestamp(j.LastVote),
		Protected:      r.health.Protected(n.Name),
		ViewsBehind:    behind,
		ProbeRefusals:  r.probeRefusals(n.Name),
		NoKey:          r.noKey(n.Name, behind),
	}
}

// noKey: node's agent reports (its views are known) and the cloud holds
// no valid key for it. A node without an agent, or whose agent has not
// reported, is not said to lack one.
func (r *Responder) noKey(node, behind string) bool {
	if r.keys == nil || behind == "unknown" {
		return false
	}
	_, ok := r.keys.NodeKey(node)
	return !ok
}

func (r *Responder) viewsBehind(node string) string {
	if r.views == nil {
		return "unknown"
	}
	return r.views.ViewsBehind(node)
}

func (r *Responder) probeRefusals(node string) []*atollv1.ProbeRefusal {
	if r.views == nil {
		return nil
	}
	return r.views.ProbeRefusals(node)
}

// timestamp is t, or unset for the zero time and for the Unix epoch (what
// a vote without a since reads as).
func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() || t.Equal(time.Unix(0, 0)) {
		return nil
	}
	return timestamppb.New(t)
}
