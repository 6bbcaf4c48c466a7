package tunnelproto

import (
	"fmt"
	"time"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// InitialWindow is the credit each end assumes before it hears the peer's
// first limit; a Config's Window is never below it.
const InitialWindow = 64 << 10

// Config tunes one end of a session. The zero value of a field takes its
// default (see Defaults).
type Config struct {
	// MaxFrame is the most stream bytes in one DATA frame (default
	// 60 KiB).
	MaxFrame int
	// Window is the receive buffer: the peer may send this many bytes
	// beyond what the application has read.
	Window int
	// SendBuffer is the most written bytes held before the peer grants
	// credit for them; Conn.Write blocks beyond it.
	SendBuffer int
	// Resend is the first delay before an unacknowledged frame is resent;
	// it doubles per resend up to MaxResend.
	Resend, MaxResend time.Duration
	// AckDelay: received OPEN and DATA are acknowledged within this long,
	// or at once when Window/8 bytes wait for an acknowledgement
	// (cumulative acks, not one WINDOW frame per DATA frame, and an OPEN's
	// ack rides on the answering OPEN or the first DATA); CLOSE,
	// duplicates and gaps at once.
	AckDelay time.Duration
	// KeepAlive: a WINDOW frame is sent when nothing was sent for this long.
	KeepAlive time.Duration
	// LinkTimeout: the session fails when nothing is heard for this long,
	// so a session survives a link loss shorter than it.
	LinkTimeout time.Duration
	// IdleTimeout, when positive, fails a session whose stream moved no
	// byte in either direction for this long.
	IdleTimeout time.Duration
}

// Defaults fills zero fields of c.
func (c Config) Defaults() Config {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defd := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	// A 60 KiB frame with its NATS and protobuf headers fits the 64 KiB
	// read buffer of nats-server: 128 KiB frames cost 15-20 % more CPU
	// per byte (internal/tunnelproto/README.md, Throughput).
	def(&c.MaxFrame, 60<<10)
	def(&c.Window, 1<<20)
	def(&c.SendBuffer, 512<<10)
	defd(&c.Resend, 200*time.Millisecond)
	defd(&c.MaxResend, 1*time.Second)
	defd(&c.AckDelay, 2*time.Millisecond)
	defd(&c.KeepAlive, 2*time.Second)
	defd(&c.LinkTimeout, 10*time.Second)
	return c
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.MaxFrame <= 0 || c.MaxFrame > 512<<10:
		return fmt.Errorf("tunnel config: MaxFrame %d not in (0, 512KiB]", c.MaxFrame)
	case c.Window < InitialWindow:
		return fmt.Errorf("tunnel config: Window %d below InitialWindow %d", c.Window, InitialWindow)
	case c.SendBuffer <= 0:
		return fmt.Errorf("tunnel config: SendBuffer %d not positive", c.SendBuffer)
	case c.Resend <= 0 || c.MaxResend < c.Resend:
		return fmt.Errorf("tunnel config: Resend %s / MaxResend %s", c.Resend, c.MaxResend)
	case c.AckDelay <= 0 || c.AckDelay >= c.Resend:
		return fmt.Errorf("tunnel config: AckDelay %s not in (0, Resend %s)", c.AckDelay, c.Resend)
	case c.KeepAlive <= 0 || c.LinkTimeout <= c.KeepAlive:
		return fmt.Errorf("tunnel config: LinkTimeout %s must exceed KeepAlive %s", c.LinkTimeout, c.KeepAlive)
	case c.IdleTimeout < 0:
		return fmt.Errorf("tunnel config: IdleTimeout %s negative", c.IdleTimeout)
	}
	return nil
}

type inflight struct {
	f      *atollv1.TunnelFrame
	own    *frameBuf // the pooled buffer f's payload lies in, if any
	sentAt time.Time
	rto    time.Duration
}

// Stats counts a session's traffic.
type Stats struct {
	FramesSent, FramesResent, FramesReceived, FramesDropped uint64
	BytesSent, BytesReceived                                uint64
	// FinUnacked is 1 when the session ended cleanly without the ack of
	// its CLOSE (see Tick).
	FinUnacked uint64
}

