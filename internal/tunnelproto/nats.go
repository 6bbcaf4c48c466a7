package tunnelproto

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/events"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// APIServerTarget prefixes the target of a session that carries a node's
// connection to kube-apiserver (events.APIServerDialFamily):
// "kube-apiserver/<token>", the token of the node's request. It is no
// "host:port", so an agent never takes it for a local target.
const APIServerTarget = "kube-apiserver/"

// NewSessionID is a random session token.
func NewSessionID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// marshalBufs are frame encoding buffers: Publish copies the bytes into
// the connection's buffer, so one is free again once it returns, and a
// bulk stream does not allocate (and zero) a frame-sized slice per frame.
var marshalBufs = sync.Pool{New: func() any { return new([]byte) }}

// publishFrame encodes f into a pooled buffer and publishes it.
func publishFrame(nc *nats.Conn, subject string, f *atollv1.TunnelFrame) error {
	bp := marshalBufs.Get().(*[]byte)
	data, err := proto.MarshalOptions{}.MarshalAppend((*bp)[:0], f)
	if err == nil {
		err = nc.Publish(subject, data)
	}
	*bp = data
	marshalBufs.Put(bp)
	return err
}

func publisher(nc *nats.Conn, subject string, onErr func(error)) func(*atollv1.TunnelFrame) {
	return func(f *atollv1.TunnelFrame) {
		if err := publishFrame(nc, subject, f); err != nil && onErr != nil {
			onErr(fmt.Errorf("publish %s: %w", subject, err))
		}
	}
}

// Dialer opens sessions from the cloud to nodes' agents. Each session
// holds one subscription per path it used (its own ToCloud subject, and
// the relay subject of each peer it went through); no other state, so any
// number of Dialers (tunnel server replicas) share a hub.
type Dialer struct {
	nc  *nats.Conn
	cfg Config
	// OnDone, when set, is called once per session with its final stats
	// and error (nil for a clean end).
	OnDone func(node string, st Stats, err error)
	// Relay, when its Peers is set, relays sessions through a unit peer
	// of the node when the node falls silent or its link is known down.
	// Set it before the first Dial.
	Relay RelayPolicy

	up      *nats.Subscription
	mu      sync.Mutex
	waiting map[string]map[*Conn]struct{} // node → its sessions waiting for the agent's OPEN
}

// NewDialer validates cfg (after Defaults) and follows the agents'
// announcements (events.TunnelUpFamily): a session waiting for an agent
// that just subscribed resends its OPEN at once. Close stops following.
func NewDialer(nc *nats.Conn, cfg Config) (*Dialer, error) {
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Dialer{nc: nc, cfg: cfg, waiting: map[string]map[*Conn]struct{}{}}
	subj, err := events.TunnelUpFamily.Filter(nil)
	if err != nil {
		return nil, err
	}
	if d.up, err = nc.Subscribe(subj, d.agentUp); err != nil {
		return nil, fmt.Errorf("tunnel dialer: subscribe %s: %w", subj, err)
	}
	return d, nil
}

// Close stops following the agents' announcements.
func (d *Dialer) Close() error {
	if d.up == nil {
		return nil
	}
	return d.up.Unsubscribe()
}

// agentUp resends the OPEN of the sessions waiting for the announcing
// node's agent.
func (d *Dialer) agentUp(m *nats.Msg) {
	var up atollv1.TunnelAgentUp
	if proto.Unmarshal(m.Data, &up) != nil {
		return
	}
	if f, err := events.TunnelUpFamily.Parse(m.Subject); err != nil || len(f) != 1 || f[0] != up.GetNode() {
		return
	}
	d.mu.Lock()
	conns := make([]*Conn, 0, len(d.waiting[up.GetNode()]))
	for c := range d.waiting[up.GetNode()] {
		conns = append(conns, c)
	}
	d.mu.Unlock()
	for _, c := range conns {
		c.nudge()
	}
}

// wait records c as waiting for node's agent until done is called.
func (d *Dialer) wait(node string, c *Conn) (done func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.waiting[node] == nil {
		d.waiting[node] = map[*Conn]struct{}{}
	}
	d.waiting[node][c] = struct{}{}
	return func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		delete(d.waiting[node], c)
		if len(d.waiting[node]) == 0 {
			delete(d.waiting, node)
		}
	}
}

