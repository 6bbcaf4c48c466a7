package natslog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestViolationsRateLimited: every violation the server reports is
// counted, the first violationBurst of a minute are logged and the rest
// are summed up in one line when the minute ends.
func TestViolationsRateLimited(t *testing.T) {
	var buf bytes.Buffer
	l := New(slog.New(slog.NewTextHandler(&buf, nil)), "hub-0")
	const n = violationBurst + 5
	for range n {
		l.Errorf("%s - Publish Violation - Subject %q", "127.0.0.1:4222 - lid:7", "atoll.topo.node.b")
	}
	l.Errorf("an error that is no violation")
	if got := l.Violations(); got != n {
		t.Errorf("Violations() = %d, want %d", got, n)
	}
	if got := strings.Count(buf.String(), "Publish Violation"); got != violationBurst {
		t.Errorf("%d violation lines logged, want %d", got, violationBurst)
	}
	if !strings.Contains(buf.String(), "no violation") {
		t.Error("an error that is no violation was not logged")
	}
	l.flushUnlogged() // as the window's timer does
	if !strings.Contains(buf.String(), "unlogged=5") {
		t.Errorf("no summary of the 5 lines left out:\n%s", buf.String())
	}
}
