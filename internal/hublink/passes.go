package hublink

import (
	"context"
	"log/slog"
	"time"
)

// Passes is the loop of a publisher that brings what the hub holds in line
// with what it computes, in passes: a pass after each change (coalesced:
// changes that arrive during a pass make one more pass), a resync every
// Resync and at once after the link reconnects (a reconnect may land on a
// hub server that lost messages), and a retry a second after a pass that
// failed.
type Passes struct {
	// Name says what is published, in the logs ("object views").
	Name string
	// Changed wakes the loop for a pass; a send must not block (a
	// channel of capacity one, sent to with select/default).
	Changed <-chan struct{}
	// Resync is the period of the resyncs; OnResync has the next pass
	// compare everything with the stream (forget what is believed
	// published).
	Resync   time.Duration
	OnResync func()
	// Tick and OnTick, when set, add periodic work of the publisher's
	// own, followed by a pass.
	Tick   time.Duration
	OnTick func()
	// Debounce waits this long after a wake-up before the pass, to
	// gather a burst of changes into one pass.
	Debounce time.Duration
	// Pass publishes; an error retries it a second later.
	Pass func(context.Context) error
	// First runs a pass at once, before any change.
	First bool
	Log   *slog.Logger
}

// reconnectCheck is how often RunPasses looks for a reconnect of the link.
const reconnectCheck = 2 * time.Second

// Reconnects is how often the link's connection has reconnected.
func (l *Link) Reconnects() uint64 {
	if nc := l.Conn(); nc != nil {
		return nc.Stats().Reconnects
	}
	return 0
}

// RunPasses runs p until ctx is done.
func (l *Link) RunPasses(ctx context.Context, p Passes) error {
	resync := time.NewTicker(p.Resync)
	defer resync.Stop()
	linkCheck := time.NewTicker(reconnectCheck)
	defer linkCheck.Stop()
	var tick <-chan time.Time
	if p.Tick > 0 && p.OnTick != nil {
		t := time.NewTicker(p.Tick)
		defer t.Stop()
		tick = t.C
	}
	retry := make(chan struct{}, 1)
	reconnects := l.Reconnects()
	first := p.First
	for {
		if !first {
			select {
			case <-ctx.Done():
				return nil
			case <-p.Changed:
			case <-retry:
			case <-tick:
				p.OnTick()
			case <-resync.C:
				p.OnResync()
			case <-linkCheck.C:
				n := l.Reconnects()
				if n == reconnects {
					continue
				}
				reconnects = n
				p.Log.Info("hub link reconnected; comparing with the stream", "what", p.Name)
				p.OnResync()
			}
			if p.Debounce > 0 {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(p.Debounce):
				}
			}
		}
		first = false
		if err := p.Pass(ctx); err != nil && ctx.Err() == nil {
			p.Log.Warn("pass incomplete; retrying in a second", "what", p.Name, "err", err)
			time.AfterFunc(time.Second, func() {
				select {
				case retry <- struct{}{}:
				default:
				}
			})
		}
	}
}