// Session is one end of a tunnel session as a pure state machine. Inputs
// are Receive, Write, CloseWrite, Read, Abort and Tick; outputs are the
// frames Outgoing returns, to be sent in order. It is not safe for
// concurrent use (Conn serialises it).
type Session struct {
	cfg Config
	id  string

	// send direction
	nextSeq   uint64 // sequence of the next sequenced frame
	sendOff   uint64 // stream bytes framed
	unacked   []inflight
	inflight  int    // payload bytes in unacked
	queue     chunks // written, not yet framed
	peerLimit uint64
	peerAck   uint64
	openQ     *atollv1.TunnelFrame // our OPEN, not yet sent
	wantFin   bool
	finSeq    uint64 // sequence of our CLOSE once framed

	// receive direction
	recvNext uint64
	recvOff  uint64
	buf      chunks // received, not yet read
	readOff  uint64
	discard  bool
	peerOpen bool
	target   string
	peerFin  bool
	needAck  bool
	ackAt    time.Time // when held acknowledgements of OPEN and DATA are due (zero: none held)
	ackHeld  int       // DATA bytes received since the last acknowledgement
	sentAck  uint64
	sentLim  uint64

	lastHeard, lastSent, lastData time.Time
	err                           error
	errReason                     string
	errSent                       bool
	finished                      bool
	// lastAckBare: the peer's CLOSE arrived after our CLOSE had gone out,
	// so its ack left in a WINDOW frame, which nothing acknowledges.
	lastAckBare bool

	stats Stats
}

// NewSession starts an end of session id at now; cfg must be valid
// (after Defaults).
func NewSession(id string, cfg Config, now time.Time) *Session {
	return &Session{
		cfg: cfg, id: id,
		nextSeq: 1, recvNext: 1, peerLimit: InitialWindow,
		lastHeard: now, lastSent: now, lastData: now,
	}
}

// ID is the session identifier.
func (s *Session) ID() string { return s.id }

// Open queues this end's OPEN: with a target from the dialling end, with
// none from the accepting end once it reached the target.
func (s *Session) Open(target string) {
	if s.nextSeq != 1 || s.openQ != nil || s.err != nil {
		return
	}
	s.openQ = &atollv1.TunnelFrame{Session: s.id, Kind: atollv1.FrameKind_FRAME_KIND_OPEN, Target: target}
}

// Opened reports whether the peer's OPEN arrived, and its target.
func (s *Session) Opened() (bool, string) { return s.peerOpen, s.target }

// ResendNow makes every unacknowledged frame due at once, with its resend
// delay back to the first (the peer just came up: it heard none of them).
func (s *Session) ResendNow() {
	for i := range s.unacked {
		s.unacked[i].sentAt, s.unacked[i].rto = time.Time{}, s.cfg.Resend
	}
}

// Write takes up to len(p) bytes into the send buffer and returns how many
// it took (0 when full, closed for writing or failed).
func (s *Session) Write(p []byte, now time.Time) int {
	if s.err != nil || s.wantFin || s.finished {
		return 0
	}
	n := min(len(p), s.cfg.SendBuffer-s.queue.len())
	if n <= 0 {
		return 0
	}
	// Bytes that must wait for credit are packed into MaxFrame chunks (so
	// they leave in full frames); others in chunks of their own size.
	size := n
	if s.queue.len() > 0 {
		size = s.cfg.MaxFrame
	}
	s.queue.push(p[:n], size)
	s.lastData = now
	return n
}

// writeBuf queues fb.b[start:end] itself, lent by the caller
// (Conn.ReadFrom), when all of it fits into the send buffer, and reports
// whether it did (false: full, closed for writing or failed). The queue
// and the frames cut from it hold references to fb (see frameBuf).
func (s *Session) writeBuf(fb *frameBuf, start, end int, now time.Time) bool {
	n := end - start
	if s.err != nil || s.wantFin || s.finished || n <= 0 || s.queue.len()+n > s.cfg.SendBuffer {
		return false
	}
	s.queue.pushRange(fb, start, end)
	s.lastData = now
	return true
}

// CloseWrite queues a half-close after the buffered bytes.
func (s *Session) CloseWrite() { s.wantFin = true }

// Read moves received bytes into p.
func (s *Session) Read(p []byte) int {
	n := s.buf.read(p)
	s.readOff += uint64(n)
	if s.limit()-s.sentLim >= uint64(s.cfg.Window/4) {
		s.needAck = true
	}
	return n
}

// ReadChunk removes and returns up to n received bytes without a copy: a
// read-only slice of a received frame's payload. Credit is as for Read.
func (s *Session) ReadChunk(n int) []byte {
	if s.buf.len() == 0 {
		return nil
	}
	p, _ := s.buf.take(n) // received payloads are never pooled
	s.readOff += uint64(len(p))
	if s.limit()-s.sentLim >= uint64(s.cfg.Window/4) {
		s.needAck = true
	}
	return p
}

