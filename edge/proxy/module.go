package proxy

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/edge/membership"
	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/edge/viewfeed"
	"github.com/atoll-edge/atoll/internal/fxrun"
)

type params struct {
	fx.In
	Lifecycle  fx.Lifecycle
	Config     Config
	Node       NodeName
	Feeds      *viewfeed.Feeds
	Membership *membership.Membership
	NATS       *natsnode.Node
	Log        *slog.Logger
	Registry   prometheus.Registerer
}

// NodeName is the host's Kubernetes node name.
type NodeName string

// Module runs the endpoints proxy with atoll-edge when Config.Enabled:
// it listens at start and follows the unit the membership names.
var Module = fx.Module("proxy",
	fx.Provide(func(p params) (*Proxy, error) {
		if !p.Config.Enabled {
			return nil, nil
		}
		px, err := New(p.Config, string(p.Node), p.Feeds, membershipUnits{m: p.Membership}, p.Log, newMetrics(p.Registry))
		if err != nil {
			return nil, err
		}
		if p.Config.RelayViews {
			px.RelayThrough(p.NATS)
		}
		p.Lifecycle.Append(fx.Hook{OnStart: func(context.Context) error { return px.Listen() }})
		fxrun.Background(p.Lifecycle, p.Log, "proxy", px.Run)
		return px, nil
	}),
	fx.Invoke(func(*Proxy) {}),
)

// membershipUnits is the membership as a UnitSource.
type membershipUnits struct{ m *membership.Membership }

func (u membershipUnits) Unit() string             { return u.m.Current().Unit }
func (u membershipUnits) Changes() <-chan struct{} { return u.m.Changes() }
