package proxy

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// Config tunes the endpoints proxy.
type Config struct {
	// Enabled runs the proxy in atoll-edge.
	Enabled bool
	// Addr is the listen address kube-proxy's kubeconfig points at
	// (plain HTTP: keep it on loopback).
	Addr string
	// StateDir keeps the views on disk (empty: nothing is kept, and a
	// restart with the hub down serves nothing).
	StateDir string
	// Bookmark is how often a watch that asked for bookmarks gets one.
	Bookmark time.Duration
	// MaxTombstones bounds the deleted objects kept so that watches can
	// resume past their deletion; resuming from before the oldest dropped
	// is answered 410 Gone.
	MaxTombstones int
	// SaveDelay coalesces the changes written to disk.
	SaveDelay time.Duration
	// SaveRetry is how often the views are written again while the disk
	// refuses them (full, failing).
	SaveRetry time.Duration
	// RelayViews shares the hub's copies of the shared views with the
	// unit (viewfeed.Relay): one agent of the unit gets each and relays
	// it on the unit's routes, so a change crosses the hub's links once
	// per unit rather than once per node.
	RelayViews bool
	// RelayFreshness is how far from this node's clock the time the cloud
	// stamped on a relayed view may be (a peer may replay a view it
	// relayed; what it replays must be this fresh).
	RelayFreshness time.Duration
}

// DefaultConfig suits production.
func DefaultConfig() Config {
	return Config{
		Addr:           "127.0.0.1:9471",
		Bookmark:       time.Minute,
		MaxTombstones:  10000,
		SaveDelay:      100 * time.Millisecond,
		SaveRetry:      10 * time.Second,
		RelayViews:     true,
		RelayFreshness: 2 * time.Minute,
	}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("proxy: Addr %q: %w", c.Addr, err)
	}
	switch {
	case c.Bookmark <= 0:
		return errors.New("proxy: Bookmark must be positive")
	case c.MaxTombstones < 0:
		return errors.New("proxy: MaxTombstones must not be negative")
	case c.SaveDelay < 0:
		return errors.New("proxy: SaveDelay must not be negative")
	case c.SaveRetry <= 0:
		return errors.New("proxy: SaveRetry must be positive")
	case c.RelayViews && c.RelayFreshness <= 0:
		return errors.New("proxy: RelayFreshness must be positive")
	}
	return nil
}
