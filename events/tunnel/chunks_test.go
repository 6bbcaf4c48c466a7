package tunnel

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
			p := q.take(rng.IntN(5000))
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
