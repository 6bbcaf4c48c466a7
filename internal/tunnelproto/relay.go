package tunnelproto

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atoll-edge/atoll/events"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Relay is a unit peer's forwarder of tunnel sessions to a node of its
// unit whose own leaf link is down (see README "Relay"). It is a dumb
// frame forwarder: it decodes no frame and keeps no session state beyond
// which sessions it relays, since the session protocol is end to end.
//
// Frames from the cloud arrive on the peer's own namespace,
// atoll.tunnel.<peer>.relay.<node>.<session>.in, and go on over the
// unit's routes on atoll.relay.<unit>.<peer>.<node>.<session>.in, but
// only when node is a current member of the peer's unit (else the cloud
// gets an ERROR frame and the refusal is counted). The node's answers
// come back on atoll.relay.<unit>.<peer>.<node>.<session>.out and go to
// atoll.tunnel.<peer>.relay.<node>.<session>.out, for sessions the cloud
// sent through this peer in the last Expiry only.
type Relay struct {
	nc   *nats.Conn
	self string
	cfg  RelayConfig

	in, out *nats.Subscription

	mu       sync.Mutex
	sessions map[relayKey]time.Time // last frame from the cloud
	sweep    *time.Timer
	closed   bool
}

type relayKey struct{ unit, node, session string }

// RelayConfig tunes a Relay.
type RelayConfig struct {
	// Member reports this node's unit and whether node is a member of it
	// now (unit "" while in no unit: nothing is relayed).
	Member func(node string) (unit string, ok bool)
	// Expiry: a relayed session the cloud sent nothing for this long is
	// forgotten (the node's answers are then dropped until the cloud's
	// next frame). Default 10s (the sessions' default LinkTimeout).
	Expiry time.Duration
	// OnFrame, when set, is called for each frame forwarded: ToEdge from
	// the cloud to the node, ToCloud back.
	OnFrame func(dir events.TunnelDir)
	// OnRefused, when set, is called for each frame refused (reason
	// names why: the node is not in this unit, or is this node).
	OnRefused func(node, reason string)
}

// ErrNoMember is why a relay request for a node outside the peer's unit is
// refused.
var ErrNoMember = errors.New("tunnel: relay: node is not a member of this unit")

// NewRelay starts relaying for node self over nc.
func NewRelay(nc *nats.Conn, self string, cfg RelayConfig) (*Relay, error) {
	if cfg.Member == nil {
		return nil, fmt.Errorf("tunnel relay: RelayConfig.Member is required")
	}
	if cfg.Expiry < 0 {
		return nil, fmt.Errorf("tunnel relay: RelayConfig.Expiry %s negative", cfg.Expiry)
	}
	if cfg.Expiry == 0 {
		cfg.Expiry = 10 * time.Second
	}
	in, err := events.TunnelRelayFamily.Filter(map[string]string{"peer": self, "dir": string(events.ToEdge)})
	if err != nil {
		return nil, fmt.Errorf("tunnel relay %s: %w", self, err)
	}
	out, err := events.UnitRelayFamily.Filter(map[string]string{"peer": self, "dir": string(events.ToCloud)})
	if err != nil {
		return nil, fmt.Errorf("tunnel relay %s: %w", self, err)
	}
	r := &Relay{nc: nc, self: self, cfg: cfg, sessions: map[relayKey]time.Time{}}
	if r.in, err = nc.Subscribe(in, r.fromCloud); err != nil {
		return nil, fmt.Errorf("tunnel relay %s: subscribe %s: %w", self, in, err)
	}
	if r.out, err = nc.Subscribe(out, r.fromNode); err != nil {
		_ = r.in.Unsubscribe()
		return nil, fmt.Errorf("tunnel relay %s: subscribe %s: %w", self, out, err)
	}
	return r, nil
}

// fromCloud forwards a frame of the cloud to the node over the unit.
func (r *Relay) fromCloud(m *nats.Msg) {
	peer, node, session, _, err := events.ParseTunnelRelaySubject(m.Subject)
	if err != nil || peer != r.self {
		return
	}
	unit, ok := r.cfg.Member(node)
	switch {
	case node == r.self:
		r.refuse(node, session, "relay to itself")
		return
	case unit == "" || !ok:
		r.refuse(node, session, fmt.Sprintf("%v: %s is not in unit %q of %s", ErrNoMember, node, unit, r.self))
		return
	}
	subj, err := events.UnitRelaySubject(unit, r.self, node, session, events.ToEdge)
	if err != nil {
		return
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.sessions[relayKey{unit, node, session}] = time.Now()
	if r.sweep == nil {
		r.sweep = time.AfterFunc(r.cfg.Expiry, r.expire)
	}
	r.mu.Unlock()
	if r.nc.Publish(subj, m.Data) == nil && r.cfg.OnFrame != nil {
		r.cfg.OnFrame(events.ToEdge)
	}
}

// refuse answers the cloud with an ERROR frame (unless the refused frame
// was one: two refusing ends never loop) and counts it.
func (r *Relay) refuse(node, session, reason string) {
	if r.cfg.OnRefused != nil {
		r.cfg.OnRefused(node, reason)
	}
	subj, err := events.TunnelRelaySubject(r.self, node, session, events.ToCloud)
	if err != nil {
		return
	}
	publisher(r.nc, subj, nil)(&atollv1.TunnelFrame{Session: session, Kind: atollv1.FrameKind_FRAME_KIND_ERROR, Error: reason})
}

// fromNode forwards the node's frame of a session relayed here to the
// cloud.
func (r *Relay) fromNode(m *nats.Msg) {
	unit, peer, node, session, _, err := events.ParseUnitRelaySubject(m.Subject)
	if err != nil || peer != r.self {
		return
	}
	r.mu.Lock()
	_, ok := r.sessions[relayKey{unit, node, session}]
	r.mu.Unlock()
	if !ok {
		return
	}
	subj, err := events.TunnelRelaySubject(r.self, node, session, events.ToCloud)
	if err != nil {
		return
	}
	if r.nc.Publish(subj, m.Data) == nil && r.cfg.OnFrame != nil {
		r.cfg.OnFrame(events.ToCloud)
	}
}

// expire forgets sessions the cloud went quiet on; the timer runs only
// while some session is relayed.
func (r *Relay) expire() {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for k, t := range r.sessions {
		if now.Sub(t) >= r.cfg.Expiry {
			delete(r.sessions, k)
		}
	}
	if len(r.sessions) == 0 || r.closed {
		r.sweep = nil
		return
	}
	r.sweep.Reset(r.cfg.Expiry / 2)
}

// Sessions is the count of sessions relayed now.
func (r *Relay) Sessions() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.sessions)
}

// Close stops relaying.
func (r *Relay) Close() error {
	r.mu.Lock()
	r.closed = true
	r.sessions = map[relayKey]time.Time{}
	if r.sweep != nil {
		r.sweep.Stop()
		r.sweep = nil
	}
	r.mu.Unlock()
	return errors.Join(r.in.Unsubscribe(), r.out.Unsubscribe())
}
