package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/atoll-edge/atoll/events"
)

// catchup tracks whether the vote follower has delivered the HEALTH
// stream's last vote as it was when the service started: before that, the
// tracker may lack votes that the stream holds, and the webhook would
// answer from a partial state.
type catchup struct {
	mu     sync.Mutex
	known  bool   // target read from the stream
	target uint64 // last vote sequence at start (0: no vote stored)
	last   uint64 // highest sequence the follower delivered
	err    error  // last failure to read the target
}

// run reads the target, retrying until it succeeds or ctx ends.
func (c *catchup) run(ctx context.Context, js jetstream.JetStream, log *slog.Logger) {
	for attempt := uint64(1); ; attempt++ {
		seq, err := lastVoteSequence(ctx, js)
		c.mu.Lock()
		c.err = err
		if err == nil {
			c.known, c.target = true, seq
		}
		c.mu.Unlock()
		if err == nil {
			log.Info("vote stream head read", "seq", seq)
			return
		}
		wait := min(events.DefaultBackoff(attempt), 5*time.Second)
		log.Debug("cannot read the vote stream head; retrying", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// lastVoteSequence is the stream sequence of the newest stored vote, 0
// when the stream holds none.
func lastVoteSequence(ctx context.Context, js jetstream.JetStream) (uint64, error) {
	stream, err := js.Stream(ctx, events.StreamHealth)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", events.StreamHealth, err)
	}
	msg, err := stream.GetLastMsgForSubject(ctx, events.VoteSubjects)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("last vote in %s: %w", events.StreamHealth, err)
	}
	return msg.Sequence, nil
}

// seen records a delivered sequence.
func (c *catchup) seen(seq uint64) {
	c.mu.Lock()
	c.last = max(c.last, seq)
	c.mu.Unlock()
}

func (c *catchup) ready() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !c.known && c.err != nil:
		return fmt.Errorf("vote stream head unknown: %w", c.err)
	case !c.known:
		return errors.New("vote stream head not read yet")
	case c.last < c.target:
		return fmt.Errorf("following votes: at sequence %d of %d", c.last, c.target)
	}
	return nil
}
