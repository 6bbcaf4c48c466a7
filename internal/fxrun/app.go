package fxrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"go.uber.org/dig"
	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"
)

// Logger is the fx event logger of Atoll's services: fx's own events,
// its error reports included, go to log at debug level. A service reports
// its failed start itself, in one line, through Run; by default nobody
// sees fx's dependency graph.
func Logger(log *slog.Logger) func() fxevent.Logger {
	return func() fxevent.Logger {
		l := &fxevent.SlogLogger{Logger: log.With("component", "fx")}
		l.UseLogLevel(slog.LevelDebug)
		l.UseErrorLevel(slog.LevelDebug)
		return l
	}
}

// Run builds the fx app of opts, starts it, waits until ctx is done or
// the app is told to shut down (SIGINT, SIGTERM, fx.Shutdowner), and stops
// it. A start interrupted by ctx is a clean stop. Its errors are one line each: for a graph that cannot be built, the
// constructor's own error (not fx's dependency chain); for a failed start,
// the start hook's error.
func Run(ctx context.Context, opts ...fx.Option) error {
	app := fx.New(opts...)
	if err := app.Err(); err != nil {
		return RootCause(err)
	}
	startCtx, cancel := context.WithTimeout(ctx, app.StartTimeout())
	defer cancel()
	if err := app.Start(startCtx); err != nil {
		if ctx.Err() != nil {
			return nil // interrupted while starting: fx stopped what had started
		}
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("start did not finish within %v: %w", app.StartTimeout(), RootCause(err))
		} else {
			err = fmt.Errorf("start: %w", RootCause(err))
		}
		return err // fx has already stopped what had started
	}
	var sig fx.ShutdownSignal
	select {
	case <-ctx.Done():
	case sig = <-app.Wait():
	}
	stopCtx, cancelStop := context.WithTimeout(context.Background(), app.StopTimeout())
	defer cancelStop()
	if err := app.Stop(stopCtx); err != nil {
		return fmt.Errorf("stop: %w", RootCause(err))
	}
	if sig.ExitCode != 0 {
		return fmt.Errorf("shut down with exit code %d", sig.ExitCode)
	}
	return nil
}

// RootCause strips fx's and dig's dependency chain from err ("could not
// build arguments for function ...: failed to build ...: received non-nil
// error from function ...") down to the error a constructor or hook
// returned.
func RootCause(err error) error {
	if err == nil {
		return nil
	}
	return dig.RootCause(err)
}
