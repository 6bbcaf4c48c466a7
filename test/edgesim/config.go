package edgesim

import (
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// FieldManager owns the fields the simulator writes with server-side apply.
const FieldManager = "atoll-edgesim"

// Defaults used when the corresponding Config field is zero.
const (
	DefaultRenewInterval  = 2 * time.Second
	DefaultLeaseDuration  = 40 * time.Second
	DefaultStatusInterval = time.Minute
	DefaultWorkers        = 16
	DefaultQPS            = 2000
	DefaultBurst          = 4000
	// KubeletVersion is what simulated nodes report in status.nodeInfo.
	KubeletVersion = "v1.36.3"
)

// Config tunes a Simulator. The zero value uses the defaults above.
type Config struct {
	// RenewInterval is how often each node renews its Lease in
	// kube-node-lease (a kubelet renews every 10 s by default).
	RenewInterval time.Duration
	// LeaseDuration is the Lease's leaseDurationSeconds.
	LeaseDuration time.Duration
	// StatusInterval is how often a node re-posts its full status (the Ready
	// heartbeat) when nothing changed. The node lifecycle controller reads
	// the Lease for liveness, so this can be long; a node whose Ready
	// condition someone else changed is corrected at its next renewal.
	StatusInterval time.Duration
	// Workers is the number of goroutines renewing leases, and separately
	// the number handling pods. Nodes share them; there is no goroutine per
	// node.
	Workers int
	// QPS and Burst are the simulator client's rate limits.
	QPS   float32
	Burst int
	// Logger receives failed writes. Nil means slog.Default().
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.RenewInterval == 0 {
		c.RenewInterval = DefaultRenewInterval
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = DefaultLeaseDuration
	}
	if c.StatusInterval == 0 {
		c.StatusInterval = DefaultStatusInterval
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.QPS == 0 {
		c.QPS = DefaultQPS
	}
	if c.Burst == 0 {
		c.Burst = DefaultBurst
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports the first invalid field of a defaulted Config.
func (c Config) Validate() error {
	switch {
	case c.RenewInterval <= 0:
		return fmt.Errorf("RenewInterval %s: must be positive", c.RenewInterval)
	case c.LeaseDuration < time.Second:
		return fmt.Errorf("LeaseDuration %s: must be at least 1s", c.LeaseDuration)
	case c.StatusInterval <= 0:
		return fmt.Errorf("StatusInterval %s: must be positive", c.StatusInterval)
	case c.Workers < 1:
		return fmt.Errorf("Workers %d: must be at least 1", c.Workers)
	case c.QPS < 0 || c.Burst < 0:
		return fmt.Errorf("QPS %g, Burst %d: must not be negative", c.QPS, c.Burst)
	}
	return nil
}

// NodeSpec describes one simulated node.
type NodeSpec struct {
	// Name is the Node's name (a DNS subdomain).
	Name string
	// Labels are added to the well-known kubernetes.io/hostname, os and arch
	// labels.
	Labels map[string]string
	// Taints are set when the Node is registered.
	Taints []corev1.Taint
	// InternalIP is the node address and the hostIP of its pods. Empty means
	// one derived from the registration index, in 172.16.0.0/12.
	InternalIP string
	// PodCIDR is the /24 pod IPs come from (also set as spec.podCIDR). Empty
	// means one derived from the registration index, in 10.64.0.0/10.
	PodCIDR string
	// CPU, Memory and Pods are capacity and allocatable. Zero means 4 CPUs,
	// 8Gi and 110 pods.
	CPU, Memory, Pods resource.Quantity
}

var (
	defaultCPU    = resource.MustParse("4")
	defaultMemory = resource.MustParse("8Gi")
	defaultPods   = resource.MustParse("110")
)

// resolved fills in the defaults of spec for registration index i.
func (spec NodeSpec) resolved(i int) (NodeSpec, netip.Addr, netip.Prefix, error) {
	if errs := validation.IsDNS1123Subdomain(spec.Name); len(errs) > 0 {
		return spec, netip.Addr{}, netip.Prefix{}, fmt.Errorf("node name %q: %s", spec.Name, errs[0])
	}
	var (
		ip   netip.Addr
		cidr netip.Prefix
		err  error
	)
	if spec.InternalIP == "" {
		if ip, err = nodeIP(i); err != nil {
			return spec, ip, cidr, fmt.Errorf("node %s: %w", spec.Name, err)
		}
	} else if ip, err = netip.ParseAddr(spec.InternalIP); err != nil || !ip.Is4() {
		return spec, ip, cidr, fmt.Errorf("node %s: InternalIP %q: want an IPv4 address", spec.Name, spec.InternalIP)
	}
	if spec.PodCIDR == "" {
		if cidr, err = podCIDR(i); err != nil {
			return spec, ip, cidr, fmt.Errorf("node %s: %w", spec.Name, err)
		}
	} else if cidr, err = netip.ParsePrefix(spec.PodCIDR); err != nil || !cidr.Addr().Is4() || cidr.Bits() != 24 {
		return spec, ip, cidr, fmt.Errorf("node %s: PodCIDR %q: want an IPv4 /24", spec.Name, spec.PodCIDR)
	}
	cidr = cidr.Masked()
	spec.InternalIP, spec.PodCIDR = ip.String(), cidr.String()
	if spec.CPU.IsZero() {
		spec.CPU = defaultCPU
	}
	if spec.Memory.IsZero() {
		spec.Memory = defaultMemory
	}
	if spec.Pods.IsZero() {
		spec.Pods = defaultPods
	}
	return spec, ip, cidr, nil
}
