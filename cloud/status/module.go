package status

import (
	"context"
	"log/slog"

	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/internal/hublink"
)

// Module answers status requests on the app's hub connection from the
// health service and the manager's cache of Nodes, from app start until app stop.
// It runs with the kubernetes membership source only.
var Module = fx.Module("status",
	fx.Provide(newForApp),
	fx.Invoke(func(*Responder) {}),
)

func newForApp(lc fx.Lifecycle, cfg health.Config, hs *health.Service, b *hublink.Link, m *manager.Manager, log *slog.Logger) (*Responder, error) {
	r, err := New(hs, m.NodeLister(), cfg.UnitLabel, log)
	if err != nil {
		return nil, err
	}
	lc.Append(fx.Hook{
		// The bus is connected by now: its start hook ran first.
		OnStart: func(context.Context) error { return r.Start(b.Conn()) },
		OnStop:  func(context.Context) error { return r.Stop() },
	})
	return r, nil
}
