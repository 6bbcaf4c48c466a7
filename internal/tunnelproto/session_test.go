package tunnelproto

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

var t0 = time.Unix(1_700_000_000, 0)

func testConfig() Config {
	return Config{MaxFrame: 1000, Window: InitialWindow, SendBuffer: 4000}.Defaults()
}

func frame(kind atollv1.FrameKind, seq uint64, mod ...func(*atollv1.TunnelFrame)) *atollv1.TunnelFrame {
	f := &atollv1.TunnelFrame{Session: "s", Kind: kind, Sequence: seq}
	for _, m := range mod {
		m(f)
	}
	return f
}

func data(off uint64, p string) func(*atollv1.TunnelFrame) {
	return func(f *atollv1.TunnelFrame) { f.Offset, f.Payload = off, []byte(p) }
}

const (
	kOpen   = atollv1.FrameKind_FRAME_KIND_OPEN
	kData   = atollv1.FrameKind_FRAME_KIND_DATA
	kClose  = atollv1.FrameKind_FRAME_KIND_CLOSE
	kError  = atollv1.FrameKind_FRAME_KIND_ERROR
	kWindow = atollv1.FrameKind_FRAME_KIND_WINDOW
)

// TestReceive feeds one end frame sequences and checks what it delivers,
// acknowledges and whether it fails.
func TestReceive(t *testing.T) {
	tests := []struct {
		name    string
		in      []*atollv1.TunnelFrame
		read    string
		ack     uint64
		eof     bool
		errIs   error
		peerErr string
	}{
		{name: "in order", in: []*atollv1.TunnelFrame{frame(kOpen, 1), frame(kData, 2, data(0, "ab")), frame(kData, 3, data(2, "cd"))}, read: "abcd", ack: 3},
		{name: "duplicates ignored", in: []*atollv1.TunnelFrame{frame(kOpen, 1), frame(kData, 2, data(0, "ab")), frame(kOpen, 1), frame(kData, 2, data(0, "ab")), frame(kData, 3, data(2, "c"))}, read: "abc", ack: 3},
		{name: "gap dropped until resent", in: []*atollv1.TunnelFrame{frame(kOpen, 1), frame(kData, 3, data(2, "cd")), frame(kData, 2, data(0, "ab")), frame(kData, 3, data(2, "cd"))}, read: "abcd", ack: 3},
		{name: "half-close after data", in: []*atollv1.TunnelFrame{frame(kOpen, 1), frame(kData, 2, data(0, "x")), frame(kClose, 3)}, read: "x", ack: 3, eof: true},
		{name: "close before data arrives waits for the gap", in: []*atollv1.TunnelFrame{frame(kOpen, 1), frame(kClose, 3), frame(kData, 2, data(0, "x"))}, read: "x", ack: 2},
		{name: "error frame", in: []*atollv1.TunnelFrame{frame(kOpen, 1), frame(kError, 0, func(f *atollv1.TunnelFrame) { f.Error = "target not allowed" })}, ack: 1, peerErr: "target not allowed"},
		{name: "data before open", in: []*atollv1.TunnelFrame{frame(kData, 1, data(0, "x"))}, errIs: ErrProtocol},
		{name: "open twice", in: []*atollv1.TunnelFrame{frame(kOpen, 1), frame(kOpen, 2)}, ack: 1, errIs: ErrProtocol},
		{name: "data after close", in: []*atollv1.TunnelFrame{frame(kOpen, 1), frame(kClose, 2), frame(kData, 3, data(0, "x"))}, ack: 2, eof: true, errIs: ErrProtocol},
		{name: "wrong offset", in: []*atollv1.TunnelFrame{frame(kOpen, 1), frame(kData, 2, data(5, "x"))}, ack: 1, errIs: ErrProtocol},
		{name: "empty data", in: []*atollv1.TunnelFrame{frame(kOpen, 1), frame(kData, 2, data(0, ""))}, ack: 1, errIs: ErrProtocol},
		{name: "unsequenced data", in: []*atollv1.TunnelFrame{frame(kOpen, 1), frame(kData, 0, data(0, "x"))}, ack: 1, errIs: ErrProtocol},
		{name: "sequenced window", in: []*atollv1.TunnelFrame{frame(kWindow, 4)}, errIs: ErrProtocol},
		{name: "unknown kind", in: []*atollv1.TunnelFrame{frame(99, 1)}, errIs: ErrProtocol},
		{name: "ack of unsent", in: []*atollv1.TunnelFrame{frame(kWindow, 0, func(f *atollv1.TunnelFrame) { f.Ack = 7 })}, errIs: ErrProtocol},
		{name: "beyond limit", in: []*atollv1.TunnelFrame{frame(kOpen, 1), frame(kData, 2, data(0, string(make([]byte, InitialWindow+1))))}, ack: 1, errIs: ErrProtocol},
		{name: "other session ignored", in: []*atollv1.TunnelFrame{frame(kOpen, 1), frame(kData, 2, data(0, "x"), func(f *atollv1.TunnelFrame) { f.Session = "other" })}, ack: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewSession("s", testConfig(), t0)
			for _, f := range tt.in {
				s.Receive(f, t0)
			}
			buf := make([]byte, 2*InitialWindow)
			got := string(buf[:s.Read(buf)])
			if got != tt.read {
				t.Errorf("read %q, want %q", got, tt.read)
			}
			if s.recvNext-1 != tt.ack {
				t.Errorf("ack %d, want %d", s.recvNext-1, tt.ack)
			}
			if s.PeerClosed() != tt.eof {
				t.Errorf("eof %v, want %v", s.PeerClosed(), tt.eof)
			}
			err := s.Err()
			var pe *PeerError
			switch {
			case tt.peerErr != "":
				if !errors.As(err, &pe) || pe.Reason != tt.peerErr {
					t.Errorf("err %v, want peer error %q", err, tt.peerErr)
				}
				if out := s.Outgoing(t0); len(out) != 0 {
					t.Errorf("answered a peer ERROR with %v", out)
				}
			case tt.errIs != nil:
				if !errors.Is(err, tt.errIs) {
					t.Errorf("err %v, want %v", err, tt.errIs)
				}
				out := s.Outgoing(t0)
				if len(out) != 1 || out[0].Kind != kError || out[0].Error == "" {
					t.Errorf("failure sent %v, want one ERROR with a reason", out)
				}
				if !s.Done() {
					t.Error("failed session not done after its ERROR")
				}
			default:
				if err != nil {
					t.Errorf("err %v", err)
				}
				if out := s.Outgoing(t0); tt.ack > 0 && (len(out) != 1 || out[0].Kind != kWindow || out[0].Ack != tt.ack) {
					t.Errorf("ack sent %v, want one WINDOW with ack %d", out, tt.ack)
				}
			}
		})
	}
}

