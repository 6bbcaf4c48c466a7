package tunnel

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/edge/membership"
	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/hublink"
)

// Module runs the tunnel agent on the node's own server connection when
// Config.Enabled.
var Module = fx.Module("tunnel",
	fx.Invoke(func(lc fx.Lifecycle, cfg Config, node *natsnode.Node, link *hublink.Link, mem *membership.Membership, reg prometheus.Registerer, log *slog.Logger) error {
		if !cfg.Enabled {
			return nil
		}
		a, err := New(cfg, node.Name(), NewMetrics(reg), log.With("component", "tunnel"))
		if err != nil {
			return err
		}
		a.SetUnits(units{mem})
		lc.Append(fx.Hook{
			// The link is connected by now: its start hook ran first.
			OnStart: func(context.Context) error { return a.Start(link.Conn()) },
		})
		fxrun.Background(lc, log, "tunnel agent", a.Run)
		lc.Append(fx.Hook{OnStop: a.Stop})
		return nil
	}),
)

// units answers unit membership from the node's membership.
type units struct{ m *membership.Membership }

func (u units) Member(node string) (string, bool) {
	v := u.m.Current()
	for _, m := range v.Members {
		if m.GetName() == node {
			return v.Unit, v.Unit != ""
		}
	}
	return v.Unit, false
}
