package status

import (
	"context"
	"log/slog"

	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/cloud/tunnel"
	"github.com/atoll-edge/atoll/cloud/views/members"
	"github.com/atoll-edge/atoll/internal/hublink"
)

// Module answers status requests on the app's hub connection from the
// health service and the manager's cache of Nodes, from app start until app stop.
// It runs with the kubernetes membership source only. With the topology
// service in the app, node statuses name the views each agent is behind on
// and the probe credentials its peers refuse; with the identity service,
// the reporting agents it holds no key for.
var Module = fx.Module("status",
	fx.Provide(newForApp),
	fx.Invoke(func(*Responder) {}),
)

type params struct {
	fx.In
	Lifecycle fx.Lifecycle
	Config    health.Config
	Health    *health.Service
	Link      *hublink.Link
	Manager   *manager.Manager
	Log       *slog.Logger
	Members   *members.Service  `optional:"true"` // which agents' views are behind, which probes refused
	Tunnel    *tunnel.Server    `optional:"true"` // the tunnel sessions this replica relays
	Identity  *identity.Service `optional:"true"` // which agents the cloud holds no key for
}

func newForApp(p params) (*Responder, error) {
	lc, b := p.Lifecycle, p.Link
	r, err := New(p.Health, p.Manager.NodeLister(), p.Config.Units, p.Log)
	if err != nil {
		return nil, err
	}
	if p.Members != nil {
		r.SetViews(p.Members)
	}
	if p.Tunnel != nil {
		r.SetTunnels(p.Tunnel)
	}
	if p.Identity != nil {
		r.SetKeys(p.Identity)
	}
	lc.Append(fx.Hook{
		// The bus is connected by now: its start hook ran first.
		OnStart: func(context.Context) error { return r.Start(b.Conn()) },
		OnStop:  func(context.Context) error { return r.Stop() },
	})
	return r, nil
}