// TestSendWindowAndResend: a sender stops at the peer's limit, resends
// unacknowledged frames with a doubling delay and forgets acked ones.
func TestSendWindowAndResend(t *testing.T) {
	cfg := Config{MaxFrame: 16 << 10, Window: InitialWindow, SendBuffer: 256 << 10, Resend: 100 * time.Millisecond, MaxResend: 400 * time.Millisecond}.Defaults()
	s := NewSession("s", cfg, t0)
	s.Open("127.0.0.1:10250")
	if n := s.Write(make([]byte, 200<<10), t0); n != 200<<10 {
		t.Fatalf("wrote %d", n)
	}
	if n := s.Write(make([]byte, 100<<10), t0); n != 56<<10 {
		t.Fatalf("send buffer took %d of 100KiB with 56KiB room", n)
	}
	out := s.Outgoing(t0)
	var sent int
	for _, f := range out[1:] {
		sent += len(f.Payload)
	}
	if out[0].Kind != kOpen || out[0].Target != "127.0.0.1:10250" || sent != InitialWindow {
		t.Fatalf("first flight: %d frames, %d bytes, want OPEN + %d bytes", len(out), sent, InitialWindow)
	}
	if more := s.Outgoing(t0.Add(50 * time.Millisecond)); len(more) != 0 {
		t.Fatalf("sent %d frames beyond the window before any resend was due", len(more))
	}
	re := s.Outgoing(t0.Add(100 * time.Millisecond))
	if len(re) != len(out) || s.Stats().FramesResent != uint64(len(out)) {
		t.Fatalf("resent %d of %d", len(re), len(out))
	}
	if again := s.Outgoing(t0.Add(250 * time.Millisecond)); len(again) != 0 {
		t.Fatalf("resend delay did not double: %d frames at +150ms", len(again))
	}
	// The peer acks OPEN and two frames and grants 64 KiB more.
	s.Receive(frame(kWindow, 0, func(f *atollv1.TunnelFrame) { f.Ack, f.Limit = 3, 2*InitialWindow }), t0.Add(260*time.Millisecond))
	if len(s.unacked) != len(out)-3 {
		t.Fatalf("unacked %d, want %d", len(s.unacked), len(out)-3)
	}
	next := s.Outgoing(t0.Add(260 * time.Millisecond))
	sent = 0
	for _, f := range next {
		sent += len(f.Payload)
	}
	// The grant allows 64 KiB more, but only the 32 KiB acknowledged
	// left our own in-flight bound (Window).
	if sent != 32<<10 {
		t.Fatalf("after the grant sent %d, want %d", sent, 32<<10)
	}
	// A stale frame with a lower limit never shrinks credit.
	s.Receive(frame(kWindow, 0, func(f *atollv1.TunnelFrame) { f.Ack, f.Limit = 1, 10 }), t0.Add(270*time.Millisecond))
	if s.peerLimit != 2*InitialWindow || s.peerAck != 3 {
		t.Fatalf("stale frame moved limit %d ack %d", s.peerLimit, s.peerAck)
	}
}

// TestTimeouts: keepalive, link timeout and idle timeout.
func TestTimeouts(t *testing.T) {
	cfg := Config{KeepAlive: time.Second, LinkTimeout: 5 * time.Second, IdleTimeout: 30 * time.Second}.Defaults()
	s := NewSession("s", cfg, t0)
	s.Open("x:1")
	s.Outgoing(t0)
	s.Receive(frame(kOpen, 1, func(f *atollv1.TunnelFrame) { f.Ack = 1 }), t0)
	s.Outgoing(t0.Add(cfg.AckDelay)) // the OPEN's ack
	if d := s.Deadline(); !d.Equal(t0.Add(cfg.AckDelay + time.Second)) {
		t.Fatalf("deadline %s, want the keepalive at +1s after the ack", d.Sub(t0))
	}
	if out := s.Outgoing(t0.Add(cfg.AckDelay + time.Second)); len(out) != 1 || out[0].Kind != kWindow {
		t.Fatalf("keepalive %v", out)
	}
	// The peer keeps talking: no link timeout, but no data → idle.
	for i := 1; i <= 30; i++ {
		now := t0.Add(time.Duration(i) * time.Second)
		s.Receive(frame(kWindow, 0, func(f *atollv1.TunnelFrame) { f.Ack = 1 }), now)
		s.Tick(now)
		s.Outgoing(now)
	}
	if !errors.Is(s.Err(), ErrIdle) {
		t.Fatalf("after 30s without data: %v, want idle", s.Err())
	}

	s = NewSession("s", cfg, t0)
	s.Tick(t0.Add(4900 * time.Millisecond))
	if s.Err() != nil {
		t.Fatalf("failed before the link timeout: %v", s.Err())
	}
	s.Tick(t0.Add(5 * time.Second))
	if !errors.Is(s.Err(), ErrPeerLost) {
		t.Fatalf("err %v, want peer lost", s.Err())
	}
	if out := s.Outgoing(t0.Add(5 * time.Second)); len(out) != 1 || out[0].Kind != kError {
		t.Fatalf("peer lost sent %v", out)
	}
}

// link is a simulated network between two sessions that drops,
// duplicates and reorders frames as its random source decides.
type link struct {
	rng        *rand.Rand
	drop, dup  float64
	reorder    float64
	down       func(now time.Time) bool
	queue      [2][]*atollv1.TunnelFrame
	marshalled bool
}

func (l *link) carry(dir int, fs []*atollv1.TunnelFrame, now time.Time) {
	for _, f := range fs {
		if l.down != nil && l.down(now) || l.rng.Float64() < l.drop {
			continue
		}
		if l.marshalled { // through the wire format
			b, _ := proto.Marshal(f)
			f = &atollv1.TunnelFrame{}
			_ = proto.Unmarshal(b, f)
		}
		q := l.queue[dir]
		if len(q) > 0 && l.rng.Float64() < l.reorder {
			i := l.rng.IntN(len(q))
			q = append(q[:i], append([]*atollv1.TunnelFrame{f}, q[i:]...)...)
		} else {
			q = append(q, f)
		}
		if l.rng.Float64() < l.dup {
			q = append(q, f)
		}
		l.queue[dir] = q
	}
}

