package fxrun

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/fx"
)

type dep struct{}

func quiet() fx.Option { return fx.WithLogger(Logger(slog.New(slog.DiscardHandler))) }

// TestRunErrorsAreOneLine: a failed constructor comes back as its own
// error, not fx's dependency chain; a failed start hook as "start: " and
// its error; a cancelled context stops a started app without error.
func TestRunErrorsAreOneLine(t *testing.T) {
	err := Run(context.Background(), quiet(),
		fx.Provide(func() (*dep, error) { return nil, errors.New("kube: client config: no such file") }),
		fx.Invoke(func(*dep) {}))
	if err == nil || err.Error() != "kube: client config: no such file" {
		t.Fatalf("failed constructor: %v", err)
	}

	err = Run(context.Background(), quiet(), fx.Invoke(func(lc fx.Lifecycle) {
		lc.Append(fx.Hook{OnStart: func(context.Context) error { return errors.New("hub: port in use") }})
	}))
	if err == nil || err.Error() != "start: hub: port in use" {
		t.Fatalf("failed start: %v", err)
	}

	// Told to shut down once started: the stop hooks run, no error.
	stopped := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Run(context.Background(), quiet(), fx.Invoke(func(lc fx.Lifecycle, sd fx.Shutdowner) {
			lc.Append(fx.Hook{
				OnStart: func(context.Context) error { return sd.Shutdown() },
				OnStop:  func(context.Context) error { close(stopped); return nil },
			})
		}))
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("shut down app: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the shutdown")
	}
	select {
	case <-stopped:
	default:
		t.Fatal("the stop hook did not run")
	}

	// Interrupted (Ctrl-C) while starting: a clean stop, not an error.
	ctx, cancel := context.WithCancel(context.Background())
	err = Run(ctx, quiet(), fx.Invoke(func(lc fx.Lifecycle) {
		lc.Append(fx.Hook{OnStart: func(context.Context) error { cancel(); return nil }})
	}))
	if err != nil {
		t.Fatalf("interrupted start: %v", err)
	}
}
