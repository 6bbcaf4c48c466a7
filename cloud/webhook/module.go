package webhook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/atoll-edge/atoll/cloud/certgen"
	"github.com/atoll-edge/atoll/cloud/kube"

	"go.uber.org/fx"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/internal/admin"
	"github.com/atoll-edge/atoll/internal/fxrun"
)

// Module runs the webhook server with the app. It needs a Config, a Policy
// (provided by the health service), a *slog.Logger and the *admin.Server
// (readiness check "webhook", metrics). With a RegistrationConfig whose
// Enabled is set, and a kubernetes.Interface, it also registers the webhook
// once the server listens, retrying with backoff until it succeeds. With
// Config.Certs CertsGenerate (and a kubernetes.Interface) it generates and
// renews the certificates (cloud/certgen) and registers again whenever the CA
// bundle changes.
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
	cfg, reg := p.Config.withDefaults(), p.Registration
	generate := cfg.Certs == CertsGenerate
	if cfg.Certs == CertsCertManager {
		reg.CAInjected = true
	}
	if reg.Enabled {
		if err := reg.ValidateFor(cfg); err != nil {
			return nil, err
		}
	}
	if (reg.Enabled || generate) && p.Client == nil {
		return nil, errNoClient
	}
	// Route client-go's and controller-runtime's logs to ours.
	kube.RouteLogs(p.Log)

	s, err := New(cfg, p.Policy, p.Log, p.Admin.Registerer())
	if err != nil {
		return nil, err
	}
	var rot *certgen.Rotator
	if generate {
		hosts, err := servingHosts(reg.withDefaults())
		if err != nil {
			return nil, err
		}
		d := cfg.withDefaults()
		if rot, err = certgen.NewRotator(p.Client, certgen.Config{
			Secret:     types.NamespacedName{Namespace: d.CertSecret.Namespace, Name: d.CertSecret.Name},
			Hosts:      hosts,
			Purpose:    "webhook",
			CALifetime: d.CALifetime, CertLifetime: d.CertLifetime, CheckInterval: d.CertCheckInterval,
		}, s.log, certgen.Metrics{Rotations: s.metrics.rotations, Expiry: s.metrics.certExpiry}); err != nil {
			return nil, err
		}
		s.UseCertificates(rot)
		// A certificate before the server starts; then renewals.
		p.Lifecycle.Append(fx.StartHook(func(ctx context.Context) error { return rot.SyncUntilDone(ctx) }))
		fxrun.Background(p.Lifecycle, p.Log, "webhook-certificates", rot.Run)
	}
	p.Lifecycle.Append(fx.StartStopHook(s.Start, s.Stop))
	p.Admin.AddReadiness("webhook", func(context.Context) error { return s.Ready() })
	if reg.Enabled {
		fxrun.Background(p.Lifecycle, p.Log, "webhook-registration", func(ctx context.Context) error {
			if rot == nil {
				return registerUntilDone(ctx, p.Client, reg, s.log)
			}
			// Register again whenever the generated bundle changes.
			for {
				bundle, changed := rot.CABundle()
				reg.CABundle = bundle
				if err := registerUntilDone(ctx, p.Client, reg, s.log); err != nil || ctx.Err() != nil {
					return err
				}
				select {
				case <-ctx.Done():
					return nil
				case <-changed:
				}
			}
		})
	}
	return s, nil
}

// servingHosts are the names the apiserver reaches the webhook by: the
// URL's host, or the Service's DNS names.
func servingHosts(reg RegistrationConfig) ([]string, error) {
	if reg.URL != "" {
		u, err := url.Parse(reg.URL)
		if err != nil || u.Hostname() == "" {
			return nil, fmt.Errorf("webhook registration: url %q: no host", reg.URL)
		}
		return []string{u.Hostname()}, nil
	}
	if reg.Service.Name == "" || reg.Service.Namespace == "" {
		return nil, errors.New("webhook certificates: no webhook url or service to issue the serving certificate for")
	}
	svc := reg.Service.Name + "." + reg.Service.Namespace
	return []string{svc + ".svc", svc, svc + ".svc.cluster.local"}, nil
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
