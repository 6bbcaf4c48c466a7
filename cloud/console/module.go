package console

import (
	"log/slog"

	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/cloud/grid"
	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/cloud/status"
	"github.com/atoll-edge/atoll/cloud/views/members"
	"github.com/atoll-edge/atoll/internal/admin"
	"github.com/atoll-edge/atoll/internal/fxrun"
)

// Module serves the status page under /ui/ on the admin listener when
// Config.Enabled, from the health service, the manager's cache (Nodes
// and, with the grid controllers, the grids), the status responder's
// gather of tunnel sessions and, with the members service, the agents'
// refused probe credentials. It provides *Console, nil when disabled.
var Module = fx.Module("console",
	fx.Provide(newForApp),
	fx.Invoke(func(*Console) {}),
)

type params struct {
	fx.In
	Lifecycle fx.Lifecycle
	Config    Config
	Health    *health.Service
	Manager   *manager.Manager
	Admin     *admin.Server
	Log       *slog.Logger
	Grids     *grid.Controllers `optional:"true"` // nil: the grid controllers do not run
	Status    *status.Responder `optional:"true"` // gathers the replicas' tunnel sessions
	Members   *members.Service  `optional:"true"` // the agents' refused probe credentials
	Identity  *identity.Service `optional:"true"` // the agents the cloud holds no key for
}

func newForApp(p params) (*Console, error) {
	if !p.Config.Enabled {
		return nil, nil
	}
	var tunnels Tunnels
	if p.Status != nil {
		tunnels = p.Status
	}
	grids := p.Manager.GetClient()
	if p.Grids == nil {
		grids = nil
	}
	c, err := New(p.Config, p.Health, p.Manager.NodeLister(), grids, tunnels, p.Log)
	if err != nil {
		return nil, err
	}
	if p.Members != nil {
		c.SetAgents(p.Members)
	}
	if p.Identity != nil {
		c.SetKeys(p.Identity)
	}
	p.Health.OnProtectiveWrite(c.Wrote)
	p.Admin.Handle("/ui/", c.Handler())
	fxrun.Background(p.Lifecycle, p.Log, "console", c.Run)
	return c, nil
}
