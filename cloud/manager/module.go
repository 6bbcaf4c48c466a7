package manager

import (
	"context"
	"fmt"
	"log/slog"

	"go.uber.org/fx"
	ctrlmanager "sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/atoll-edge/atoll/cloud/kube"
	"github.com/atoll-edge/atoll/internal/admin"
)

// Module provides the *Manager (and it as a controller-runtime Manager),
// built from the kube module's client config. Components add their
// controllers and runnables while the app is built; the manager starts
// after them (OnStart waits for the cache) and stops before them. Losing
// the leader Lease ends a term, not the manager (elector.go); a manager
// that stops on its own for another reason shuts the app down with exit
// code 1. The
// readiness check "kube-cache" passes once the cache has synced, and
// controller-runtime's metrics are served with the service's on the admin
// listener.
var Module = fx.Module("manager",
	fx.Provide(newForApp, func(m *Manager) ctrlmanager.Manager { return m.Manager }),
)

func newForApp(lc fx.Lifecycle, sd fx.Shutdowner, cfg Config, k *kube.Kube, log *slog.Logger, adm *admin.Server) (*Manager, error) {
	m, err := New(cfg, k.REST, log)
	if err != nil {
		return nil, err
	}
	adm.AddReadiness("kube-cache", m.Ready)
	if err := RegisterMetrics(adm.Registerer()); err != nil {
		return nil, fmt.Errorf("manager: metrics: %w", err)
	}
	if err := m.metrics.register(adm.Registerer()); err != nil {
		return nil, fmt.Errorf("manager: metrics: %w", err)
	}
	lc.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			if err := m.Start(ctx); err != nil {
				return err
			}
			go func() {
				<-m.Done()
				if err := m.Err(); err != nil {
					_ = sd.Shutdown(fx.ExitCode(1))
				}
			}()
			return nil
		},
		OnStop: m.Stop,
	})
	return m, nil
}
