// Package kube gives cloud services their Kubernetes client configuration
// (from which cloud/manager builds the controller-runtime manager, whose
// cache the health service reads), a client and a shared informer factory,
// started with the app: components that do not run on the manager yet
// (topology, status) request the informers they need when they are built;
// the informers start, and the app waits for their caches to sync, before
// any component runs.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/atoll-edge/atoll/internal/wellknown"

	"go.uber.org/fx"
	"k8s.io/client-go/informers"
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
	// Resync of the informers (0: none).
	Resync time.Duration
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
	REST      *rest.Config
	Client    kubernetes.Interface
	Informers informers.SharedInformerFactory
}

// New builds the client and an informer factory (not started).
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
	return &Kube{REST: rc, Client: client, Informers: informers.NewSharedInformerFactory(client, cfg.Resync)}, nil
}

// Module provides *Kube (and its kubernetes.Interface) and starts its
// informers with the app.
var Module = fx.Module("kube",
	fx.Provide(newForApp, func(k *Kube) kubernetes.Interface { return k.Client }),
)

func newForApp(lc fx.Lifecycle, cfg Config, log *slog.Logger) (*Kube, error) {
	RouteLogs(log)
	k, err := New(cfg)
	if err != nil {
		return nil, err
	}
	stop := make(chan struct{})
	lc.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			k.Informers.Start(stop)
			for typ, ok := range k.Informers.WaitForCacheSync(ctx.Done()) {
				if !ok {
					return fmt.Errorf("kube: cache of %v did not sync", typ)
				}
			}
			return nil
		},
		OnStop: func(context.Context) error {
			close(stop)
			k.Informers.Shutdown()
			return nil
		},
	})
	return k, nil
}
