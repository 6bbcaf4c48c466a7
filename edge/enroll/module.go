package enroll

import (
	"log/slog"

	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/hublink"
)

// Module runs the Enroller with the app. It needs a Config, the
// *natsnode.Node and the agent's *hublink.Link.
var Module = fx.Module("enroll",
	fx.Provide(newForApp),
	fx.Invoke(func(*Enroller) {}),
)

func newForApp(lc fx.Lifecycle, cfg Config, node *natsnode.Node, link *hublink.Link, log *slog.Logger) (*Enroller, error) {
	e, err := New(cfg, node, link, log)
	if err != nil {
		return nil, err
	}
	fxrun.Background(lc, log, "enroll", e.Run)
	return e, nil
}
