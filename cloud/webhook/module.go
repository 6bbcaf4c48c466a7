package webhook

import (
	"context"
	"log/slog"
	"time"

	"github.com/atoll-edge/atoll/cloud/kube"

	"go.uber.org/fx"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/internal/admin"
	"github.com/atoll-edge/atoll/internal/fxrun"
)

// Module runs the webhook server with the app. It needs a Config, a Policy
// (provided by the health service), a *slog.Logger and the *admin.Server
// (readiness check "webhook", metrics). With a RegistrationConfig whose
// Enabled is set, and a kubernetes.Interface, it also registers the webhook
// once the server listens, retrying with backoff until it succeeds.
var Module = fx.Module("webhook",
	fx.Provide(newForApp),
	fx.Invoke(func(*Server) {}),
)

type appParams struct {
	fx.In

	Lifecycle    fx.Lifecycle
	Config       Config
	Policy       Policy
	Log          *slog.Logger
	Admin        *admin.Server
	Registration RegistrationConfig   `optional:"true"`
	Client       kubernetes.Interface `optional:"true"`
}

func newForApp(p appParams) (*Server, error) {
	if p.Registration.Enabled {
		if err := p.Registration.Validate(); err != nil {
			return nil, err
		}
		if p.Client == nil {
			return nil, errNoClient
		}
	}
	// Route client-go's and controller-runtime's logs to ours.
	kube.RouteLogs(p.Log)

	s, err := New(p.Config, p.Policy, p.Log, p.Admin.Registry())
	if err != nil {
		return nil, err
	}
	p.Lifecycle.Append(fx.StartStopHook(s.Start, s.Stop))
	p.Admin.AddReadiness("webhook", func(context.Context) error { return s.Ready() })
	if p.Registration.Enabled {
		fxrun.Background(p.Lifecycle, p.Log, "webhook-registration", func(ctx context.Context) error {
			return registerUntilDone(ctx, p.Client, p.Registration, s.log)
		})
	}
	return s, nil
}

// registerUntilDone calls Register until it succeeds or ctx ends, backing
// off from 1s to 1m between attempts.
func registerUntilDone(ctx context.Context, client kubernetes.Interface, cfg RegistrationConfig, log *slog.Logger) error {
	name := cfg.withDefaults().Name
	delay := time.Second
	for {
		err := Register(ctx, client, cfg)
		if err == nil {
			log.Info("webhook registered", "name", name)
			return nil
		}
		if ctx.Err() != nil {
			return nil // stopping
		}
		log.Warn("register webhook; retrying", "name", name, "in", delay, "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Minute)
	}
}
