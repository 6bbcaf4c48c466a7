package tunnelproto

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atoll-edge/atoll/events"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// RelayPolicy lets a Dialer carry a session through a unit peer of the
// node when the node's own leaf link is down (see README "Relay"). The
// session protocol is end to end, so a session may change its path at
// any time: resends bridge the switch.
type RelayPolicy struct {
	// Peers names the members of node's unit, other than node, through
	// which its sessions may be relayed, in order of preference (peers
	// whose own link is up first). Nil or empty: the session stays direct.
	Peers func(node string) []string
	// Down, when set, reports that node's own leaf link is known to be
	// down (the hub reported it closed and not back): a new session then
	// starts through a peer, a direct one moves at once, and a relayed
	// one moves back to direct once Down reports the link up again.
	Down func(node string) bool
	// After is the silence that moves a session to the next path: a
	// session that heard nothing from the node for After (while opening,
	// or right after a switch: the last sequenced frame is republished on
	// the new path, which the node answers at once) or KeepAlive+After
	// (on an established path; keepalives flow every KeepAlive) tries the
	// next of direct, then each peer in turn. Default 1s.
	After time.Duration
	// OnSwitch, when set, is called when a session changes path; via is
	// the relaying peer, "" for direct.
	OnSwitch func(node, via string)
	// OnRelayed, when set, is called once per session, when it first goes
	// through a peer.
	OnRelayed func(node string)
	// OnFrame, when set, is called for each frame the Dialer sends
	// (dir ToEdge) or receives (ToCloud) through a relaying peer.
	OnFrame func(dir events.TunnelDir)
}

func (p *RelayPolicy) after() time.Duration {
	if p.After > 0 {
		return p.After
	}
	return time.Second
}

// route is the path of one dialled session: direct or through a unit
// peer. It owns the session's subscriptions (one per path used) and the
// watchdog timer that moves the session when the node falls silent.
type route struct {
	d        *Dialer
	node, id string
	c        *Conn

	mu        sync.Mutex
	via       string // relaying peer; "" direct
	subject   string // where frames to the node go now
	subs      map[string]*nats.Subscription
	heard     bool                 // a frame arrived (the session is past its OPEN)
	lastHeard time.Time            // last frame from the node, or last switch
	sawDown   bool                 // Down reported the link down since we left direct
	relayed   bool                 // the session ever went through a peer
	probing   bool                 // switched, nothing heard on the new path yet
	lastSeq   *atollv1.TunnelFrame // the last sequenced frame sent
	timer     *time.Timer
	done      bool
}

// subscribeLocked listens for the node's frames on the path through via.
func (r *route) subscribeLocked(via string) error {
	if _, ok := r.subs[via]; ok {
		return nil
	}
	var subj string
	var err error
	if via == "" {
		subj, err = events.TunnelSubject(r.node, r.id, events.ToCloud)
	} else {
		subj, err = events.TunnelRelaySubject(via, r.node, r.id, events.ToCloud)
	}
	if err != nil {
		return err
	}
	sub, err := r.d.nc.Subscribe(subj, func(m *nats.Msg) {
		var f atollv1.TunnelFrame
		if decodeFrame(m.Data, &f) != nil || f.Session != r.id {
			return
		}
		r.mu.Lock()
		if r.done {
			// Lingering (see close): the node resends what our lost last
			// ack did not cover; an ERROR tells it the session is over.
			subj := r.subject
			r.mu.Unlock()
			if f.Kind != atollv1.FrameKind_FRAME_KIND_ERROR {
				r.send(&atollv1.TunnelFrame{Session: r.id, Kind: atollv1.FrameKind_FRAME_KIND_ERROR, Error: "unknown session"}, subj)
			}
			return
		}
		r.heard, r.lastHeard = true, time.Now()
		if via == r.via {
			r.probing = false
		}
		r.mu.Unlock()
		if via != "" && r.d.Relay.OnFrame != nil {
			r.d.Relay.OnFrame(events.ToCloud)
		}
		r.c.receive(&f)
	})
	if err != nil {
		return err
	}
	r.subs[via] = sub
	return nil
}

// setLocked sends the session's frames through via from now on.
func (r *route) setLocked(via string) error {
	subj, err := events.TunnelSubject(r.node, r.id, events.ToEdge)
	if via != "" {
		subj, err = events.TunnelRelaySubject(via, r.node, r.id, events.ToEdge)
	}
	if err != nil {
		return err
	}
	// Listen before sending, so the first answer on the new path is heard.
	if err := r.subscribeLocked(via); err != nil {
		return err
	}
	changed := r.subject != "" && r.via != via
	r.via, r.subject = via, subj
	if changed {
		// Republish the last sequenced frame on the new path: the node
		// answers a duplicate at once (an ack), an OPEN by opening, so
		// the new path proves itself within a round trip instead of
		// after the next resend or keepalive.
		r.probing = true
		if r.lastSeq != nil {
			_ = publishFrame(r.d.nc, subj, r.lastSeq)
		}
	}
	if via != "" && !r.relayed {
		r.relayed = true
		if r.d.Relay.OnRelayed != nil {
			r.d.Relay.OnRelayed(r.node)
		}
	}
	if changed && r.d.Relay.OnSwitch != nil {
		r.d.Relay.OnSwitch(r.node, via)
	}
	return nil
}

