package manager

import (
	"errors"
	"fmt"
	"time"
)

// Default values of Config.
const (
	DefaultLeaderElectionID        = "atoll-cloud"
	DefaultLeaderElectionNamespace = "atoll-system"
)

// Config configures the controller-runtime manager.
type Config struct {
	// LeaderElect makes the writers (the controllers and the vote
	// consumer) run on one replica at a time, the holder of a Lease.
	// Without it every replica writes: run one replica only.
	LeaderElect bool
	// LeaderElectionID names the Lease.
	LeaderElectionID string
	// LeaderElectionNamespace holds the Lease.
	LeaderElectionNamespace string
	// Identity names this replica in the Lease; it must be unique among
	// the replicas running at once. A replica restarted with its identity
	// (a container restarted in its pod: the manifest sets the pod's
	// name) takes back the Lease it held at once instead of waiting for
	// it to expire. Empty: the host name and a random suffix.
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod tune the election
	// (client-go's leader election; 15s, 10s, 2s by default).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// GracefulShutdown bounds how long the controllers get to finish on
	// stop.
	GracefulShutdown time.Duration
}

// DefaultConfig elects a leader in atoll-system.
func DefaultConfig() Config {
	return Config{
		LeaderElect:             true,
		LeaderElectionID:        DefaultLeaderElectionID,
		LeaderElectionNamespace: DefaultLeaderElectionNamespace,
		LeaseDuration:           15 * time.Second,
		RenewDeadline:           10 * time.Second,
		RetryPeriod:             2 * time.Second,
		GracefulShutdown:        30 * time.Second,
	}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	if c.LeaderElect {
		switch {
		case c.LeaderElectionID == "":
			return errors.New("manager: leader election id is empty")
		case c.LeaderElectionNamespace == "":
			return errors.New("manager: leader election namespace is empty")
		case c.LeaseDuration <= 0 || c.RenewDeadline <= 0 || c.RetryPeriod <= 0:
			return errors.New("manager: lease duration, renew deadline and retry period must be positive")
		case c.RenewDeadline >= c.LeaseDuration:
			return fmt.Errorf("manager: renew deadline %s must be shorter than the lease duration %s", c.RenewDeadline, c.LeaseDuration)
		case c.RetryPeriod >= c.RenewDeadline:
			return fmt.Errorf("manager: retry period %s must be shorter than the renew deadline %s", c.RetryPeriod, c.RenewDeadline)
		}
	}
	if c.GracefulShutdown < 0 {
		return errors.New("manager: graceful shutdown must not be negative")
	}
	return nil
}
