// Package hublink is a process's link to the cloud hub: one NATS
// connection, a JetStream handle in the hub's JetStream domain, and the
// readiness check "connected". atoll-edge links through its own node's
// server (in process; the leaf link carries the traffic to the hub) and
// atoll-cloud dials the hub by URL (ClientConfig), but both hold the same
// Link: connected at start, drained at stop.
package hublink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Dialer opens the link's connection. It returns once connected or when
// ctx is done; the connection reconnects by itself afterwards.
type Dialer func(ctx context.Context) (*nats.Conn, error)

// Link is a connection to the hub and its JetStream. Conn and JetStream
// are usable once Start has returned.
type Link struct {
	domain string
	dial   Dialer
	log    *slog.Logger

	mu sync.RWMutex
	nc *nats.Conn
	js jetstream.JetStream
}

// New returns a link that dials with dial and addresses JetStream in
// domain (empty: the connected server's own domain).
func New(domain string, dial Dialer, log *slog.Logger) *Link {
	return &Link{domain: domain, dial: dial, log: log}
}

// Of wraps an open connection and JetStream handle, for tests and tools
// that run a component without an app.
func Of(nc *nats.Conn, js jetstream.JetStream) *Link { return &Link{nc: nc, js: js} }

// Start dials the hub.
func (l *Link) Start(ctx context.Context) error {
	nc, err := l.dial(ctx)
	if err != nil {
		return err
	}
	var js jetstream.JetStream
	if l.domain != "" {
		js, err = jetstream.NewWithDomain(nc, l.domain)
	} else {
		js, err = jetstream.New(nc)
	}
	if err != nil {
		nc.Close()
		return fmt.Errorf("hub link: jetstream in domain %q: %w", l.domain, err)
	}
	l.mu.Lock()
	l.nc, l.js = nc, js
	l.mu.Unlock()
	return nil
}

// Stop drains the connection: pending publishes are flushed and
// subscriptions finish their messages, at most until ctx is done.
func (l *Link) Stop(ctx context.Context) error {
	l.mu.RLock()
	nc := l.nc
	l.mu.RUnlock()
	if nc == nil || nc.IsClosed() {
		return nil
	}
	closed := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	if err := nc.Drain(); err != nil {
		nc.Close()
		return fmt.Errorf("hub link: drain: %w", err)
	}
	select {
	case <-closed:
		return nil
	case <-ctx.Done():
		nc.Close()
		return fmt.Errorf("hub link: drain: %w", ctx.Err())
	}
}

// Conn is the NATS connection (nil before Start).
func (l *Link) Conn() *nats.Conn {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.nc
}

// JetStream is the hub's JetStream (nil before Start).
func (l *Link) JetStream() jetstream.JetStream {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.js
}

// Ready is the link's readiness check: nil while connected.
func (l *Link) Ready(context.Context) error {
	nc := l.Conn()
	switch {
	case nc == nil:
		return errors.New("not started")
	case !nc.IsConnected():
		if err := nc.LastError(); err != nil {
			return fmt.Errorf("not connected to the hub (%s): %w", nc.Status(), err)
		}
		return fmt.Errorf("not connected to the hub (%s)", nc.Status())
	}
	return nil
}

// Options are the connection options every link uses: a name, reconnect
// forever, and a log line for every disconnect and reconnect.
func Options(name string, log *slog.Logger) []nats.Option {
	return []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err == nil { // closed on purpose
				log.Debug("hub connection closed", "conn", name)
				return
			}
			log.Warn("hub connection lost", "conn", name, "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("hub connection restored", "conn", name, "server", nc.ConnectedUrlRedacted(), "server_name", nc.ConnectedServerName())
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Debug("hub reconnect attempt failed", "conn", name, "err", err)
		}),
	}
}
