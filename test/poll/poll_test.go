package poll

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestPermanentEndsAtOnce: a check's Permanent error ends Until with that
// error, long before its deadline; other errors are retried.
func TestPermanentEndsAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	gone := errors.New("kubelet exited")
	calls := 0
	err := Until(ctx, func(context.Context) error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return Permanent(gone)
	})
	if !errors.Is(err, gone) || calls != 3 || ctx.Err() != nil {
		t.Fatalf("Until = %v after %d calls (ctx %v), want %v after 3", err, calls, ctx.Err(), gone)
	}
}