// deliver hands fs to s; once s is done, it answers them with an ERROR
// through l in direction back, as both transports answer the frames of a
// session they no longer hold.
func deliver(l *link, back int, s *Session, fs []*atollv1.TunnelFrame, now time.Time) {
	for _, f := range fs {
		if s.Done() && f.Kind != atollv1.FrameKind_FRAME_KIND_ERROR {
			l.carry(back, []*atollv1.TunnelFrame{{Session: f.Session, Kind: atollv1.FrameKind_FRAME_KIND_ERROR, Error: "unknown session"}}, now)
			continue
		}
		s.Receive(f, now)
	}
}

// transfer moves a and b's payloads through l in both directions with
// half-closes and returns what each end read.
func transfer(t testing.TB, l *link, cfg Config, toB, toA []byte, maxSteps int) (atB, atA []byte, a, b *Session) {
	a, b = NewSession("s", cfg, t0), NewSession("s", cfg, t0)
	a.Open("t:1")
	now := t0
	buf := make([]byte, 7000)
	var wa, wb int
	for step := 0; step < maxSteps; step++ {
		now = now.Add(10 * time.Millisecond)
		if ok, _ := b.Opened(); ok && b.nextSeq == 1 {
			b.Open("")
		}
		wa += a.Write(toB[wa:], now)
		if wa == len(toB) {
			a.CloseWrite()
		}
		if ok, _ := b.Opened(); ok {
			wb += b.Write(toA[wb:], now)
			if wb == len(toA) {
				b.CloseWrite()
			}
		}
		atA = append(atA, buf[:a.Read(buf)]...)
		atB = append(atB, buf[:b.Read(buf)]...)
		a.Tick(now)
		b.Tick(now)
		l.carry(0, a.Outgoing(now), now)
		l.carry(1, b.Outgoing(now), now)
		qa, qb := l.queue[0], l.queue[1]
		l.queue = [2][]*atollv1.TunnelFrame{}
		deliver(l, 1, b, qa, now)
		deliver(l, 0, a, qb, now)
		if a.Done() && b.Done() {
			// Done is the protocol's end; unread bytes stay readable.
			for n := 1; n > 0; {
				n = a.Read(buf)
				atA = append(atA, buf[:n]...)
			}
			for n := 1; n > 0; {
				n = b.Read(buf)
				atB = append(atB, buf[:n]...)
			}
			return atB, atA, a, b
		}
	}
	t.Fatalf("not done after %d steps: a err %v done %v, b err %v done %v; read %d/%d and %d/%d",
		maxSteps, a.Err(), a.Done(), b.Err(), b.Done(), len(atB), len(toB), len(atA), len(toA))
	return nil, nil, nil, nil
}

func payload(n int, seed uint64) []byte {
	p := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	return p
}

// TestLossyLink: both directions arrive intact through drops,
// duplicates, reordering and a 5 s outage, and both ends finish cleanly.
func TestLossyLink(t *testing.T) {
	cfg := Config{MaxFrame: 1500, Window: InitialWindow, SendBuffer: 8000}.Defaults()
	tests := []struct {
		name string
		l    *link
	}{
		{"clean", &link{}},
		{"drops", &link{drop: 0.2}},
		{"duplicates and reordering", &link{dup: 0.3, reorder: 0.3, marshalled: true}},
		{"everything", &link{drop: 0.1, dup: 0.1, reorder: 0.2}},
		{"5s outage", &link{down: func(now time.Time) bool { d := now.Sub(t0); return d > time.Second && d < 6*time.Second }}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.l.rng = rand.New(rand.NewPCG(uint64(i), 2))
			toB, toA := payload(300_000, 1), payload(200_000, 2)
			atB, atA, a, b := transfer(t, tt.l, cfg, toB, toA, 200_000)
			if !bytes.Equal(atB, toB) || !bytes.Equal(atA, toA) {
				t.Fatalf("corrupted: %d/%d and %d/%d bytes", len(atB), len(toB), len(atA), len(toA))
			}
			if a.Err() != nil || b.Err() != nil {
				t.Fatalf("errors %v %v", a.Err(), b.Err())
			}
			if tt.l.drop > 0 && a.Stats().FramesResent == 0 {
				t.Error("drops without resends")
			}
		})
	}
}

