package health

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/cloud/webhook"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/admin"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/hublink"
)

// Module runs the health service with the app, on the manager of
// cloud/manager, and provides it as the webhook's Policy. Its readiness
// check "health-votes" passes once the vote state caught up.
var Module = fx.Module("health",
	fx.Provide(
		newForApp,
		func(s *Service) webhook.Policy { return s },
	),
	fx.Invoke(func(*Service) {}),
)

func newForApp(lc fx.Lifecycle, cfg Config, b *hublink.Link, m *manager.Manager, log *slog.Logger, reg prometheus.Registerer, evm *events.Metrics, adm *admin.Server) (*Service, error) {
	s, err := New(cfg, b, m, log, reg, evm)
	if err != nil {
		return nil, err
	}
	adm.AddReadiness("health-votes", s.Ready)
	fxrun.Background(lc, log, "health", s.Run)
	return s, nil
}
