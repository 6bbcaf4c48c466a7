package natsnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/admin"
)

// Link is the agent's connection to its node's server and, through the
// leaf link, to the hub's JetStream. Usable once the app has started.
type Link struct {
	nc *nats.Conn
	js jetstream.JetStream
}

// Conn is the in-process connection to the node's server.
func (l *Link) Conn() *nats.Conn { return l.nc }

// HubJetStream addresses the hub's JetStream domain through the leaf link.
func (l *Link) HubJetStream() jetstream.JetStream { return l.js }

// LinkOf wraps an existing connection, for tests.
func LinkOf(nc *nats.Conn, js jetstream.JetStream) *Link { return &Link{nc: nc, js: js} }

// Module runs the node's NATS server with the app and provides *Node,
// *Link and *events.Metrics.
var Module = fx.Module("natsnode",
	fx.Provide(newForApp, newLink, func(reg prometheus.Registerer) *events.Metrics { return events.NewMetrics(reg) }),
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
		if !n.Status().HubConnected {
			return errors.New("leaf link to the hub is down")
		}
		return nil
	})
	adm.Registry().MustRegister(newCollector(n))
	return n, nil
}

func newLink(lc fx.Lifecycle, n *Node, cfg Config, log *slog.Logger) *Link {
	l := &Link{}
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			nc, err := n.Connect("atoll-edge")
			if err != nil {
				return err
			}
			js, err := jetstream.NewWithDomain(nc, cfg.HubDomain)
			if err != nil {
				nc.Close()
				return fmt.Errorf("natsnode: hub jetstream: %w", err)
			}
			l.nc, l.js = nc, js
			return nil
		},
		OnStop: func(context.Context) error {
			if l.nc == nil {
				return nil
			}
			return l.nc.Drain()
		},
	})
	return l
}
