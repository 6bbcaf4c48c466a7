package objects

import (
	"fmt"
	"time"

	"github.com/atoll-edge/atoll/cloud/units"
)

// Config tunes the object views publisher.
type Config struct {
	// Enabled runs the publisher (with the kubernetes membership source).
	Enabled bool
	// Units says which unit each Node is in.
	Units units.Rule
	// Debounce coalesces bursts of changes into one pass.
	Debounce time.Duration
	// Resync is how often every object view is compared with the stream.
	Resync time.Duration
	// MaxObjectBytes bounds one encoded view; a larger one is rejected
	// (counted, logged) and the others are published.
	MaxObjectBytes int
}

// DefaultConfig suits production.
func DefaultConfig() Config {
	return Config{
		Enabled:        true,
		Units:          units.DefaultRule(),
		Debounce:       100 * time.Millisecond,
		Resync:         5 * time.Minute,
		MaxObjectBytes: 512 << 10,
	}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	if err := c.Units.Validate(); err != nil {
		return fmt.Errorf("objects: %w", err)
	}
	switch {
	case c.Debounce < 0:
		return fmt.Errorf("objects: Debounce %v is negative", c.Debounce)
	case c.Resync <= 0:
		return fmt.Errorf("objects: Resync %v must be positive", c.Resync)
	case c.MaxObjectBytes <= 0 || c.MaxObjectBytes > 1<<20:
		return fmt.Errorf("objects: MaxObjectBytes %d must be in (0, 1 MiB]", c.MaxObjectBytes)
	}
	return nil
}
