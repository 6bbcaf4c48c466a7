package kubetest

import (
	"context"
	"fmt"
	"time"
)

// PollInterval is how often Eventually retries.
const PollInterval = 100 * time.Millisecond

// Eventually calls check every PollInterval until it returns nil or ctx ends;
// then it returns ctx's error together with check's last error. Use it with
// a context deadline instead of sleeping for a state to arrive.
func Eventually(ctx context.Context, check func(ctx context.Context) error) error {
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w; last: %w", ctx.Err(), err)
		case <-tick.C:
		}
	}
}
