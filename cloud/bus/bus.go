// Package bus gives cloud services their connection to the hub: a NATS
// connection, a JetStream handle in the hub's domain, and the hub streams,
// created or updated when the service starts.
package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/admin"
)

// Bus is the service's link to the hub; usable once the app has started.
type Bus struct {
	nc *nats.Conn
	js jetstream.JetStream
}

// Of wraps an existing connection, for tests and tools that run a
// service without an app.
func Of(nc *nats.Conn, js jetstream.JetStream) *Bus { return &Bus{nc: nc, js: js} }

// Conn is the NATS connection.
func (b *Bus) Conn() *nats.Conn { return b.nc }

// JetStream is the hub's JetStream.
func (b *Bus) JetStream() jetstream.JetStream { return b.js }

// Module provides *Bus and *events.Metrics for the app's cloud services.
var Module = fx.Module("bus",
	fx.Provide(newForApp, func(reg prometheus.Registerer) *events.Metrics { return events.NewMetrics(reg) }),
)

func newForApp(lc fx.Lifecycle, h *hub.Hub, streams events.StreamOptions, log *slog.Logger, adm *admin.Server) (*Bus, error) {
	if err := streams.Validate(); err != nil {
		return nil, err
	}
	b := &Bus{}
	lc.Append(fx.Hook{
		OnStart: func(ctx context.Context) error {
			nc, err := h.Connect("atoll-cloud",
				nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("hub connection lost", "err", err) }),
				nats.ReconnectHandler(func(*nats.Conn) { log.Info("hub connection restored") }))
			if err != nil {
				return err
			}
			js, err := jetstream.NewWithDomain(nc, h.Domain())
			if err != nil {
				nc.Close()
				return fmt.Errorf("bus: jetstream: %w", err)
			}
			if err := events.EnsureStreams(ctx, js, streams); err != nil {
				nc.Close()
				return err
			}
			b.nc, b.js = nc, js
			return nil
		},
		OnStop: func(context.Context) error {
			if b.nc == nil {
				return nil
			}
			return b.nc.Drain()
		},
	})
	adm.AddReadiness("bus", func(context.Context) error {
		if b.nc == nil || !b.nc.IsConnected() {
			return errors.New("not connected to the hub")
		}
		return nil
	})
	return b, nil
}
