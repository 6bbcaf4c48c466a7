// Package poll is the one way tests and harnesses wait for a state: poll a
// check with a deadline, never sleep for a state to arrive.
package poll

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// Interval is how often Until and Eventually retry a check.
const Interval = 50 * time.Millisecond

// Until calls check every Interval until it returns nil or ctx ends; then it
// returns ctx's error together with check's last error. A check that
// returns Permanent(err) ends it at once with err: the state can no
// longer come.
func Until(ctx context.Context, check func(ctx context.Context) error) error {
	tick := time.NewTicker(Interval)
	defer tick.Stop()
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		if p, ok := errors.AsType[permanent](err); ok {
			return p.err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w; last: %w", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// Eventually fails t unless check returns nil within timeout; the failure
// names check's last error.
func Eventually(t testing.TB, timeout time.Duration, check func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := Until(ctx, func(context.Context) error { return check() }); err != nil {
		t.Fatalf("condition not met within %v: %v", timeout, err)
	}
}

// Errorf is fmt.Errorf, for the checks passed to Eventually.
var Errorf = fmt.Errorf

// Permanent marks a check's error as final: Until returns err at once.
func Permanent(err error) error { return permanent{err} }

type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }
