package membership

import (
	"errors"
	"time"
)

// Config tunes membership.
type Config struct {
	// StateDir keeps the last assignment and unit view (empty: nothing is
	// kept and a restart waits for the cloud).
	StateDir string
	// CheckPeriod is how often the agent compares the assignment and unit
	// view it holds with the last values the VIEWS stream stores on their
	// subjects, and catches up when it is behind. It also checks within
	// 250 ms of every reconnect of its leaf link, which is when
	// deliveries get lost; a follower that is recreated starts again from
	// the last value of each subject. The timer is the backstop for a
	// follower that stalls on the hub while its heartbeats still flow.
	CheckPeriod time.Duration
}

// DefaultCheckPeriod is 5 minutes: the two direct gets of a check are
// paid by every agent at the hub, so a short period is traffic that grows
// with time (at 2 s, 1 request per second per node: 10,000 a second at
// the hub for 10,000 nodes, and most of an agent's messages to the hub).
const DefaultCheckPeriod = 5 * time.Minute

// DefaultConfig checks every DefaultCheckPeriod.
func DefaultConfig() Config { return Config{CheckPeriod: DefaultCheckPeriod} }

// Validate names the first bad field.
func (c Config) Validate() error {
	if c.CheckPeriod <= 0 {
		return errors.New("membership: check period must be positive")
	}
	return nil
}
