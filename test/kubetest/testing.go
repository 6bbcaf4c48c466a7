package kubetest

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

// logTailLines is how much of each component log a failed test prints.
const logTailLines = 60

// Start starts a cluster for t with its data in t.TempDir() and stops it in
// t.Cleanup. Missing binaries fail the test with the command that builds them.
// When the test has failed by cleanup time, the tail of each component log is
// written to the test log.
func Start(t testing.TB, opts ...Option) *Cluster {
	t.Helper()
	var cfg Config
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir() // registered first, so removed after Stop
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{
			ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			},
		}))
	}
	ctx := t.Context()
	if d, ok := deadline(t); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d)
		defer cancel()
	}
	c, err := StartCluster(ctx, cfg)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubetest: component logs in %s\n%s", c.Dir(), c.LogTails(logTailLines))
		}
		if err := c.Stop(); err != nil {
			t.Errorf("kubetest: stop: %v", err)
		}
	})
	return c
}

// deadline returns the test binary's deadline, if t has one.
func deadline(t testing.TB) (time.Time, bool) {
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		return d.Deadline()
	}
	return time.Time{}, false
}
