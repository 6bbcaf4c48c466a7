package objects

import (
	"errors"
	"fmt"
	"time"

	"github.com/atoll-edge/atoll/internal/wellknown"
)

// Config tunes the object views publisher.
type Config struct {
	// Enabled runs the publisher (with the kubernetes membership source).
	Enabled bool
	// UnitLabel is the Node label whose value names the node's unit.
	UnitLabel string
	// ExcludeLabels: nodes carrying any of these labels are in no unit.
	ExcludeLabels []string
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
		UnitLabel:      wellknown.LabelUnit,
		ExcludeLabels:  []string{"node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master", wellknown.LabelCloud},
		Debounce:       100 * time.Millisecond,
		Resync:         5 * time.Minute,
		MaxObjectBytes: 512 << 10,
	}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.UnitLabel == "":
		return errors.New("objects: UnitLabel is empty")
	case c.Debounce < 0:
		return fmt.Errorf("objects: Debounce %v is negative", c.Debounce)
	case c.Resync <= 0:
		return fmt.Errorf("objects: Resync %v must be positive", c.Resync)
	case c.MaxObjectBytes <= 0 || c.MaxObjectBytes > 1<<20:
		return fmt.Errorf("objects: MaxObjectBytes %d must be in (0, 1 MiB]", c.MaxObjectBytes)
	}
	return nil
}
