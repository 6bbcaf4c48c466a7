package kubetest

import (
	"fmt"
	"log/slog"
	"net/netip"
	"time"
)

// Defaults used when the corresponding Config field is zero.
const (
	DefaultServiceClusterIPRange  = "10.96.0.0/16"
	DefaultTolerationSeconds      = 10
	DefaultNodeMonitorPeriod      = time.Second
	DefaultNodeMonitorGracePeriod = 5 * time.Second
	DefaultNodeEvictionRate       = 10
	DefaultStartTimeout           = 90 * time.Second
	DefaultStopTimeout            = 15 * time.Second
)

// Config describes the control plane that StartCluster starts. The zero value
// starts etcd and kube-apiserver only, with the defaults above.
type Config struct {
	// BinDir holds etcd, kube-apiserver, kube-controller-manager and
	// kube-scheduler. Empty means $ATOLL_BIN_DIR, else <repo>/bin.
	BinDir string
	// Dir holds data, certificates, kubeconfig and logs. Empty means a new
	// temporary directory that Stop removes.
	Dir string

	// ControllerManager also starts kube-controller-manager.
	ControllerManager bool
	// Scheduler also starts kube-scheduler.
	Scheduler bool

	// ServiceClusterIPRange is the apiserver's --service-cluster-ip-range.
	ServiceClusterIPRange string
	// NotReadyTolerationSeconds and UnreachableTolerationSeconds feed the
	// DefaultTolerationSeconds admission plugin (the tolerations it adds to
	// pods that do not set their own). Zero means DefaultTolerationSeconds; a
	// negative value means 0 (evict at once).
	NotReadyTolerationSeconds    int
	UnreachableTolerationSeconds int

	// NodeMonitorPeriod and NodeMonitorGracePeriod drive the node lifecycle
	// controller: a node whose Lease and Ready heartbeat are older than the
	// grace period becomes Ready=Unknown and gets the unreachable taints.
	NodeMonitorPeriod      time.Duration
	NodeMonitorGracePeriod time.Duration
	// NodeEvictionRate is --node-eviction-rate: nodes per second that get the
	// NoExecute taint while the zone is healthy. The KCM default (0.1) taints
	// one node every 10 s, too slow for tests.
	NodeEvictionRate float64

	// ClusterEgress, when set, is the HTTP CONNECT proxy ("unix:/path" or
	// "host:port") kube-apiserver's egress selector uses for egress
	// "cluster" (see WithClusterEgress).
	ClusterEgress string
	// ClusterEgressTLS, when set, reaches a TCP ClusterEgress over mutual
	// TLS (see WithClusterEgressTLS).
	ClusterEgressTLS *EgressTLS

	// APIServerBindAddress is the address kube-apiserver listens on:
	// empty means 127.0.0.1; "0.0.0.0" also serves hosts in network
	// namespaces of the test (test/kubenode's nodes), which reach it at an
	// address of APIServerSANs. APIServerURL stays on 127.0.0.1.
	APIServerBindAddress string
	// APIServerSANs are more IP addresses or DNS names for the apiserver's
	// serving certificate.
	APIServerSANs []string

	// Extra*Flags are appended after the generated flags, so they override
	// them (the last value of a flag wins).
	ExtraAPIServerFlags         []string
	ExtraControllerManagerFlags []string
	ExtraSchedulerFlags         []string

	// StartTimeout bounds the whole start; StopTimeout bounds the SIGTERM
	// grace of each process before SIGKILL.
	StartTimeout time.Duration
	StopTimeout  time.Duration

	// Logger receives progress messages. Nil discards them.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.ServiceClusterIPRange == "" {
		c.ServiceClusterIPRange = DefaultServiceClusterIPRange
	}
	c.NotReadyTolerationSeconds = tolerationOrDefault(c.NotReadyTolerationSeconds)
	c.UnreachableTolerationSeconds = tolerationOrDefault(c.UnreachableTolerationSeconds)
	if c.NodeMonitorPeriod == 0 {
		c.NodeMonitorPeriod = DefaultNodeMonitorPeriod
	}
	if c.NodeMonitorGracePeriod == 0 {
		c.NodeMonitorGracePeriod = DefaultNodeMonitorGracePeriod
	}
	if c.NodeEvictionRate == 0 {
		c.NodeEvictionRate = DefaultNodeEvictionRate
	}
	if c.APIServerBindAddress == "" {
		c.APIServerBindAddress = "127.0.0.1"
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = DefaultStartTimeout
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = DefaultStopTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func tolerationOrDefault(s int) int {
	switch {
	case s == 0:
		return DefaultTolerationSeconds
	case s < 0:
		return 0
	default:
		return s
	}
}

// Validate reports the first invalid field of a defaulted Config.
func (c Config) Validate() error {
	p, err := netip.ParsePrefix(c.ServiceClusterIPRange)
	if err != nil {
		return fmt.Errorf("ServiceClusterIPRange %q: %w", c.ServiceClusterIPRange, err)
	}
	if !p.Addr().Is4() || p.Bits() > 28 {
		return fmt.Errorf("ServiceClusterIPRange %q: want an IPv4 range of /28 or larger", c.ServiceClusterIPRange)
	}
	if c.NodeMonitorPeriod <= 0 {
		return fmt.Errorf("NodeMonitorPeriod %s: must be positive", c.NodeMonitorPeriod)
	}
	if c.NodeMonitorGracePeriod <= c.NodeMonitorPeriod {
		return fmt.Errorf("NodeMonitorGracePeriod %s: must exceed NodeMonitorPeriod %s", c.NodeMonitorGracePeriod, c.NodeMonitorPeriod)
	}
	if c.NodeEvictionRate < 0 {
		return fmt.Errorf("NodeEvictionRate %g: must not be negative", c.NodeEvictionRate)
	}
	if c.StartTimeout <= 0 || c.StopTimeout <= 0 {
		return fmt.Errorf("StartTimeout %s, StopTimeout %s: must be positive", c.StartTimeout, c.StopTimeout)
	}
	return nil
}

// Option adjusts the Config used by Start.
type Option func(*Config)

// WithControllerManager also starts kube-controller-manager.
func WithControllerManager() Option { return func(c *Config) { c.ControllerManager = true } }

// WithScheduler also starts kube-scheduler.
func WithScheduler() Option { return func(c *Config) { c.Scheduler = true } }

// WithTolerationSeconds sets the default not-ready and unreachable toleration
// seconds that the DefaultTolerationSeconds admission plugin gives pods.
// Zero evicts at once.
func WithTolerationSeconds(notReady, unreachable int) Option {
	return func(c *Config) {
		c.NotReadyTolerationSeconds = zeroAsNegative(notReady)
		c.UnreachableTolerationSeconds = zeroAsNegative(unreachable)
	}
}

func zeroAsNegative(s int) int {
	if s == 0 {
		return -1
	}
	return s
}

// WithNodeMonitorGracePeriod sets kube-controller-manager's
// --node-monitor-grace-period.
func WithNodeMonitorGracePeriod(d time.Duration) Option {
	return func(c *Config) { c.NodeMonitorGracePeriod = d }
}

// WithNodeEvictionRate sets kube-controller-manager's --node-eviction-rate.
func WithNodeEvictionRate(nodesPerSecond float64) Option {
	return func(c *Config) { c.NodeEvictionRate = nodesPerSecond }
}

// WithAPIServerFlags appends flags to kube-apiserver's command line.
func WithAPIServerFlags(flags ...string) Option {
	return func(c *Config) { c.ExtraAPIServerFlags = append(c.ExtraAPIServerFlags, flags...) }
}

// WithControllerManagerFlags appends flags to kube-controller-manager's
// command line.
func WithControllerManagerFlags(flags ...string) Option {
	return func(c *Config) { c.ExtraControllerManagerFlags = append(c.ExtraControllerManagerFlags, flags...) }
}

// WithSchedulerFlags appends flags to kube-scheduler's command line.
func WithSchedulerFlags(flags ...string) Option {
	return func(c *Config) { c.ExtraSchedulerFlags = append(c.ExtraSchedulerFlags, flags...) }
}

// WithBinDir uses the binaries in dir instead of $ATOLL_BIN_DIR or <repo>/bin.
func WithBinDir(dir string) Option { return func(c *Config) { c.BinDir = dir } }

// WithConfig replaces the whole Config; later options still apply on top.
func WithConfig(cfg Config) Option { return func(c *Config) { *c = cfg } }
