// Package memlimit tells the Go runtime the memory limit of the container
// a service runs in, so that the garbage collector works harder as the
// heap nears it instead of the kernel killing the process: the embedded
// hub's memory grows with the leaf links it holds, and Go's default
// collector lets the heap reach twice its live size before collecting.
//
// The soft limit (GOMEMLIMIT) is 90 % of the cgroup's memory limit, v1 or
// v2, read again each minute (a pod's limit can be resized in place).
// GOMEMLIMIT set in the environment wins; AUTOMEMLIMIT=off leaves the
// runtime's default, AUTOMEMLIMIT=0.8 another fraction. Without a limit
// (a bare host, a pod without limits.memory) nothing changes.
package memlimit

import (
	"context"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// Ratio is the fraction of the container's memory limit the collector
// aims under: the rest is what Go does not count in its heap (goroutine
// stacks, TLS buffers outside it) and room for a burst.
const Ratio = 0.9

// refresh is how often the limit is read again.
const refresh = time.Minute

// FromContainer sets the runtime's soft memory limit from the cgroup
// until ctx is done, logs what it set, and returns it (0: none).
func FromContainer(ctx context.Context, log *slog.Logger) int64 {
	log = log.With("component", "memlimit")
	if v, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		log.Info("the collector aims under GOMEMLIMIT from the environment", "gomemlimit", v)
		return debug.SetMemoryLimit(-1)
	}
	limit, err := memlimit.Set(
		memlimit.WithRatio(Ratio),
		memlimit.WithProvider(memlimit.FromCgroup),
		memlimit.WithRefreshInterval(ctx, refresh),
		memlimit.WithLogger(slog.New(quiet{log.Handler()})),
	)
	switch {
	case err != nil:
		log.Warn("GOMEMLIMIT not set from the container's memory limit (AUTOMEMLIMIT invalid, or the cgroup unreadable); the collector keeps Go's default", "err", err)
		return 0
	case limit == math.MaxInt64:
		log.Debug("no memory limit")
		return 0
	}
	log.Info("the collector aims under the container's memory limit", "gomemlimit_mib", limit>>20)
	return limit
}

// quiet turns the library's own lines into debug ones: FromContainer
// says what happened in one line.
type quiet struct{ slog.Handler }

func (q quiet) Handle(ctx context.Context, r slog.Record) error {
	r.Level = slog.LevelDebug
	if !q.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return q.Handler.Handle(ctx, r)
}

func (q quiet) WithAttrs(a []slog.Attr) slog.Handler { return quiet{q.Handler.WithAttrs(a)} }
func (q quiet) WithGroup(n string) slog.Handler      { return quiet{q.Handler.WithGroup(n)} }
