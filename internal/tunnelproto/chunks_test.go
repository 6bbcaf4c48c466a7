package tunnelproto

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// TestChunks: random pushes, takes and reads return the bytes pushed, in
// order, and a taken slice is never overwritten by later pushes.
func TestChunks(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	var q chunks
	var want, got []byte
	var taken [][]byte
	var takenWant [][]byte
	next := byte(0)
	for i := 0; i < 20000; i++ {
		switch rng.IntN(4) {
		case 0, 1:
			p := make([]byte, rng.IntN(3000))
			for j := range p {
				p[j] = next
				next++
			}
			want = append(want, p...)
			if rng.IntN(2) == 0 {
				q.push(p, rng.IntN(4096))
			} else {
				q.pushOwned(bytes.Clone(p))
			}
		case 2:
			p, _ := q.take(rng.IntN(5000))
			got = append(got, p...)
			taken = append(taken, p)
			takenWant = append(takenWant, bytes.Clone(p))
		case 3:
			p := make([]byte, rng.IntN(5000))
			got = append(got, p[:q.read(p)]...)
		}
		if q.len() != len(want)-len(got) {
			t.Fatalf("step %d: len %d, want %d", i, q.len(), len(want)-len(got))
		}
	}
	p := make([]byte, q.len())
	got = append(got, p[:q.read(p)]...)
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes, want %d, not equal", len(got), len(want))
	}
	for i := range taken {
		if !bytes.Equal(taken[i], takenWant[i]) {
			t.Fatalf("taken slice %d was overwritten", i)
		}
	}
}

// TestCumulativeAck: OPEN and DATA are acknowledged once AckDelay passed
// or Window/8 bytes wait, in one WINDOW frame covering every frame before
// or on the next frame sent; CLOSE at once.
func TestCumulativeAck(t *testing.T) {
	cfg := Config{Window: 1 << 20, AckDelay: 5 * time.Millisecond}.Defaults()
	s := NewSession("s", cfg, t0)
	// An OPEN's ack is held too: the answering OPEN carries it.
	s.Receive(frame(kOpen, 1), t0)
	if out := s.Outgoing(t0); len(out) != 0 {
		t.Fatalf("OPEN acknowledged before AckDelay: %v", out)
	}
	s.Open("")
	if out := s.Outgoing(t0.Add(time.Millisecond)); len(out) != 1 || out[0].Kind != kOpen || out[0].Ack != 1 {
		t.Fatalf("answering OPEN: %v, want one OPEN acking 1", out)
	}
	// Unanswered, it is acknowledged after AckDelay.
	u := NewSession("s", cfg, t0)
	u.Receive(frame(kOpen, 1), t0)
	if d := u.Deadline(); !d.Equal(t0.Add(cfg.AckDelay)) {
		t.Fatalf("deadline %v, want the ack delay %v", d, t0.Add(cfg.AckDelay))
	}
	if out := u.Outgoing(t0.Add(cfg.AckDelay)); len(out) != 1 || out[0].Kind != kWindow || out[0].Ack != 1 {
		t.Fatalf("unanswered OPEN after AckDelay: %v, want one WINDOW acking 1", out)
	}
	small := strings.Repeat("x", 1000)
	off := uint64(0)
	for seq := uint64(2); seq <= 4; seq++ {
		s.Receive(frame(kData, seq, data(off, small)), t0)
		off += uint64(len(small))
	}
	if out := s.Outgoing(t0.Add(4 * time.Millisecond)); len(out) != 0 {
		t.Fatalf("acknowledged before AckDelay: %v", out)
	}
	if d := s.Deadline(); !d.Equal(t0.Add(cfg.AckDelay)) {
		t.Fatalf("deadline %v, want the ack delay %v", d, t0.Add(cfg.AckDelay))
	}
	if out := s.Outgoing(t0.Add(cfg.AckDelay)); len(out) != 1 || out[0].Kind != kWindow || out[0].Ack != 4 {
		t.Fatalf("after AckDelay: %v, want one WINDOW acking 4", out)
	}
	// Window/8 bytes: acknowledged at once.
	big := strings.Repeat("y", cfg.Window/8)
	s.Receive(frame(kData, 5, data(off, big)), t0.Add(10*time.Millisecond))
	if out := s.Outgoing(t0.Add(10 * time.Millisecond)); len(out) != 1 || out[0].Ack != 5 {
		t.Fatalf("Window/8 bytes not acknowledged at once: %v", out)
	}
	// CLOSE: at once.
	s.Receive(frame(atollv1.FrameKind_FRAME_KIND_CLOSE, 6), t0.Add(11*time.Millisecond))
	if out := s.Outgoing(t0.Add(11 * time.Millisecond)); len(out) != 1 || out[0].Ack != 6 {
		t.Fatalf("CLOSE not acknowledged at once: %v", out)
	}
}