// Discard drops unread and future received bytes (the application closed
// its reading side) while keeping credit flowing so the peer can finish.
func (s *Session) Discard() {
	s.discard = true
	s.readOff += uint64(s.buf.len())
	s.buf.reset()
	s.needAck = true
}

// Buffered is the count of received bytes not yet read.
func (s *Session) Buffered() int { return s.buf.len() }

// PeerClosed reports the peer's half-close (after every byte before it).
func (s *Session) PeerClosed() bool { return s.peerFin }

// Writable is the room in the send buffer.
func (s *Session) Writable() int {
	if s.err != nil || s.wantFin {
		return 0
	}
	return s.cfg.SendBuffer - s.queue.len()
}

// Err is the session's failure, nil while it is healthy or after a clean end.
func (s *Session) Err() error {
	if s.finished {
		return nil
	}
	return s.err
}

// Done reports that the session needs no more frames: it failed (and its
// ERROR was emitted) or both ends closed and every frame of ours was
// acknowledged.
func (s *Session) Done() bool {
	if s.err != nil {
		return s.errSent || s.finished
	}
	return s.finished
}

// Lingers reports that the session finished but the peer may not have
// its last ack (TCP's TIME_WAIT): the peer's CLOSE was acknowledged only
// by a WINDOW frame, and if that was lost the peer resends until it hears
// an answer. Whoever forgets a lingering session should answer its frames
// with an ERROR for a while (both transports do), which ends the peer's
// side cleanly. When our CLOSE carried the ack instead, the peer's ack of
// our CLOSE proves it has it.
func (s *Session) Lingers() bool { return s.finished && s.err == nil && s.lastAckBare }

// Stats is a copy of the counters.
func (s *Session) Stats() Stats { return s.stats }

// Abort fails the session with reason, told to the peer in an ERROR frame.
func (s *Session) Abort(reason string) { s.fail(fmt.Errorf("%w: %s", ErrAborted, reason), reason) }

func (s *Session) fail(err error, reason string) {
	if s.err != nil || s.finished {
		return
	}
	s.err, s.errReason = err, reason
	s.queue.reset()
	s.unacked, s.inflight = nil, 0
}

func (s *Session) limit() uint64 { return s.readOff + uint64(s.cfg.Window) }

func (s *Session) protocol(format string, a ...any) {
	reason := fmt.Sprintf(format, a...)
	s.fail(fmt.Errorf("%w: %s", ErrProtocol, reason), "protocol: "+reason)
}

// Receive applies a frame from the peer.
func (s *Session) Receive(f *atollv1.TunnelFrame, now time.Time) {
	if s.err != nil || s.finished || f == nil {
		return
	}
	s.stats.FramesReceived++
	s.lastHeard = now
	if f.Session != s.id {
		s.stats.FramesDropped++
		return
	}
	if f.Ack > s.peerAck {
		if f.Ack >= s.nextSeq {
			s.protocol("ack %d of unsent sequence (next %d)", f.Ack, s.nextSeq)
			return
		}
		s.peerAck = f.Ack
		i := 0
		for i < len(s.unacked) && s.unacked[i].f.Sequence <= f.Ack {
			s.inflight -= len(s.unacked[i].f.Payload)
			if own := s.unacked[i].own; own != nil {
				s.unacked[i].own = nil
				own.unref()
			}
			i++
		}
		s.unacked = s.unacked[i:]
	}
	if f.Limit > s.peerLimit {
		s.peerLimit = f.Limit
	}
	switch f.Kind {
	case atollv1.FrameKind_FRAME_KIND_WINDOW:
		if f.Sequence != 0 {
			s.protocol("sequenced WINDOW")
		}
	case atollv1.FrameKind_FRAME_KIND_ERROR:
		if s.wantFin && s.finSeq != 0 && s.peerFin {
			// Both ends closed; the peer forgot the session after our
			// last ack was lost. Nothing is missing.
			s.finished = true
			return
		}
		reason := f.Error
		if reason == "" {
			reason = "unspecified"
		}
		s.err, s.errSent = &PeerError{Reason: reason}, true
		s.queue.reset()
		s.unacked, s.inflight = nil, 0
	case atollv1.FrameKind_FRAME_KIND_OPEN, atollv1.FrameKind_FRAME_KIND_DATA, atollv1.FrameKind_FRAME_KIND_CLOSE:
		s.sequenced(f, now)
	default:
		s.protocol("unknown frame kind %d", f.Kind)
	}
	s.checkFinished()
}

