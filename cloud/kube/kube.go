// Package kube gives atoll-cloud its Kubernetes client configuration, from
// which cloud/manager builds the controller-runtime manager whose cache
// every controller reads, a plain clientset for the few writes made
// outside a controller (the webhook registration), and the routing of
// client-go's and controller-runtime's logs into the service's logger.
package kube

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/atoll-edge/atoll/internal/wellknown"

	"go.uber.org/fx"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Config selects the cluster.
type Config struct {
	// Kubeconfig is a kubeconfig file; empty means in-cluster config.
	Kubeconfig string
	// REST, when set, is used as is (tests and the demo).
	REST *rest.Config
	// QPS and Burst limit the client.
	QPS   float32
	Burst int
}

// DefaultConfig talks to the cluster the service runs in.
func DefaultConfig() Config { return Config{QPS: 100, Burst: 200} }

// Validate names what is wrong.
func (c Config) Validate() error {
	if c.QPS <= 0 || c.Burst < 1 {
		return errors.New("kube: QPS and burst must be positive")
	}
	return nil
}

// Kube is the service's Kubernetes access.
type Kube struct {
	// REST is the client configuration (user agent atoll-cloud), from
	// which the controller-runtime manager (cloud/manager) is built.
	REST   *rest.Config
	Client kubernetes.Interface
}

// New builds the client configuration and the clientset.
func New(cfg Config) (*Kube, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rc := cfg.REST
	if rc == nil {
		var err error
		if cfg.Kubeconfig != "" {
			rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
		} else {
			rc, err = rest.InClusterConfig()
		}
		if err != nil {
			return nil, fmt.Errorf("kube: client config: %w", err)
		}
	}
	rc = rest.CopyConfig(rc)
	rc.QPS, rc.Burst = cfg.QPS, cfg.Burst
	rc.UserAgent = wellknown.FieldManager
	// The apiserver warns on every use of core/v1 Endpoints (deprecated,
	// but still what older kube-proxies read, so Atoll keeps them ready).
	rc.WarningHandler = rest.NoWarnings{}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube: client: %w", err)
	}
	return &Kube{REST: rc, Client: client}, nil
}

// Module provides *Kube and its kubernetes.Interface, and routes
// client-go's logs to the app's logger.
var Module = fx.Module("kube",
	fx.Provide(newForApp, func(k *Kube) kubernetes.Interface { return k.Client }),
)

func newForApp(cfg Config, log *slog.Logger) (*Kube, error) {
	RouteLogs(log)
	return New(cfg)
}
