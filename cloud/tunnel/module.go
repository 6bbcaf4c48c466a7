package tunnel

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"context"

	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/internal/hublink"
)

type params struct {
	fx.In
	Lifecycle fx.Lifecycle
	Config    Config
	Link      *hublink.Link
	Manager   *manager.Manager `optional:"true"` // resolves node addresses; without it, hosts must be node names
	Registry  prometheus.Registerer
	Log       *slog.Logger
}

// Module runs the tunnel server when its Config has a listener or a
// forward: it listens at start (after the hub link is up) and aborts its
// sessions at stop.
var Module = fx.Module("tunnel",
	fx.Provide(func(p params) (*Server, error) {
		var res Resolver = Names{}
		if p.Manager != nil {
			res = Nodes{Lister: p.Manager.NodeLister()}
		}
		s, err := New(p.Config, res, NewMetrics(p.Registry), p.Log.With("component", "tunnel"))
		if err != nil {
			return nil, err
		}
		if p.Config.Enabled() {
			p.Lifecycle.Append(fx.Hook{
				OnStart: func(context.Context) error { return s.Start(p.Link.Conn()) },
				OnStop:  s.Stop,
			})
		}
		return s, nil
	}),
	fx.Invoke(func(*Server) {}),
)