// Dial opens a session to target ("host:port", resolved by the agent) on
// node and returns once the agent reached the target, or with the
// agent's refusal (*PeerError), or ctx's error.
func (d *Dialer) Dial(ctx context.Context, node, target string) (*Conn, error) {
	id := NewSessionID()
	if _, err := events.TunnelSubject(node, id, events.ToEdge); err != nil {
		return nil, fmt.Errorf("tunnel dial %s: %w", node, err)
	}
	r := &route{d: d, node: node, id: id, subs: map[string]*nats.Subscription{}}
	release := func(c *Conn) {
		linger := time.Duration(0)
		if c.s.Lingers() {
			linger = 2 * d.cfg.MaxResend
		}
		r.close(linger)
		if d.OnDone != nil {
			d.OnDone(node, c.s.Stats(), c.s.Err())
		}
	}
	c := newConn(NewSession(id, d.cfg, time.Now()), r.sendFrame, nil, Addr{Target: "cloud"}, Addr{Node: node, Target: target})
	r.c = c
	if err := r.start(); err != nil {
		r.close(0)
		c.timer.Stop()
		return nil, fmt.Errorf("tunnel dial %s: subscribe: %w", node, err)
	}
	done := d.wait(node, c)
	defer done()
	c.mu.Lock()
	c.release = release
	c.s.Open(target)
	c.flushLocked(time.Now())
	c.mu.Unlock()
	if err := c.waitEstablished(ctx); err != nil {
		return nil, fmt.Errorf("tunnel dial %s %s: %w", node, target, err)
	}
	return c, nil
}

// Listener accepts sessions for one node: one wildcard subscription on
// the node's ToEdge subjects and one on the unit legs of sessions relayed
// to it by a unit peer (see README "Relay"), demultiplexed by session. A
// session answers on the path its last frame came by, so it follows the
// cloud from direct to relayed and back.
type Listener struct {
	nc       *nats.Conn
	node     string
	cfg      Config
	sub      *nats.Subscription
	relaySub *nats.Subscription
	accept   chan *Request

	mu       sync.Mutex
	sessions map[string]*listened
	recent   map[string]struct{} // finished sessions, answered with ERROR
	order    []string
	closed   bool
	// OnDone, when set, is called once per session with its final stats
	// and error (nil for a clean end).
	OnDone func(st Stats, err error)
	// OnRelayedFrame, when set, is called for each frame that arrives
	// through a relaying unit peer.
	OnRelayedFrame func()
}

// listened is a session of a Listener and the subject its frames to the
// cloud take now.
type listened struct {
	c     *Conn
	nc    *nats.Conn
	mu    sync.Mutex
	reply string
}

func (s *listened) setReply(subj string) {
	s.mu.Lock()
	s.reply = subj
	s.mu.Unlock()
}

func (s *listened) send(f *atollv1.TunnelFrame) {
	s.mu.Lock()
	subj := s.reply
	s.mu.Unlock()
	_ = publishFrame(s.nc, subj, f)
}

// Request is a session a peer asked to open; Accept or Refuse it.
type Request struct {
	Target string
	c      *Conn
}

// Accept tells the peer the target was reached and returns the Conn.
func (r *Request) Accept() *Conn {
	r.c.mu.Lock()
	r.c.s.Open("")
	r.c.flushLocked(time.Now())
	r.c.mu.Unlock()
	return r.c
}

// Refuse fails the session with reason (sent to the dialler).
func (r *Request) Refuse(reason string) { r.c.Abort(reason) }

const recentSessions = 4096

// Listen subscribes to node's sessions, direct and relayed. At most
// backlog requests wait for Accept; more are refused.
func Listen(nc *nats.Conn, node string, cfg Config, backlog int) (*Listener, error) {
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	subj, err := events.TunnelFamily.Filter(map[string]string{"node": node, "dir": string(events.ToEdge)})
	if err != nil {
		return nil, fmt.Errorf("tunnel listen %s: %w", node, err)
	}
	relaySubj, err := events.UnitRelayFamily.Filter(map[string]string{"node": node, "dir": string(events.ToEdge)})
	if err != nil {
		return nil, fmt.Errorf("tunnel listen %s: %w", node, err)
	}
	l := &Listener{nc: nc, node: node, cfg: cfg, accept: make(chan *Request, max(backlog, 1)),
		sessions: map[string]*listened{}, recent: map[string]struct{}{}}
	l.sub, err = nc.Subscribe(subj, l.handle)
	if err != nil {
		return nil, fmt.Errorf("tunnel listen %s: subscribe %s: %w", node, subj, err)
	}
	l.relaySub, err = nc.Subscribe(relaySubj, l.handle)
	if err != nil {
		_ = l.sub.Unsubscribe()
		return nil, fmt.Errorf("tunnel listen %s: subscribe %s: %w", node, relaySubj, err)
	}
	l.announce()
	return l, nil
}

