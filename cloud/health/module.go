package health

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/cloud/hubclient"
	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/cloud/webhook"
	"github.com/atoll-edge/atoll/internal/admin"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/hublink"
)

// Module runs the health service with the app, on the manager of
// cloud/manager, and provides it as the webhook's Policy. Its readiness
// check ReadinessCheck passes once the ballots have caught up. When the app
// has the identity Issuer and the hub Endpoint, it also follows the hub's
// system events through a system account connection of its own, so a
// voter whose leaf link closes stops counting at once (FollowLinks).
var Module = fx.Module("health",
	fx.Provide(
		newForApp,
		func(s *Service) webhook.Policy { return s },
	),
	fx.Invoke(func(*Service) {}),
)

// ReadinessCheck names the service's readiness check on /readyz: it
// passes once this replica has read the ballots the HEALTH stream held
// when it started, and the voters' link losses.
const ReadinessCheck = "health-ballots"

type params struct {
	fx.In
	Lifecycle fx.Lifecycle
	Config    Config
	Link      *hublink.Link
	Manager   *manager.Manager
	Log       *slog.Logger
	Registry  prometheus.Registerer
	Events    *eventbus.Metrics
	Admin     *admin.Server
	Issuer    *identity.Issuer   `optional:"true"`
	Endpoint  hubclient.Endpoint `optional:"true"`
}

func newForApp(p params) (*Service, error) {
	s, err := New(p.Config, p.Link, p.Manager, p.Log, p.Registry, p.Events)
	if err != nil {
		return nil, err
	}
	p.Admin.AddReadiness(ReadinessCheck, s.Ready)
	fxrun.Background(p.Lifecycle, p.Log, "health", s.Run)
	if p.Issuer != nil && p.Endpoint != nil {
		var sys *nats.Conn
		p.Lifecycle.Append(fx.Hook{
			OnStart: func(ctx context.Context) error {
				var err error
				sys, err = identity.DialSystem(ctx, p.Endpoint.ClientConfig(), p.Issuer, p.Log)
				return err
			},
			OnStop: func(context.Context) error {
				if sys != nil {
					sys.Close()
				}
				return nil
			},
		})
		fxrun.Background(p.Lifecycle, p.Log, "health-links", func(ctx context.Context) error {
			return s.FollowLinks(ctx, sys, p.Issuer.Keys().AccountKey())
		})
	}
	return s, nil
}