// sendFrame publishes a frame of the session on the current path.
func (r *route) sendFrame(f *atollv1.TunnelFrame) {
	r.mu.Lock()
	subj, via := r.subject, r.via
	if f.Sequence != 0 {
		// Frames are never modified once sent; a DATA frame's payload
		// may be reused once the node acknowledged it (frameBuf), and
		// then a republish of it is a duplicate the node drops unread.
		r.lastSeq = f
	}
	r.mu.Unlock()
	if r.send(f, subj) && via != "" && r.d.Relay.OnFrame != nil {
		r.d.Relay.OnFrame(events.ToEdge)
	}
}

// send publishes f on subj and reports whether it went out.
func (r *route) send(f *atollv1.TunnelFrame, subj string) bool {
	return publishFrame(r.d.nc, subj, f) == nil
}

// thresholdLocked is the silence after which the path is changed: After
// while the session is opening or probing a new path (the frame
// republished on it draws an answer within a round trip), KeepAlive+After
// on an established path (both ends send at least every KeepAlive).
func (r *route) thresholdLocked() time.Duration {
	if !r.heard || r.probing {
		return r.d.Relay.after()
	}
	return r.d.cfg.KeepAlive + r.d.Relay.after()
}

func (r *route) armLocked() {
	if r.d.Relay.Peers == nil || r.done {
		return
	}
	d := time.Until(r.lastHeard.Add(r.thresholdLocked()))
	if r.via == "" && r.d.Relay.Down != nil || r.via != "" && r.sawDown {
		d = min(d, r.d.Relay.after()) // look at the link state this often
	}
	d = max(d, 10*time.Millisecond)
	if r.timer == nil {
		r.timer = time.AfterFunc(d, r.check)
		return
	}
	r.timer.Reset(d)
}

// check is the watchdog: it moves a silent session to the next path, a
// direct one whose link is known down to a peer, and a relayed one back
// to direct once the link is known up again.
func (r *route) check() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return
	}
	now := time.Now()
	down := r.d.Relay.Down != nil && r.d.Relay.Down(r.node)
	switch {
	case r.via == "" && down:
		r.nextLocked(now, true)
	case r.via != "" && down:
		r.sawDown = true
		if now.Sub(r.lastHeard) >= r.thresholdLocked() {
			r.nextLocked(now, true)
		}
	case r.via != "" && r.sawDown:
		// The link came back: go direct again.
		r.sawDown = false
		_ = r.setLocked("")
		r.lastHeard = now
	case now.Sub(r.lastHeard) >= r.thresholdLocked():
		r.nextLocked(now, false)
	}
	r.armLocked()
}

// nextLocked moves to the path after the current one: direct (unless
// skipDirect), then each peer in the order Peers gives now.
func (r *route) nextLocked(now time.Time, skipDirect bool) {
	paths := []string{""}
	if skipDirect {
		paths = nil
	}
	for _, p := range r.d.Relay.Peers(r.node) {
		if p != r.node && events.ValidName(p) == nil {
			paths = append(paths, p)
		}
	}
	if len(paths) == 0 {
		return
	}
	next := paths[0]
	for i, p := range paths {
		if p == r.via {
			next = paths[(i+1)%len(paths)]
			break
		}
	}
	if next == r.via {
		return
	}
	if skipDirect {
		r.sawDown = true
	}
	if r.setLocked(next) == nil {
		r.lastHeard = now
	}
}

// start picks the first path (a peer when the link is known down) and
// arms the watchdog.
func (r *route) start() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lastHeard = time.Now()
	if err := r.setLocked(""); err != nil {
		return err
	}
	if r.d.Relay.Peers != nil && r.d.Relay.Down != nil && r.d.Relay.Down(r.node) {
		r.nextLocked(r.lastHeard, true)
	}
	r.armLocked()
	return nil
}

// close stops the watchdog and drops the subscriptions, after linger
// when it is positive: meanwhile they answer the node's frames with an
// ERROR (a session that Lingers: the node may resend its CLOSE because
// our last ack was lost, and nothing else would answer it, as the
// Listener does for sessions it no longer knows).
func (r *route) close(linger time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done = true
	if r.timer != nil {
		r.timer.Stop()
	}
	if linger > 0 {
		time.AfterFunc(linger, func() { r.close(0) })
		return
	}
	for _, s := range r.subs {
		_ = s.Unsubscribe()
	}
	r.subs = nil
}