// FuzzSession: any frame sequence (decoded from raw bytes, forged, or a
// correct peer's frames duplicated and out of order) never panics a
// session nor grows its buffers past the window; from a correct peer it
// delivers only a prefix of what was sent.
func FuzzSession(f *testing.F) {
	f.Add([]byte{1, 2, 3}, []byte("hello"))
	f.Add([]byte{0, 0, 9, 200}, []byte{})
	f.Fuzz(func(t *testing.T, script, raw []byte) {
		s := NewSession("s", testConfig(), t0)
		s.Open("t:1")
		// Raw bytes decoded as a frame.
		var rf atollv1.TunnelFrame
		if proto.Unmarshal(raw, &rf) == nil {
			s.Receive(&rf, t0)
		}
		s = NewSession("s", testConfig(), t0)
		want := payload(20_000, 3)
		peer := NewSession("s", testConfig(), t0)
		peer.Open("")
		peer.Write(want[:4000], t0)
		peer.CloseWrite()
		sent := peer.Outgoing(t0)
		now := t0
		var got []byte
		forged := false
		buf := make([]byte, 3000)
		for i, c := range script {
			now = now.Add(time.Duration(c) * time.Millisecond)
			var fr *atollv1.TunnelFrame
			if len(sent) > 0 {
				fr = sent[int(c)%len(sent)]
			}
			switch c % 5 {
			case 0: // a forged frame: it may be valid, so the prefix check no longer holds
				forged = true
				fr = &atollv1.TunnelFrame{Session: "s", Kind: atollv1.FrameKind(c % 7), Sequence: uint64(i % 5), Ack: uint64(c % 3), Limit: uint64(c) * 100, Offset: uint64(c % 4), Payload: script[i:]}
			case 1:
				got = append(got, buf[:s.Read(buf)]...)
				continue
			}
			if fr != nil {
				s.Receive(fr, now)
			}
			s.Tick(now)
			s.Outgoing(now)
			if s.Buffered() > s.cfg.Window || len(s.unacked) > s.cfg.Window/1+2 {
				t.Fatalf("unbounded: %d buffered, %d unacked", s.Buffered(), len(s.unacked))
			}
		}
		got = append(got, buf[:s.Read(buf)]...)
		if !forged && !bytes.HasPrefix(want, got) {
			t.Fatalf("delivered %d bytes that are not a prefix of the stream", len(got))
		}
	})
}

// FuzzLossyTransfer: random loss, duplication and reordering never corrupt
// or lose bytes.
func FuzzLossyTransfer(f *testing.F) {
	f.Add(uint64(1), uint8(10), uint8(10), uint8(10))
	f.Fuzz(func(t *testing.T, seed uint64, drop, dup, reorder uint8) {
		l := &link{rng: rand.New(rand.NewPCG(seed, 3)), drop: float64(drop%50) / 100, dup: float64(dup%50) / 100, reorder: float64(reorder%50) / 100}
		cfg := Config{MaxFrame: 1000, Window: InitialWindow, SendBuffer: 4000}.Defaults()
		toB, toA := payload(20_000, seed), payload(10_000, seed+1)
		atB, atA, _, _ := transfer(t, l, cfg, toB, toA, 1_000_000)
		if !bytes.Equal(atB, toB) || !bytes.Equal(atA, toA) {
			t.Fatal("corrupted")
		}
	})
}

// TestLyingPeerCannotGrowMemory: a peer that grants an enormous limit and
// never acknowledges gets at most Window bytes in flight; the rest waits in
// the bounded send buffer and Write stops taking bytes.
func TestLyingPeerCannotGrowMemory(t *testing.T) {
	cfg := Config{MaxFrame: 16 << 10, Window: InitialWindow, SendBuffer: 64 << 10}.Defaults()
	s := NewSession("s", cfg, t0)
	s.Open("t:1")
	s.Outgoing(t0)
	s.Receive(frame(kOpen, 1, func(f *atollv1.TunnelFrame) { f.Limit = 1 << 40 }), t0)
	now := t0
	var taken int
	for i := 0; i < 100; i++ {
		now = now.Add(time.Millisecond)
		taken += s.Write(make([]byte, 32<<10), now)
		s.Outgoing(now)
	}
	inflight := 0
	for _, in := range s.unacked {
		inflight += len(in.f.Payload)
	}
	if inflight > cfg.Window || s.queue.len() > cfg.SendBuffer {
		t.Fatalf("in flight %d (window %d), queued %d (buffer %d)", inflight, cfg.Window, s.queue.len(), cfg.SendBuffer)
	}
	if taken != cfg.Window+cfg.SendBuffer {
		t.Fatalf("took %d bytes, want window+buffer %d", taken, cfg.Window+cfg.SendBuffer)
	}
}

