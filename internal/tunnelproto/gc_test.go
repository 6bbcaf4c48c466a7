package tunnelproto

import (
	"runtime/debug"
	"sync/atomic"
	"testing"
	"time"
)

// gcPercent reads the process's GC percent.
func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

// TestGCBoost: streaming raises the GC percent until the heap may grow by
// the headroom beyond the live heap (at most maxPercent, never below the
// percent it found), follows the live heap while streaming goes on, and
// puts the percent back once streaming stops for idle.
func TestGCBoost(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	var live atomic.Uint64
	live.Store(8 << 20)
	g := &gcBoost{headroom: 64 << 20, maxPercent: 400, idle: 100 * time.Millisecond, live: live.Load}
	g.streaming()
	if p := gcPercent(); p != 400 {
		t.Fatalf("GC percent %d with 8 MiB live, want 400 (the most)", p)
	}
	live.Store(32 << 20)
	want := func(p int, what string) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for gcPercent() != p {
			if time.Now().After(deadline) {
				t.Fatalf("GC percent %d %s, want %d", gcPercent(), what, p)
			}
			g.streaming()
			time.Sleep(10 * time.Millisecond)
		}
	}
	want(200, "with 32 MiB live (64 MiB of headroom)")
	live.Store(1 << 30)
	want(100, "with 1 GiB live (never below the percent it found)")
	live.Store(16 << 20)
	want(400, "with 16 MiB live again")
	deadline := time.Now().Add(2 * time.Second)
	for g.on.Load() || gcPercent() != 100 {
		if time.Now().After(deadline) {
			t.Fatalf("GC percent %d after streaming stopped, want 100 back", gcPercent())
		}
		time.Sleep(10 * time.Millisecond)
	}

	debug.SetGCPercent(-1) // the collector off: nothing to raise
	g.streaming()
	time.Sleep(150 * time.Millisecond) // a tick while streaming
	g.streaming()
	if p := gcPercent(); p != -1 {
		t.Fatalf("GC percent %d with the collector off, want -1", p)
	}
	for deadline := time.Now().Add(2 * time.Second); g.on.Load(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("still raised 2 s after streaming stopped")
		}
	}
	if p := gcPercent(); p != -1 {
		t.Fatalf("GC percent %d after streaming with the collector off, want -1", p)
	}
}
