package topology

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/cloud/bus"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/fxrun"
)

// Module runs the topology service with the app.
var Module = fx.Module("topology",
	fx.Provide(newForApp),
	fx.Invoke(func(*Service) {}),
)

func newForApp(lc fx.Lifecycle, cfg Config, b *bus.Bus, log *slog.Logger, reg prometheus.Registerer, evm *events.Metrics) (*Service, error) {
	s, err := New(cfg, b, log, newMetrics(reg), evm)
	if err != nil {
		return nil, err
	}
	fxrun.Background(lc, log, "topology", s.Run)
	return s, nil
}