// TestLastAckLost: b closes first, then a; b acknowledges a's CLOSE with a
// WINDOW frame, which is lost, and b forgets the session. a resends its
// CLOSE: answered with the ERROR a forgotten session gets, a ends
// cleanly; never answered, a ends cleanly at LinkTimeout, for every byte
// both ways was acknowledged — but not while a DATA frame is unacknowledged.
func TestLastAckLost(t *testing.T) {
	cfg := testConfig()
	// pump moves a's and b's frames to each other until neither has any;
	// drop decides which of b's frames to a are lost.
	pump := func(a, b *Session, now time.Time, drop func(*atollv1.TunnelFrame) bool) {
		for range 10 {
			fa, fb := a.Outgoing(now), b.Outgoing(now)
			if len(fa)+len(fb) == 0 {
				return
			}
			for _, f := range fa {
				b.Receive(f, now)
			}
			for _, f := range fb {
				if drop == nil || !drop(f) {
					a.Receive(f, now)
				}
			}
		}
	}
	setup := func(lastData bool) (a, b *Session, now time.Time) {
		a, b = NewSession("s", cfg, t0), NewSession("s", cfg, t0)
		a.Open("t:1")
		now = t0
		pump(a, b, now, nil)
		b.Open("")
		a.Write([]byte("to b"), now)
		b.Write([]byte("to a"), now)
		now = now.Add(cfg.AckDelay)
		pump(a, b, now, nil)
		b.CloseWrite()
		now = now.Add(time.Millisecond)
		pump(a, b, now, nil)
		if b.Done() || b.finSeq == 0 || b.peerAck < b.finSeq {
			t.Fatalf("b done %v before a's CLOSE, or its CLOSE unacknowledged", b.Done())
		}
		if lastData {
			a.Write([]byte("more"), now)
		}
		a.CloseWrite()
		now = now.Add(time.Millisecond)
		pump(a, b, now, func(f *atollv1.TunnelFrame) bool { return f.Kind == kWindow })
		if !b.Done() || b.Err() != nil || !b.Lingers() {
			t.Fatalf("b: done %v, err %v, lingers %v; want done, nil, lingering", b.Done(), b.Err(), b.Lingers())
		}
		if a.Done() {
			t.Fatal("a done without the ack of its CLOSE")
		}
		return a, b, now
	}

	a, b, now := setup(false)
	// a's resend reaches the forgotten b, which answers with an ERROR.
	now = now.Add(cfg.Resend)
	a.Tick(now)
	out := a.Outgoing(now)
	if len(out) == 0 || out[len(out)-1].Kind != kClose {
		t.Fatalf("a resent %v, want its CLOSE", out)
	}
	a.Receive(&atollv1.TunnelFrame{Session: "s", Kind: kError, Error: "unknown session"}, now)
	if !a.Done() || a.Err() != nil || a.Lingers() {
		t.Fatalf("a after the ERROR: done %v err %v lingers %v, want done cleanly without lingering", a.Done(), a.Err(), a.Lingers())
	}
	_ = b

	// Nobody answers: a ends cleanly at LinkTimeout.
	a, _, now = setup(false)
	for end := now.Add(cfg.LinkTimeout); now.Before(end); now = now.Add(100 * time.Millisecond) {
		a.Tick(now)
		a.Outgoing(now)
	}
	a.Tick(now)
	if !a.Done() || a.Err() != nil || a.Stats().FinUnacked != 1 {
		t.Fatalf("a unanswered after LinkTimeout: done %v err %v FinUnacked %d, want done cleanly", a.Done(), a.Err(), a.Stats().FinUnacked)
	}

	// Its last DATA unacknowledged too: the peer may not have it, a fails.
	a, _, now = setup(true)
	for end := now.Add(cfg.LinkTimeout); now.Before(end); now = now.Add(100 * time.Millisecond) {
		a.Tick(now)
		a.Outgoing(now)
	}
	a.Tick(now)
	if !errors.Is(a.Err(), ErrPeerLost) {
		t.Fatalf("a with unacknowledged DATA after LinkTimeout: err %v, want ErrPeerLost", a.Err())
	}
}
