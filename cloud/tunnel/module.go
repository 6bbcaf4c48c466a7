package tunnel

import (
	"context"
	"errors"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/cloud/hubclient"
	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/fxrun"
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
	Events    *eventbus.Metrics  `optional:"true"`
	Issuer    *identity.Issuer   `optional:"true"` // with Endpoint: the leaf link state, for relaying at once
	Endpoint  hubclient.Endpoint `optional:"true"`
}

// Module runs the tunnel server when its Config has a listener or a
// forward: it listens at start (after the hub link is up) and aborts its
// sessions at stop. With Config.Relay it follows the unit views (VIEWS)
// for the peers that may relay a node's sessions and, when the app has
// the identity Issuer and the hub Endpoint, the hub's leaf connection
// events through a system account connection of its own.
var Module = fx.Module("tunnel",
	fx.Provide(func(p params) (*Server, error) {
		var res Resolver = Names{}
		if p.Manager != nil {
			res = Nodes{Lister: p.Manager.NodeLister()}
		}
		log := p.Log.With("component", "tunnel")
		s, err := New(p.Config, res, NewMetrics(p.Registry), log)
		if err != nil {
			return nil, err
		}
		if !p.Config.Enabled() {
			return s, nil
		}
		if p.Config.Relay {
			units := NewUnitViews()
			var sys *nats.Conn
			var links *Links
			if p.Issuer != nil && p.Endpoint != nil {
				p.Lifecycle.Append(fx.Hook{
					OnStart: func(ctx context.Context) error {
						var err error
						if sys, err = identity.DialSystem(ctx, p.Endpoint.ClientConfig(), p.Issuer, p.Log); err != nil {
							return err
						}
						if links, err = FollowLinks(sys, p.Issuer.Keys().AccountKey()); err != nil {
							return err
						}
						units.Links = links
						s.SetRelay(units, links)
						return nil
					},
					OnStop: func(context.Context) error {
						if links != nil {
							links.Close()
						}
						if sys != nil {
							sys.Close()
						}
						return nil
					},
				})
			} else {
				s.SetRelay(units, nil)
			}
			fxrun.Background(p.Lifecycle, p.Log, "tunnel-units", func(ctx context.Context) error {
				js := p.Link.JetStream()
				if js == nil {
					return errors.New("tunnel: no hub link for the unit views")
				}
				return units.Run(ctx, js, p.Events, log)
			})
		}
		p.Lifecycle.Append(fx.Hook{
			OnStart: func(context.Context) error { return s.Start(p.Link.Conn()) },
			OnStop:  s.Stop,
		})
		return s, nil
	}),
	fx.Invoke(func(*Server) {}),
)
