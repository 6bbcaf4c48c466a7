package fxrun

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
)

// TestRestartsAFailedLoop: a loop that fails while the app runs is started
// again; the app stops it cleanly.
func TestRestartsAFailedLoop(t *testing.T) {
	FirstBackoff = 10 * time.Millisecond
	var runs atomic.Int32
	stopped := make(chan struct{})
	app := fxtest.New(t, fx.Invoke(func(lc fx.Lifecycle) {
		Background(lc, slog.New(slog.DiscardHandler), "flaky", func(ctx context.Context) error {
			if runs.Add(1) < 3 {
				return errors.New("hub unreachable")
			}
			<-ctx.Done()
			close(stopped)
			return nil
		})
	}))
	app.RequireStart()
	deadline := time.Now().Add(5 * time.Second)
	for runs.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("loop ran %d times, want 3", runs.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	app.RequireStop()
	select {
	case <-stopped:
	default:
		t.Fatal("the third run did not see the app stop")
	}
}