func (s *Session) sequenced(f *atollv1.TunnelFrame, now time.Time) {
	switch {
	case f.Sequence == 0:
		s.protocol("%s without sequence", f.Kind)
		return
	case f.Sequence < s.recvNext:
		s.stats.FramesDropped++ // duplicate: re-ack so the sender stops
		s.needAck = true
		return
	case f.Sequence > s.recvNext:
		s.stats.FramesDropped++ // gap: go-back-N, the sender resends
		s.needAck = true
		return
	}
	first := f.Sequence == 1
	if first != (f.Kind == atollv1.FrameKind_FRAME_KIND_OPEN) {
		s.protocol("%s at sequence %d", f.Kind, f.Sequence)
		return
	}
	if s.peerFin {
		s.protocol("%s after CLOSE", f.Kind)
		return
	}
	switch f.Kind {
	case atollv1.FrameKind_FRAME_KIND_OPEN:
		s.peerOpen, s.target = true, f.Target
	case atollv1.FrameKind_FRAME_KIND_DATA:
		n := uint64(len(f.Payload))
		switch {
		case n == 0:
			s.protocol("empty DATA")
			return
		case f.Offset != s.recvOff:
			s.protocol("DATA at offset %d, expected %d", f.Offset, s.recvOff)
			return
		case s.recvOff+n > s.limit():
			s.protocol("DATA beyond limit %d", s.limit())
			return
		}
		s.recvOff += n
		s.stats.BytesReceived += n
		s.lastData = now
		if s.discard {
			s.readOff += n
		} else {
			s.buf.pushOwned(f.Payload) // read-only: Read copies out of it
		}
	case atollv1.FrameKind_FRAME_KIND_CLOSE:
		s.peerFin = true
		s.lastAckBare = s.finSeq != 0
	}
	s.recvNext++
	if f.Kind != atollv1.FrameKind_FRAME_KIND_CLOSE {
		// Cumulative acks: hold them up to AckDelay or Window/8 bytes. An
		// OPEN's too: the accepting end's OPEN, or the dialling end's
		// first DATA, carries it, instead of a WINDOW of its own on the
		// way of the session's opening.
		s.ackHeld += len(f.Payload)
		if s.ackHeld < s.cfg.Window/8 {
			if s.ackAt.IsZero() {
				s.ackAt = now.Add(s.cfg.AckDelay)
			}
			return
		}
	}
	s.needAck = true
}

// onlyFinUnacked: both ends closed, and the only frame the peer has not
// acknowledged is our CLOSE.
func (s *Session) onlyFinUnacked() bool {
	return s.peerFin && s.wantFin && s.finSeq != 0 && s.queue.len() == 0 &&
		len(s.unacked) == 1 && s.unacked[0].f.Sequence == s.finSeq
}

func (s *Session) checkFinished() {
	if s.err == nil && s.peerFin && s.finSeq != 0 && s.peerAck >= s.finSeq && !s.needAck && s.ackAt.IsZero() {
		s.finished = true
	}
}

// Tick applies the timeouts at now.
func (s *Session) Tick(now time.Time) {
	if s.err != nil || s.finished {
		return
	}
	if now.Sub(s.lastHeard) >= s.cfg.LinkTimeout {
		if s.onlyFinUnacked() {
			// Every byte both ways is delivered and acknowledged; only our
			// CLOSE's ack is missing. A peer that sent its CLOSE and
			// received ours forgets the session; its transport answers our
			// resends with an ERROR only for a while (see Lingers), so its
			// last ack, once lost, may never come: nothing is missing.
			// (Had the link failed instead, a peer that missed our CLOSE
			// fails on its own LinkTimeout.)
			s.finished = true
			s.stats.FinUnacked++
			return
		}
		s.fail(fmt.Errorf("%w: nothing heard for %s", ErrPeerLost, now.Sub(s.lastHeard).Round(time.Millisecond)), "peer lost")
		return
	}
	if s.cfg.IdleTimeout > 0 && now.Sub(s.lastData) >= s.cfg.IdleTimeout {
		s.fail(fmt.Errorf("%w after %s", ErrIdle, s.cfg.IdleTimeout), "idle timeout")
	}
}