// TestFrameBufRefs: a lent read buffer is referenced by the queue and by
// every frame cut from it, and is free only once all of them are
// acknowledged — also when the window cuts it into several frames.
func TestFrameBufRefs(t *testing.T) {
	const size = 40 << 10
	cfg := Config{MaxFrame: 60 << 10, Window: InitialWindow, SendBuffer: 128 << 10}.Defaults()
	s := NewSession("s", cfg, t0)
	s.Open("t:1")
	s.Outgoing(t0)
	s.Receive(frame(kOpen, 1, func(f *atollv1.TunnelFrame) { f.Ack = 1 }), t0)
	fb, fb2 := &frameBuf{b: make([]byte, size)}, &frameBuf{b: make([]byte, size)}
	if !s.writeBuf(fb, 0, size, t0) || !s.writeBuf(fb2, 0, size, t0) {
		t.Fatal("writeBuf refused")
	}
	// Our window (64 KiB in flight) lets 40 + 24 KiB out: fb2 is cut.
	out := s.Outgoing(t0)
	if len(out) != 2 || len(out[0].Payload) != size || len(out[1].Payload) != InitialWindow-size {
		t.Fatalf("%d frames, want 40 and 24 KiB", len(out))
	}
	if fb.refs != 1 || fb2.refs != 2 {
		t.Fatalf("refs %d and %d, want 1 (its frame) and 2 (a frame and the queue)", fb.refs, fb2.refs)
	}
	ack := func(seq uint64) {
		s.Receive(&atollv1.TunnelFrame{Session: "s", Kind: kWindow, Ack: seq, Limit: 1 << 20}, t0)
	}
	ack(out[0].Sequence)
	if fb.refs != 0 || fb2.refs != 2 {
		t.Fatalf("after the first ack: refs %d and %d, want 0 and 2", fb.refs, fb2.refs)
	}
	rest := s.Outgoing(t0)
	if len(rest) != 1 || len(rest[0].Payload) != 2*size-InitialWindow || fb2.refs != 2 {
		t.Fatalf("%d frames, fb2 refs %d: want the last 16 KiB, 2 refs (two frames)", len(rest), fb2.refs)
	}
	ack(out[1].Sequence)
	if fb2.refs != 1 {
		t.Fatalf("fb2 refs %d with one frame unacknowledged, want 1", fb2.refs)
	}
	ack(rest[0].Sequence)
	if fb2.refs != 0 {
		t.Fatalf("fb2 refs %d once every frame is acknowledged, want 0", fb2.refs)
	}
}

// TestPushRangeGrows: reads that follow each other in one lent buffer
// (a TLS source's records) make one chunk, also after the front of it
// left in a frame; a read elsewhere makes a chunk of its own. Each chunk
// holds one reference to the buffer.
func TestPushRangeGrows(t *testing.T) {
	fb := &frameBuf{b: make([]byte, 60<<10)}
	for i := range fb.b {
		fb.b[i] = byte(i)
	}
	var q chunks
	q.pushRange(fb, 0, 16<<10)
	q.pushRange(fb, 16<<10, 32<<10)
	if len(q.bufs) != 1 || q.len() != 32<<10 || fb.refs != 1 {
		t.Fatalf("%d chunks, %d bytes, %d refs: want one chunk of 32 KiB, 1 ref", len(q.bufs), q.len(), fb.refs)
	}
	p, own := q.take(10 << 10)
	if own != fb || len(p) != 10<<10 || fb.refs != 2 {
		t.Fatalf("took %d bytes, refs %d: want 10 KiB and 2 refs (the chunk and the frame)", len(p), fb.refs)
	}
	q.pushRange(fb, 32<<10, 48<<10)
	if len(q.bufs) != 1 || q.len() != 38<<10 {
		t.Fatalf("%d chunks of %d bytes: want the rest grown to 38 KiB", len(q.bufs), q.len())
	}
	p, _ = q.take(60 << 10)
	if len(p) != 38<<10 || p[0] != fb.b[10<<10] || p[len(p)-1] != fb.b[48<<10-1] || cap(p) != len(p) {
		t.Fatalf("took %d bytes (cap %d), want fb.b[10K:48K] capped", len(p), cap(p))
	}
	fb.unref() // the first frame acknowledged
	q.pushRange(fb, 50<<10, 52<<10)
	other := &frameBuf{b: make([]byte, 60<<10)}
	q.pushRange(other, 52<<10, 54<<10)
	if len(q.bufs) != 2 || fb.refs != 2 || other.refs != 1 {
		t.Fatalf("%d chunks, refs %d and %d: want two chunks, refs 2 (a frame and a chunk) and 1", len(q.bufs), fb.refs, other.refs)
	}
}
