// Package fxrun runs a component's long-lived loop with an fx app: the loop
// starts when the app starts (the start hook never blocks) and is cancelled
// and waited for when the app stops.
package fxrun

import (
	"context"
	"log/slog"
	"sync"

	"go.uber.org/fx"
)

// Background runs run(ctx) in a goroutine from app start until app stop.
// An error returned while the app is still running is logged under name.
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
				if err := run(ctx); err != nil && ctx.Err() == nil {
					log.Error("component stopped", "component", name, "err", err)
				}
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