func (s *Session) stamp(f *atollv1.TunnelFrame, now time.Time) *atollv1.TunnelFrame {
	f.Ack, f.Limit = s.recvNext-1, s.limit()
	s.sentAck, s.sentLim = f.Ack, f.Limit
	s.needAck, s.ackAt, s.ackHeld = false, time.Time{}, 0
	s.lastSent = now
	s.stats.FramesSent++
	return f
}

func (s *Session) sequence(f *atollv1.TunnelFrame, now time.Time) *atollv1.TunnelFrame {
	f.Sequence = s.nextSeq
	s.nextSeq++
	s.unacked = append(s.unacked, inflight{f: f, sentAt: now, rto: s.cfg.Resend})
	return s.stamp(f, now)
}

// Outgoing returns the frames to send at now, in order: an ERROR once
// the session failed; otherwise due resends, new OPEN/DATA/CLOSE within
// the peer's credit, and a WINDOW when an ack, credit or keepalive is due.
// Returned frames are the caller's to send (they must not be modified).
func (s *Session) Outgoing(now time.Time) []*atollv1.TunnelFrame {
	var out []*atollv1.TunnelFrame
	if s.finished {
		return nil
	}
	if s.err != nil {
		if s.errSent {
			return nil
		}
		s.errSent = true
		return append(out, s.stamp(&atollv1.TunnelFrame{Session: s.id, Kind: atollv1.FrameKind_FRAME_KIND_ERROR, Error: s.errReason}, now))
	}
	for i := range s.unacked {
		in := &s.unacked[i]
		if now.Sub(in.sentAt) < in.rto {
			continue
		}
		// A copy with a fresh ack and limit; the payload is shared read-only.
		c := in.f
		out = append(out, s.stamp(&atollv1.TunnelFrame{Session: c.Session, Sequence: c.Sequence, Kind: c.Kind,
			Payload: c.Payload, Target: c.Target, Offset: c.Offset}, now))
		in.sentAt, in.rto = now, min(2*in.rto, s.cfg.MaxResend)
		s.stats.FramesResent++
	}
	if s.openQ != nil {
		out = append(out, s.sequence(s.openQ, now))
		s.openQ = nil
	}
	if s.nextSeq > 1 { // our OPEN went first
		// The peer's limit bounds what it must buffer; our own Window bounds
		// what we keep for resending, whatever limit a lying peer grants.
		for s.queue.len() > 0 && s.sendOff < s.peerLimit && s.inflight < s.cfg.Window {
			p, own := s.queue.take(min(s.cfg.MaxFrame, s.cfg.Window-s.inflight, int(min(s.peerLimit-s.sendOff, uint64(s.cfg.MaxFrame)))))
			n := len(p)
			out = append(out, s.sequence(&atollv1.TunnelFrame{Session: s.id, Kind: atollv1.FrameKind_FRAME_KIND_DATA, Payload: p, Offset: s.sendOff}, now))
			s.unacked[len(s.unacked)-1].own = own
			s.sendOff += uint64(n)
			s.inflight += n
			s.stats.BytesSent += uint64(n)
		}
		if s.wantFin && s.finSeq == 0 && s.queue.len() == 0 {
			f := s.sequence(&atollv1.TunnelFrame{Session: s.id, Kind: atollv1.FrameKind_FRAME_KIND_CLOSE}, now)
			s.finSeq = f.Sequence
			out = append(out, f)
		}
	}
	if !s.ackAt.IsZero() && !now.Before(s.ackAt) {
		s.needAck = true
	}
	if len(out) == 0 && (s.needAck || now.Sub(s.lastSent) >= s.cfg.KeepAlive) {
		out = append(out, s.stamp(&atollv1.TunnelFrame{Session: s.id, Kind: atollv1.FrameKind_FRAME_KIND_WINDOW}, now))
	}
	s.checkFinished()
	return out
}

// Deadline is when Tick and Outgoing next have work without new input;
// zero when the session is done.
func (s *Session) Deadline() time.Time {
	if s.Done() {
		return time.Time{}
	}
	if s.err != nil {
		return s.lastSent // the ERROR is due now
	}
	d := s.lastHeard.Add(s.cfg.LinkTimeout)
	earlier := func(t time.Time) {
		if t.Before(d) {
			d = t
		}
	}
	earlier(s.lastSent.Add(s.cfg.KeepAlive))
	if !s.ackAt.IsZero() {
		earlier(s.ackAt)
	}
	if s.cfg.IdleTimeout > 0 {
		earlier(s.lastData.Add(s.cfg.IdleTimeout))
	}
	for _, in := range s.unacked {
		earlier(in.sentAt.Add(in.rto))
	}
	return d
}
