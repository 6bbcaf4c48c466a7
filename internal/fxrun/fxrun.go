// Package fxrun runs a component's long-lived loop with an fx app: the loop
// starts when the app starts (the start hook never blocks), is restarted
// with backoff if it fails while the app runs, and is cancelled and waited
// for when the app stops.
package fxrun

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"go.uber.org/fx"
)

// Backoff bounds the wait before a failed loop is restarted.
var (
	FirstBackoff = time.Second
	MaxBackoff   = 30 * time.Second
)

// Background runs run(ctx) in a goroutine from app start until app stop.
// When run returns an error while the app is still running, the error is
// logged under name and run starts again after a backoff (1 s doubling to
// 30 s): a component whose hub or cluster was briefly unreachable comes
// back by itself instead of staying dead in a live process. A nil return
// ends the loop.
func Background(lc fx.Lifecycle, log *slog.Logger, name string, run func(ctx context.Context) error) {
	var (
		cancel context.CancelFunc
		wg     sync.WaitGroup
	)
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			ctx, c := context.WithCancel(context.Background())
			cancel = c
			wg.Add(1)
			go func() {
				defer wg.Done()
				supervise(ctx, log, name, run)
			}()
			return nil
		},
		OnStop: func(ctx context.Context) error {
			cancel()
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	})
}

func supervise(ctx context.Context, log *slog.Logger, name string, run func(ctx context.Context) error) {
	wait := FirstBackoff
	for {
		err := run(ctx)
		if err == nil || ctx.Err() != nil {
			return
		}
		log.Error("component failed; restarting", "component", name, "in", wait, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, MaxBackoff)
	}
}
