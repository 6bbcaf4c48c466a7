// Package natslog adapts log/slog to the embedded nats-server's logger, so
// the servers Atoll embeds log through the service's structured logger.
package natslog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Logger implements nats-server's server.Logger on top of slog. Server
// notices are logged at Info, traces at Debug-4 (visible only when asked).
type Logger struct {
	log        *slog.Logger
	fatal      atomic.Pointer[string]
	violations atomic.Int64

	// Violation lines are logged at most violationBurst per
	// violationWindow: a tampered client or leaf can try again in a
	// loop. The rest are counted, and summed up in one line when their
	// window ends.
	mu       sync.Mutex
	window   time.Time
	logged   int
	unlogged int
}

const (
	violationWindow = time.Minute
	violationBurst  = 20
)

// New returns a nats-server logger writing to log with the given server name.
func New(log *slog.Logger, server string) *Logger {
	return &Logger{log: log.With("nats_server", server)}
}

const levelTrace = slog.LevelDebug - 4

func (l *Logger) emit(level slog.Level, format string, v []any) {
	if !l.log.Enabled(context.Background(), level) {
		return
	}
	l.log.Log(context.Background(), level, fmt.Sprintf(format, v...))
}

// Noticef logs a server notice.
func (l *Logger) Noticef(format string, v ...any) { l.emit(slog.LevelInfo, format, v) }

// Warnf logs a server warning.
func (l *Logger) Warnf(format string, v ...any) { l.emit(slog.LevelWarn, format, v) }

// Fatalf logs a fatal server error. The embedded server does not exit the
// process; Atoll's lifecycle notices the server stopping.
func (l *Logger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.fatal.CompareAndSwap(nil, &msg)
	l.log.Error(msg)
}

// Fatal returns the first fatal error the server reported (a listener
// that could not bind its port, ...), or nil. natsembed.Start fails with
// it instead of waiting for a server that will never be ready.
func (l *Logger) Fatal() error {
	if msg := l.fatal.Load(); msg != nil {
		return errors.New(*msg)
	}
	return nil
}

// Errorf logs a server error.
func (l *Logger) Errorf(format string, v ...any) {
	if strings.Contains(format, "Violation") {
		l.violations.Add(1)
		if !l.logViolation() {
			return
		}
	}
	l.emit(slog.LevelError, format, v)
}

// logViolation reports whether a violation line may be logged now. The
// lines left out are summed up in one line at the end of their window.
func (l *Logger) logViolation() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if now.Sub(l.window) >= violationWindow {
		l.window, l.logged = now, 0
	}
	if l.logged < violationBurst {
		l.logged++
		return true
	}
	if l.unlogged == 0 {
		time.AfterFunc(l.window.Add(violationWindow).Sub(now), l.flushUnlogged)
	}
	l.unlogged++
	return false
}

// flushUnlogged logs how many violation lines were left out.
func (l *Logger) flushUnlogged() {
	l.mu.Lock()
	n := l.unlogged
	l.unlogged = 0
	l.mu.Unlock()
	if n > 0 {
		l.log.Error("permission violations not logged, over the limit per minute (the violations counter has them all)",
			"unlogged", n, "limit", violationBurst)
	}
}

// Violations counts the permission violations the server reported: a
// connection that published or subscribed beyond its permissions (the
// server refused it, and closed a leaf connection that did).
func (l *Logger) Violations() int64 { return l.violations.Load() }

// Debugf logs server debug output.
func (l *Logger) Debugf(format string, v ...any) { l.emit(slog.LevelDebug, format, v) }

// Tracef logs protocol traces.
func (l *Logger) Tracef(format string, v ...any) { l.emit(levelTrace, format, v) }
