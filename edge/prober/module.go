package prober

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/edge/membership"
	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/hublink"
)

// Module runs the prober with the app.
var Module = fx.Module("prober",
	fx.Provide(newForApp),
	fx.Invoke(func(*Prober) {}),
)

func newForApp(lc fx.Lifecycle, cfg Config, node *natsnode.Node, link *hublink.Link, mem *membership.Membership, log *slog.Logger, reg prometheus.Registerer) (*Prober, error) {
	p, err := New(cfg, node.Name(), mem, link, node, log, newMetrics(reg))
	if err != nil {
		return nil, err
	}
	fxrun.Background(lc, log, "prober", p.Run)
	return p, nil
}
