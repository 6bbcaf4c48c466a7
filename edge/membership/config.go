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
	// subjects, and catches up when it is behind. It also checks after
	// every reconnect of its leaf link. At most the probe period, so an
	// agent that missed a view catches up within two probe rounds.
	CheckPeriod time.Duration
}

// DefaultConfig checks every 2 s (the default probe period).
func DefaultConfig() Config { return Config{CheckPeriod: 2 * time.Second} }

// Validate names the first bad field.
func (c Config) Validate() error {
	if c.CheckPeriod <= 0 {
		return errors.New("membership: check period must be positive")
	}
	return nil
}
