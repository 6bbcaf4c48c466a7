// Package hubclient connects atoll-cloud to the hub like any NATS client:
// it dials the hub's URLs with the service's credentials (an external hub,
// or the embedded one through its client URL), reconciles the hub streams,
// and provides the *hublink.Link that every cloud service uses.
package hubclient

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/admin"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
)

// Endpoint says where the hub is and how to log in. It is asked at start,
// because an embedded hub knows its client URL only once it listens.
type Endpoint interface {
	ClientConfig() hublink.ClientConfig
}

// Static is an Endpoint given by configuration (--hub-url and friends).
type Static hublink.ClientConfig

// ClientConfig returns c.
func (c Static) ClientConfig() hublink.ClientConfig { return hublink.ClientConfig(c) }

// ConnName is the connection name the cloud services show on the hub.
const ConnName = "atoll-cloud"

// Module provides *hublink.Link (dialled at start, drained at stop, ready
// while connected, hub streams reconciled) and *eventbus.Metrics. It needs an
// Endpoint, events.StreamOptions, a *slog.Logger and the admin server.
var Module = fx.Module("hubclient",
	fx.Provide(newForApp, func(reg prometheus.Registerer) *eventbus.Metrics { return eventbus.NewMetrics(reg) }),
)

// waitNotice is how long the streams' reconciliation at start may take
// before a WARN says what atoll-cloud waits for.
const waitNotice = 5 * time.Second

func newForApp(lc fx.Lifecycle, ep Endpoint, streams events.StreamOptions, log *slog.Logger, adm *admin.Server) (*hublink.Link, error) {
	if err := streams.Validate(); err != nil {
		return nil, err
	}
	log = log.With("component", "hubclient")
	// The domain is configuration, known before start; the URL of an
	// embedded hub is not, so the dialer asks the endpoint at start.
	link := hublink.New(ep.ClientConfig().Domain, func(ctx context.Context) (*nats.Conn, error) {
		return ep.ClientConfig().Dialer(ConnName, log)(ctx)
	}, log)
	lc.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			if err := link.Start(ctx); err != nil {
				return err
			}
			// A hub cluster that starts with atoll-cloud (a fresh install,
			// the whole cluster restarted) answers JetStream requests only
			// once its servers have elected their leaders: the
			// reconciliation retries until then, within the start timeout.
			waiting := time.AfterFunc(waitNotice, func() {
				log.Warn("waiting for the hub's JetStream to create or update the streams", "after", waitNotice.String())
			})
			changes, err := eventbus.ReconcileStreams(ctx, link.JetStream(), streams)
			waiting.Stop()
			for _, ch := range changes {
				if ch.Created {
					log.Info("stream created", "stream", ch.Stream, "replicas", streams.Replicas)
				} else {
					log.Info("stream updated", "stream", ch.Stream, "fields", ch.Fields)
				}
			}
			if err != nil {
				_ = link.Stop(ctx)
				return fmt.Errorf("hubclient: %w", err)
			}
			return nil
		},
		OnStop: link.Stop,
	})
	adm.AddReadiness("hub-link", link.Ready)
	adm.Registerer().MustRegister(link.Collector(ConnName))
	return link, nil
}
