// Package natsembed holds what Atoll's two embedded NATS servers (the
// cloud hub and each edge node's server) do alike: start and wait for
// readiness, shut down within a context, and open in-process connections authenticated with an nkey.
package natsembed

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Shutdown stops srv, waiting at most until ctx is done.
func Shutdown(ctx context.Context, srv *server.Server) error {
	done := make(chan struct{})
	go func() {
		srv.Shutdown()
		srv.WaitForShutdown()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("shutdown %s: %w", srv.Name(), ctx.Err())
	}
}

// Connect opens an in-process connection to srv as the nkey user kp.
// It reconnects forever: the server outlives its clients.
func Connect(srv *server.Server, kp nkeys.KeyPair, name string, opts ...nats.Option) (*nats.Conn, error) {
	return ConnectJWT(srv, kp, "", name, opts...)
}

// ConnectJWT is Connect for a server in operator mode: userJWT is the
// user JWT of kp's public key (empty: plain nkey authentication).
func ConnectJWT(srv *server.Server, kp nkeys.KeyPair, userJWT, name string, opts ...nats.Option) (*nats.Conn, error) {
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	auth := nats.Nkey(pub, kp.Sign)
	if userJWT != "" {
		auth = nats.UserJWT(func() (string, error) { return userJWT, nil }, kp.Sign)
	}
	all := append([]nats.Option{
		nats.Name(name),
		nats.InProcessServer(srv),
		auth,
		nats.MaxReconnects(-1),
	}, opts...)
	nc, err := nats.Connect("", all...)
	if err != nil {
		return nil, fmt.Errorf("connect %s to %s: %w", name, srv.Name(), err)
	}
	return nc, nil
}

// Start runs srv and waits until it accepts connections, at most until
// ctx's deadline (10 s without one). fatal, when not nil, reports a fatal
// error the server logged (natslog.Logger.Fatal): a listener that cannot
// bind its port fails the start at once with that error, instead of
// leaving a server that runs without it. A server that does not become
// ready is shut down.
func Start(ctx context.Context, srv *server.Server, fatal func() error) error {
	srv.Start()
	wait := 10 * time.Second
	if d, ok := ctx.Deadline(); ok {
		wait = time.Until(d)
	}
	deadline := time.Now().Add(wait)
	for {
		if srv.ReadyForConnections(50 * time.Millisecond) {
			return nil
		}
		var err error
		if fatal != nil {
			err = fatal()
		}
		if err == nil && time.Now().After(deadline) {
			err = errors.New("server not ready for connections")
		}
		if err != nil {
			srv.Shutdown()
			return fmt.Errorf("start %s: %w", srv.Name(), err)
		}
	}
}
