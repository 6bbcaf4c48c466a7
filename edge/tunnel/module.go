package tunnel

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/hublink"
)

// Module runs the tunnel agent on the node's own server connection when
// Config.Enabled.
var Module = fx.Module("tunnel",
	fx.Invoke(func(lc fx.Lifecycle, cfg Config, node *natsnode.Node, link *hublink.Link, reg prometheus.Registerer, log *slog.Logger) error {
		if !cfg.Enabled {
			return nil
		}
		a, err := New(cfg, node.Name(), NewMetrics(reg), log.With("component", "tunnel"))
		if err != nil {
			return err
		}
		lc.Append(fx.Hook{
			// The link is connected by now: its start hook ran first.
			OnStart: func(context.Context) error { return a.Start(link.Conn()) },
		})
		fxrun.Background(lc, log, "tunnel agent", a.Run)
		lc.Append(fx.Hook{OnStop: a.Stop})
		return nil
	}),
)
