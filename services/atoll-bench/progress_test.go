package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestProgress: a phase prints a line when it starts and when it ends,
// and in between at most one line every 10 s, with the time elapsed and
// the time left (from the count's rate, or the phase's length).
func TestProgress(t *testing.T) {
	var out bytes.Buffer
	clock := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	p := &progress{w: &out, now: func() time.Time { return clock }}

	p.begin("scale 5000: registering nodes")
	for i := 1; i <= 10; i++ { // a batch of 500 every 4 s
		clock = clock.Add(4 * time.Second)
		p.count(i*500, 5000, "registered")
	}
	p.end()
	p.begin("scale 5000: warm-up")
	for range 25 {
		clock = clock.Add(time.Second)
		p.timed(2 * time.Minute)
	}
	p.end()
	var nilProgress *progress
	nilProgress.begin("nothing")
	nilProgress.count(1, 2, "x")
	nilProgress.timed(time.Second)
	nilProgress.end()

	want := `scale 5000: registering nodes ...
scale 5000: registering nodes: 1500/5000 registered, 12s elapsed, ~28s left
scale 5000: registering nodes: 3000/5000 registered, 24s elapsed, ~16s left
scale 5000: registering nodes: 4500/5000 registered, 36s elapsed, ~4s left
scale 5000: registering nodes: done in 40s
scale 5000: warm-up ...
scale 5000: warm-up: 10s of 2m0s elapsed, 1m50s left
scale 5000: warm-up: 20s of 2m0s elapsed, 1m40s left
scale 5000: warm-up: done in 25s
`
	if out.String() != want {
		t.Fatalf("printed:\n%s\nwant:\n%s", out.String(), want)
	}
}

// TestProgressWait: wait returns after its length with a start and an
// end line, and at once with the context's error when cancelled.
func TestProgressWait(t *testing.T) {
	var out bytes.Buffer
	p := newProgress(&out)
	if err := p.wait(context.Background(), "window", 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); !strings.HasPrefix(got, "window ...\nwindow: done in ") || strings.Count(got, "\n") != 2 {
		t.Fatalf("printed %q", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.wait(ctx, "cancelled", time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
}
