package natsnode

import (
	"context"
	"errors"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/internal/admin"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
)

// Module runs the node's NATS server with the app and provides *Node,
// the agent's *hublink.Link and *eventbus.Metrics. The link connects to the
// node's own server in process and addresses the hub's JetStream domain
// through the leaf link.
var Module = fx.Module("natsnode",
	fx.Provide(newForApp, newLink, func(reg prometheus.Registerer) *eventbus.Metrics { return eventbus.NewMetrics(reg) }),
)

func newForApp(lc fx.Lifecycle, cfg Config, log *slog.Logger, adm *admin.Server) (*Node, error) {
	n, err := New(cfg, log)
	if err != nil {
		return nil, err
	}
	lc.Append(fx.StartStopHook(n.Start, n.Shutdown))
	adm.AddReadiness("natsnode", func(context.Context) error {
		if !n.srv.Running() {
			return errors.New("edge server not running")
		}
		return nil
	})
	adm.AddReadiness("hub-link", func(context.Context) error {
		if n.EnrollmentPending() {
			return errors.New("waiting for the enrollment credentials (the Secret atoll-edge-enroll, which atoll-cloud fills)")
		}
		if !n.Status().HubConnected {
			return errors.New("leaf link to the hub is down")
		}
		return nil
	})
	adm.Registerer().MustRegister(newCollector(n))
	return n, nil
}

// newLink is the agent's link: its node's server, in process.
func newLink(lc fx.Lifecycle, n *Node, cfg Config, log *slog.Logger) *hublink.Link {
	log = log.With("component", "natsnode")
	l := hublink.New(cfg.HubDomain, func(context.Context) (*nats.Conn, error) {
		return n.Connect("atoll-edge", hublink.Options("atoll-edge", log)...)
	}, log)
	lc.Append(fx.StartStopHook(l.Start, l.Stop))
	return l
}
