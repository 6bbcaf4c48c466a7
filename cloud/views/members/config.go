package members

import (
	"errors"
	"fmt"
	"time"

	"github.com/atoll-edge/atoll/cloud/units"
)

// SecretsBucket is the KV bucket holding each unit's route credentials.
const SecretsBucket = "atoll_unit_routes"

// Membership sources.
const (
	// SourceKubernetes: units come from a label of the Kubernetes Nodes;
	// control-plane nodes are excluded. The default.
	SourceKubernetes = "kubernetes"
	// SourceDeclared: units come from the agents' own reports (for fabrics
	// without Kubernetes, and tests).
	SourceDeclared = "declared"
)

// maxPayload is the hub's largest message (hub.Config sets MaxPayload to
// 1 MiB); a view must fit in it with its headers.
const maxPayload = 1 << 20

// Config tunes the topology service.
type Config struct {
	// Source of unit membership: SourceKubernetes or SourceDeclared.
	Source string
	// Units says which unit each Node is in (SourceKubernetes).
	Units units.Rule
	// NodeTTL: a node that has not reported for this long is dropped
	// from its unit.
	NodeTTL time.Duration
	// Debounce coalesces bursts of updates into one publication.
	Debounce time.Duration
	// Resync is how often every view is compared with the last value the
	// VIEWS stream holds for its subject, and republished when that value
	// is missing or different (a purged subject, a publication lost to a
	// hub failure).
	Resync time.Duration
	// MaxViewBytes bounds one encoded view; a larger one is rejected
	// (counted, logged with its unit) and the other views are published.
	MaxViewBytes int
	// Replicas of the secrets bucket (match the hub's stream replicas).
	Replicas int
}

// DefaultConfig suits production.
func DefaultConfig() Config {
	return Config{
		Source:       SourceKubernetes,
		Units:        units.DefaultRule(),
		NodeTTL:      10 * time.Minute,
		Debounce:     200 * time.Millisecond,
		Resync:       time.Minute,
		MaxViewBytes: 512 << 10,
		Replicas:     1,
	}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	if c.Source == SourceKubernetes {
		if err := c.Units.Validate(); err != nil {
			return fmt.Errorf("members: %w", err)
		}
	}
	switch {
	case c.Source != SourceKubernetes && c.Source != SourceDeclared:
		return fmt.Errorf("members: source %q: want %s or %s", c.Source, SourceKubernetes, SourceDeclared)
	case c.NodeTTL <= 0:
		return errors.New("members: node TTL must be positive")
	case c.Debounce < 0:
		return errors.New("members: debounce must not be negative")
	case c.Resync <= 0:
		return errors.New("members: resync must be positive")
	case c.MaxViewBytes < 1024 || c.MaxViewBytes > maxPayload/2:
		return fmt.Errorf("members: max view bytes %d must be between 1024 and %d (half the hub's max payload)", c.MaxViewBytes, maxPayload/2)
	case c.Replicas < 1:
		return errors.New("members: replicas must be at least 1")
	}
	return nil
}
