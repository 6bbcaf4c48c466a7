package console

import (
	"github.com/atoll-edge/atoll/cloud/units"

	"fmt"
	"time"
)

// Config configures the status page.
type Config struct {
	// Enabled serves the page under /ui/ on the admin listener
	// (--console).
	Enabled bool
	// Interval is how often the model is rebuilt from memory and changes
	// are sent to the browsers: at most 1/Interval updates per second
	// (bursts within it coalesce). Minimum 250ms.
	Interval time.Duration
	// IdleInterval replaces Interval (and TunnelsEvery) while no browser
	// follows the page: the model is still rebuilt, so the timeline keeps
	// the verdict changes nobody watched, but rarely (the page is not
	// what an idle installation should spend its CPU on). A browser that
	// connects, and a state request, get a fresh build at once.
	IdleInterval time.Duration
	// TunnelsEvery is how often the replicas' tunnel sessions are
	// gathered (each gather waits for the replicas' answers).
	TunnelsEvery time.Duration
	// Heartbeat is the interval of the SSE comment lines that keep idle
	// connections (and proxies) open.
	Heartbeat time.Duration
	// Timeline is how many timeline entries are kept (a ring).
	Timeline int
	// Units says which unit each Node is in (set by the app).
	Units units.Rule
}

// DefaultConfig is the production configuration.
func DefaultConfig() Config {
	return Config{Enabled: true, Interval: 250 * time.Millisecond, IdleInterval: 10 * time.Second, TunnelsEvery: 3 * time.Second,
		Heartbeat: 15 * time.Second, Timeline: 500, Units: units.DefaultRule()}
}

// Validate names the field that is wrong.
func (c Config) Validate() error {
	switch {
	case c.Interval < 250*time.Millisecond:
		return fmt.Errorf("console: interval %s below 250ms", c.Interval)
	case c.IdleInterval < c.Interval:
		return fmt.Errorf("console: idle interval %s below the interval %s", c.IdleInterval, c.Interval)
	case c.TunnelsEvery <= 0:
		return fmt.Errorf("console: tunnels interval %s must be positive", c.TunnelsEvery)
	case c.Heartbeat <= 0:
		return fmt.Errorf("console: heartbeat %s must be positive", c.Heartbeat)
	case c.Timeline < 1:
		return fmt.Errorf("console: timeline %d must be at least 1", c.Timeline)
	}
	if err := c.Units.Validate(); err != nil {
		return fmt.Errorf("console: %w", err)
	}
	return nil
}