// announce tells the tunnel servers that the node's agent listens
// (events.TunnelUpFamily): published after the subscriptions, on the same
// connection, so the hub has the interest before a server resends. Best
// effort: without it, a waiting session opens at its next resend.
func (l *Listener) announce() {
	subj, err := events.TunnelUpFamily.Subject(l.node)
	if err != nil {
		return
	}
	data, err := proto.Marshal(&atollv1.TunnelAgentUp{Node: l.node})
	if err != nil {
		return
	}
	_ = l.nc.Publish(subj, data)
}

// replyTo parses a frame's subject: its session, and the subject of the
// same path back to the cloud.
func (l *Listener) replyTo(subject string) (id, reply string, relayed bool, err error) {
	if node, id, _, err := events.ParseTunnelSubject(subject); err == nil {
		if node != l.node {
			return "", "", false, fmt.Errorf("tunnel: frame for node %s", node)
		}
		reply, err := events.TunnelSubject(l.node, id, events.ToCloud)
		return id, reply, false, err
	}
	unit, peer, node, id, _, err := events.ParseUnitRelaySubject(subject)
	if err != nil {
		return "", "", false, err
	}
	if node != l.node {
		return "", "", false, fmt.Errorf("tunnel: relayed frame for node %s", node)
	}
	reply, err = events.UnitRelaySubject(unit, peer, l.node, id, events.ToCloud)
	return id, reply, true, err
}

func (l *Listener) handle(m *nats.Msg) {
	id, reply, relayed, err := l.replyTo(m.Subject)
	if err != nil {
		return
	}
	var f atollv1.TunnelFrame
	if decodeFrame(m.Data, &f) != nil || f.Session != id {
		return
	}
	if relayed && l.OnRelayedFrame != nil {
		l.OnRelayedFrame()
	}
	l.mu.Lock()
	s, ok := l.sessions[id]
	if !ok {
		_, old := l.recent[id]
		if l.closed || old || f.Kind != atollv1.FrameKind_FRAME_KIND_OPEN || f.Sequence != 1 {
			l.mu.Unlock()
			// A keepalive of a session the cloud is still opening (it
			// acknowledges nothing of ours) can overtake its OPEN when
			// the session changes path: the OPEN's resend follows.
			early := !old && f.Kind == atollv1.FrameKind_FRAME_KIND_WINDOW && f.Ack == 0
			if f.Kind != atollv1.FrameKind_FRAME_KIND_ERROR && !early {
				l.replyError(reply, id, "unknown session")
			}
			return
		}
		s = l.newSession(id)
		l.sessions[id] = s
	}
	l.mu.Unlock()
	s.setReply(reply)
	s.c.receive(&f)
	if !ok {
		_, target := s.c.s.Opened()
		select {
		case l.accept <- &Request{Target: target, c: s.c}:
		default:
			s.c.Abort("agent busy")
		}
	}
}

func (l *Listener) newSession(id string) *listened {
	s := &listened{nc: l.nc}
	s.c = newConn(NewSession(id, l.cfg, time.Now()), s.send, func(c *Conn) {
		l.mu.Lock()
		delete(l.sessions, id)
		l.recent[id] = struct{}{}
		l.order = append(l.order, id)
		if len(l.order) > recentSessions {
			delete(l.recent, l.order[0])
			l.order = l.order[1:]
		}
		l.mu.Unlock()
		if l.OnDone != nil {
			l.OnDone(c.s.Stats(), c.s.Err())
		}
	}, Addr{Node: l.node}, Addr{Target: "cloud"})
	return s
}

func (l *Listener) replyError(reply, id, reason string) {
	publisher(l.nc, reply, nil)(&atollv1.TunnelFrame{Session: id, Kind: atollv1.FrameKind_FRAME_KIND_ERROR, Error: reason})
}

// ErrListenerClosed is Accept's error after Close.
var ErrListenerClosed = errors.New("tunnel: listener closed")

// Accept waits for the next session request.
func (l *Listener) Accept(ctx context.Context) (*Request, error) {
	select {
	case r, ok := <-l.accept:
		if !ok {
			return nil, ErrListenerClosed
		}
		return r, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Sessions is the count of live sessions.
func (l *Listener) Sessions() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.sessions)
}

// Close unsubscribes and aborts every session.
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	conns := make([]*Conn, 0, len(l.sessions))
	for _, s := range l.sessions {
		conns = append(conns, s.c)
	}
	l.mu.Unlock()
	err := errors.Join(l.sub.Unsubscribe(), l.relaySub.Unsubscribe())
	for _, c := range conns {
		c.Abort("agent shutting down")
	}
	for {
		select {
		case r := <-l.accept:
			r.Refuse("agent shutting down")
			continue
		default:
		}
		break
	}
	return err
}
