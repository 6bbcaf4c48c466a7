package enroll

import (
	"log/slog"

	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/edge/membership"
	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/hublink"
)

// Module runs the Enroller with the app. It needs a Config, the
// *natsnode.Node, the agent's *hublink.Link and the *membership.Membership
// (the credentials follow the node's unit).
var Module = fx.Module("enroll",
	fx.Provide(newForApp),
	fx.Invoke(func(*Enroller) {}),
)

func newForApp(lc fx.Lifecycle, cfg Config, node *natsnode.Node, link *hublink.Link, mem *membership.Membership, log *slog.Logger) (*Enroller, error) {
	e, err := New(cfg, node, link, log)
	if err != nil {
		return nil, err
	}
	e.FollowUnit(mem.Assigned)
	e.FollowListedKey(mem.ListedKey)
	fxrun.Background(lc, log, "enroll", e.Run)
	return e, nil
}
