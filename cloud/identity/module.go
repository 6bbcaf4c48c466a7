package identity

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/cloud/hubclient"
	"github.com/atoll-edge/atoll/internal/hublink"
)

// Module runs the identity service with the app. It needs a Config, an
// *Issuer (the keys), the hub Endpoint and the *hublink.Link; a
// *Kubernetes in the app turns on Kubernetes enrollment, a Durable keeps
// the registry's revocations outside the hub.
var Module = fx.Module("identity",
	fx.Provide(newForApp),
	fx.Invoke(func(*Service) {}),
)

type params struct {
	fx.In
	Lifecycle fx.Lifecycle
	Config    Config
	Issuer    *Issuer
	Endpoint  hubclient.Endpoint
	Link      *hublink.Link
	Log       *slog.Logger
	Registry  prometheus.Registerer
	// Kubernetes, when the app provides it, turns on enrollment by the
	// pods' ServiceAccount tokens.
	Kubernetes *Kubernetes `optional:"true"`
	// Durable, when the app provides it, keeps the registry's
	// revocations outside the hub (KeepDurable).
	Durable Durable `optional:"true"`
}

func newForApp(p params) (*Service, error) {
	s, err := NewService(p.Config, p.Issuer, nil, nil, p.Log, NewMetrics(p.Registry))
	if err != nil {
		return nil, err
	}
	if p.Kubernetes != nil {
		s.EnrollKubernetes(p.Kubernetes)
	}
	if p.Durable != nil {
		s.KeepDurable(p.Durable)
	}
	p.Lifecycle.Append(fx.Hook{
		// The link is connected by now: its start hook ran first.
		OnStart: func(ctx context.Context) error {
			sys, err := DialSystem(ctx, p.Endpoint.ClientConfig(), p.Issuer, p.Log)
			if err != nil {
				return err
			}
			s.nc = p.Link.Conn()
			s.useSystem(sys)
			s.closeSys = sys.Close
			return s.Start(ctx)
		},
		OnStop: func(context.Context) error { return s.Stop() },
	})
	return s, nil
}

// DialSystem connects to the hub of cfg as a system account user issued on
// the spot, for account updates.
func DialSystem(ctx context.Context, cfg hublink.ClientConfig, issuer *Issuer, log *slog.Logger) (*nats.Conn, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	pub, _ := kp.PublicKey()
	userJWT, err := issuer.System("atoll-cloud", pub)
	if err != nil {
		return nil, err
	}
	cfg.CredsFile, cfg.NkeySeedFile, cfg.User, cfg.Password = "", "", "", ""
	cfg.Nkey, cfg.UserJWT = kp, userJWT
	nc, err := cfg.Dialer("atoll-cloud-system", log)(ctx)
	if err != nil {
		return nil, fmt.Errorf("identity: system connection: %w", err)
	}
	return nc, nil
}
