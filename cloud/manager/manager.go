// Package manager runs atoll-cloud's controller-runtime manager: one shared
// cache of the cluster, the controllers (health today, the grid
// controllers next), and leader election on a Lease so that only one
// replica writes. Runnables that only read or serve (the cache, the
// webhook, each replica's vote follower) run on every replica; the
// controllers and the vote consumer run on the leader only.
//
// Readiness and metrics are served by internal/admin: the "kube-cache"
// check passes once the manager's informers have synced, and
// controller-runtime's metrics join the service's registry.
package manager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	ctrlmanager "sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/atoll-edge/atoll/internal/wellknown"
)

// Manager is a controller-runtime manager with a start that waits for the
// cache, a stop that waits for the runnables, and leader election by
// terms (elector.go): losing the Lease ends a term, never the manager.
type Manager struct {
	ctrlmanager.Manager
	cfg     Config
	log     *slog.Logger
	el      *elector
	metrics managerMetrics

	synced atomic.Bool
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
	// campaigned is closed when the campaign has ended (a Lease held is
	// released).
	campaigned chan struct{}
	err        error
}

// Scheme holds the built-in Kubernetes types.
func Scheme() *runtime.Scheme { return clientgoscheme.Scheme }

// New builds a manager on rc. It does not start it.
func New(cfg Config, rc *rest.Config, log *slog.Logger) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if rc == nil {
		return nil, errors.New("manager: no rest config")
	}
	log = log.With("component", "manager")
	opts := ctrlmanager.Options{
		Scheme: Scheme(),
		Logger: logr.FromSlogHandler(log.Handler()),
		// Leader election by terms (elector.go): controller-runtime's
		// ends the manager when the Lease is lost.
		LeaderElection: false,
		// Probes and metrics are served by internal/admin (see Module).
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:  "0",
		GracefulShutdownTimeout: ptr.To(cfg.GracefulShutdown),
		// Controller names are unique per manager; tests build several
		// managers in one process.
		Controller: ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
		// Nothing reads managed fields from the cache (writes are patches
		// and server-side applies the apiserver merges): dropping them
		// halves what a cached Node weighs and what every copy of it
		// costs.
		Cache: ctrlcache.Options{DefaultTransform: ctrlcache.TransformStripManagedFields(),
			// The kubelets' Leases (cloud/health reads them) are the only
			// Leases cached: leader election reads its own directly. The
			// only ConfigMaps cached are the protected set's (cloud/health),
			// in atoll-cloud's namespace.
			ByObject: map[client.Object]ctrlcache.ByObject{
				&coordinationv1.Lease{}: {Namespaces: map[string]ctrlcache.Config{corev1.NamespaceNodeLease: {}}},
				&corev1.ConfigMap{}: {
					Namespaces: map[string]ctrlcache.Config{cfg.LeaderElectionNamespace: {}},
					Label:      labels.SelectorFromSet(labels.Set{wellknown.ProtectedNodesLabel: "true"}),
				},
			}},
	}
	m, err := ctrlmanager.New(rc, opts)
	if err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	return &Manager{Manager: m, cfg: cfg, log: log, el: newElector(), metrics: newManagerMetrics()}, nil
}

// Start runs the manager in the background and returns once its cache has
// synced the informers requested so far, or with the error that stopped
// the manager, or when ctx ends. The manager runs until Stop.
func (m *Manager) Start(ctx context.Context) error {
	m.mu.Lock()
	if m.done != nil {
		m.mu.Unlock()
		return errors.New("manager: already started")
	}
	runCtx, cancel := context.WithCancel(context.Background())
	m.cancel, m.done = cancel, make(chan struct{})
	done := m.done
	m.mu.Unlock()
	go func() {
		defer close(done)
		err := m.Manager.Start(runCtx)
		if err != nil && runCtx.Err() == nil {
			m.log.Error("manager stopped", "err", err)
		}
		m.mu.Lock()
		m.err = err
		m.mu.Unlock()
		m.synced.Store(false)
	}()
	synced := make(chan bool, 1)
	go func() { synced <- m.GetCache().WaitForCacheSync(ctx) }()
	select {
	case ok := <-synced:
		if !ok {
			return fmt.Errorf("manager: cache did not sync: %w", context.Cause(ctx))
		}
		m.synced.Store(true)
		m.log.Info("manager started; cache synced")
		// Terms begin once the cache holds what the leaders' work reads.
		campaigned := make(chan struct{})
		m.mu.Lock()
		m.campaigned = campaigned
		m.mu.Unlock()
		go func() {
			defer close(campaigned)
			if err := m.campaign(runCtx); err != nil {
				m.log.Error("leader election stopped; this replica will not lead", "err", err)
			}
		}()
		return nil
	case <-done:
		return fmt.Errorf("manager: stopped while starting: %w", m.Err())
	}
}

// Done is closed when the manager has stopped (nil before Start).
func (m *Manager) Done() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.done
}

// Err is why the manager stopped (nil while it runs or after Stop).
func (m *Manager) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Stop cancels the manager and waits, within ctx, for its runnables to
// finish and a leader to release its Lease.
func (m *Manager) Stop(ctx context.Context) error {
	m.mu.Lock()
	cancel, done, campaigned := m.cancel, m.done, m.campaigned
	m.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	for _, ch := range []chan struct{}{done, campaigned} {
		if ch == nil {
			continue
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("manager: stop: %w", ctx.Err())
		}
	}
	return nil
}

// Ready reports whether the cache has synced and the manager runs; the
// error names what is missing.
func (m *Manager) Ready(context.Context) error {
	select {
	case <-m.Done():
		return fmt.Errorf("manager stopped: %w", m.Err())
	default:
	}
	if !m.synced.Load() {
		return errors.New("informer cache not synced")
	}
	return nil
}
