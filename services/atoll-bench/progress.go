package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"
)

// progressEvery is the least time between two progress lines of a phase.
const progressEvery = 10 * time.Second

// progress prints where a long phase is (registering nodes, warm-up,
// measurement window, waiting for a state) to stderr, so that the
// tables on stdout stay as they are: a line when the phase starts, then
// at most one every progressEvery with the time elapsed and, when the
// phase's length or count is known, the time left, and a line when it
// ends. A nil *progress prints nothing.
type progress struct {
	w   io.Writer
	now func() time.Time

	mu           sync.Mutex
	phase        string
	start, shown time.Time
}

func newProgress(w io.Writer) *progress { return &progress{w: w, now: time.Now} }

// begin starts phase (one line).
func (p *progress) begin(phase string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.phase, p.start = phase, p.now()
	p.shown = p.start
	fmt.Fprintf(p.w, "%s ...\n", phase)
}

// count reports done of total items (total 0: unknown), at most every
// progressEvery; the time left is extrapolated from the rate so far.
func (p *progress) count(done, total int, what string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if now.Sub(p.shown) < progressEvery {
		return
	}
	p.shown = now
	elapsed := now.Sub(p.start)
	line := fmt.Sprintf("%s: %d", p.phase, done)
	if total > 0 {
		line += fmt.Sprintf("/%d", total)
	}
	line += " " + what + ", " + round(elapsed) + " elapsed"
	if total > 0 && done > 0 && done < total {
		line += ", ~" + round(time.Duration(float64(elapsed)*float64(total-done)/float64(done))) + " left"
	}
	fmt.Fprintln(p.w, line)
}

// timed reports a phase of known length, at most every progressEvery.
func (p *progress) timed(length time.Duration) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if now.Sub(p.shown) < progressEvery {
		return
	}
	p.shown = now
	elapsed := now.Sub(p.start)
	fmt.Fprintf(p.w, "%s: %s of %s elapsed, %s left\n", p.phase, round(elapsed), round(length), round(max(length-elapsed, 0)))
}

// end finishes the phase (one line with its time).
func (p *progress) end() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "%s: done in %s\n", p.phase, round(p.now().Sub(p.start)))
}

// wait is a phase of length d (a warm-up, a measurement window): it
// returns after d, or with ctx's error, reporting on the way.
func (p *progress) wait(ctx context.Context, phase string, d time.Duration) error {
	p.begin(phase)
	timer := time.NewTimer(d)
	defer timer.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			p.end()
			return nil
		case <-tick.C:
			p.timed(d)
		}
	}
}

func round(d time.Duration) string { return d.Round(time.Second).String() }
