package health

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/cloud/kube"
	"github.com/atoll-edge/atoll/cloud/webhook"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/hublink"
)

// Module runs the health service with the app and provides it as the
// webhook's Policy.
var Module = fx.Module("health",
	fx.Provide(
		newForApp,
		func(s *Service) webhook.Policy { return s },
	),
	fx.Invoke(func(*Service) {}),
)

func newForApp(lc fx.Lifecycle, cfg Config, b *hublink.Link, k *kube.Kube, log *slog.Logger, reg prometheus.Registerer, evm *events.Metrics) (*Service, error) {
	s, err := New(cfg, b, k, log, reg, evm)
	if err != nil {
		return nil, err
	}
	fxrun.Background(lc, log, "health", s.Run)
	return s, nil
}
