package hostrecords

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/atoll-edge/atoll/cloud/units"
)

// Config tunes the host records publisher.
type Config struct {
	// Enabled runs the publisher (kubernetes source, grid CRDs served).
	Enabled bool
	// Units says which unit each Node is in (records go only to grids
	// whose gridUniqKey is its label).
	Units units.Rule
	// ClusterDomain completes the names (`<...>.svc.<ClusterDomain>`);
	// empty publishes names ending in ".svc", which the edge writer
	// completes with its own --cluster-domain.
	ClusterDomain string
	// Debounce coalesces bursts of changes into one pass.
	Debounce time.Duration
	// Resync is how often every unit's records are compared with the stream.
	Resync time.Duration
}

// DefaultConfig suits production.
func DefaultConfig() Config {
	return Config{
		Enabled:       true,
		Units:         units.DefaultRule(),
		ClusterDomain: "cluster.local",
		Debounce:      100 * time.Millisecond,
		Resync:        5 * time.Minute,
	}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	if err := c.Units.Validate(); err != nil {
		return fmt.Errorf("hostrecords: %w", err)
	}
	switch {
	case c.Debounce < 0:
		return fmt.Errorf("hostrecords: Debounce %v is negative", c.Debounce)
	case c.Resync <= 0:
		return fmt.Errorf("hostrecords: Resync %v must be positive", c.Resync)
	}
	if c.ClusterDomain != "" {
		if errs := validation.IsDNS1123Subdomain(c.ClusterDomain); len(errs) > 0 {
			return fmt.Errorf("hostrecords: ClusterDomain %q: %s", c.ClusterDomain, strings.Join(errs, "; "))
		}
	}
	return nil
}
