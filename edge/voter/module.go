package voter

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/edge/membership"
	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/hublink"
)

// Module runs the voter with the app.
var Module = fx.Module("voter",
	fx.Provide(newForApp),
	fx.Invoke(func(*Voter) {}),
)

func newForApp(lc fx.Lifecycle, cfg Config, node *natsnode.Node, link *hublink.Link, mem *membership.Membership, log *slog.Logger, reg prometheus.Registerer, evm *eventbus.Metrics) (*Voter, error) {
	v, err := New(cfg, node.Name(), mem, link, log, newMetrics(reg), evm)
	if err != nil {
		return nil, err
	}
	// A ballot goes out again as soon as the leaf link is back, or on
	// another connection: the hub stopped counting this voter when the old
	// one closed.
	v.SetLink(func() uint64 { return node.HubLink().ID })
	fxrun.Background(lc, log, "voter", v.Run)
	return v, nil
}
