package membership

import (
	"log/slog"

	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/edge/viewfeed"
	"github.com/atoll-edge/atoll/internal/admin"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/hublink"
)

type params struct {
	fx.In
	Lifecycle fx.Lifecycle
	Config    Config
	Node      *natsnode.Node
	Link      *hublink.Link
	Feeds     *viewfeed.Feeds
	Log       *slog.Logger
	Admin     *admin.Server
}

// Module runs membership with the app; its readiness check is
// "membership".
var Module = fx.Module("membership",
	fx.Provide(func(p params) (*Membership, error) {
		m, err := New(p.Config, p.Node, p.Link, p.Feeds, p.Log)
		if err != nil {
			return nil, err
		}
		p.Admin.AddReadiness("membership", m.Ready)
		fxrun.Background(p.Lifecycle, p.Log, "membership", m.Run)
		return m, nil
	}),
	fx.Invoke(func(*Membership) {}),
)
