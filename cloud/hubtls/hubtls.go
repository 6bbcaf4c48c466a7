// Package hubtls puts the embedded hub's leaf listener on TLS with a
// certificate atoll-cloud generates and rotates (cloud/certgen, kept in a
// Secret), and publishes the CA bundle the edges verify it with in a
// ConfigMap that the atoll-edge DaemonSet mounts (atoll-edge
// --hub-ca-file, re-read when it changes).
package hubtls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/cloud/certgen"
	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/internal/admin"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/wellknown"
)

// Defaults of Config.
const (
	DefaultSecret   = "atoll-hub-leaf-certs"
	DefaultCABundle = "atoll-hub-ca"
	// DefaultHost is the name the generated certificate carries, which
	// the edges check (atoll-edge --hub-tls-server-name) whatever
	// address they dial: a NodePort, a load balancer.
	DefaultHost = "atoll-hub.atoll-system.svc"
	// CAKey is the key of the CA bundle in the ConfigMap.
	CAKey = "ca.crt"
)

// Config says where the certificates live.
type Config struct {
	// Secret holds the CA and the serving certificate (created empty by
	// the manifests).
	Secret types.NamespacedName
	// CABundle is the ConfigMap the CA bundle is published to.
	CABundle types.NamespacedName
	// Hosts are the serving certificate's names.
	Hosts []string
	// CALifetime, CertLifetime and CheckInterval tune the rotation.
	CALifetime, CertLifetime, CheckInterval time.Duration
}

// DefaultConfig is the production configuration, in namespace ns.
func DefaultConfig(ns string) Config {
	return Config{
		Secret:     types.NamespacedName{Namespace: ns, Name: DefaultSecret},
		CABundle:   types.NamespacedName{Namespace: ns, Name: DefaultCABundle},
		Hosts:      []string{DefaultHost},
		CALifetime: 365 * 24 * time.Hour, CertLifetime: 30 * 24 * time.Hour, CheckInterval: time.Minute,
	}
}

func (c Config) certgen() certgen.Config {
	return certgen.Config{Secret: c.Secret, Hosts: c.Hosts, Purpose: "hub leaf",
		CALifetime: c.CALifetime, CertLifetime: c.CertLifetime, CheckInterval: c.CheckInterval}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	if c.CABundle.Name == "" || c.CABundle.Namespace == "" {
		return errors.New("hub leaf certificates: no CA bundle ConfigMap")
	}
	return c.certgen().Validate()
}

// Module generates the leaf certificate before the hub starts, provides it
// to cloud/hub (hub.LeafCertificates), rotates it and keeps the CA
// bundle's ConfigMap current. It needs a Config and a kubernetes.Interface.
var Module = fx.Module("hubtls", fx.Provide(newForApp))

type params struct {
	fx.In
	LC     fx.Lifecycle
	Cfg    Config
	Client kubernetes.Interface
	Log    *slog.Logger
	Admin  *admin.Server
}

func newForApp(p params) (hub.LeafCertificates, error) {
	if err := p.Cfg.Validate(); err != nil {
		return nil, err
	}
	m := certgen.Metrics{
		Rotations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "hub", Name: "leaf_cert_rotations_total",
			Help: "Changes to the hub leaf listener's generated certificates this replica wrote, by what changed (ca, serving, serving-to-new-ca, ca-expired-dropped).",
		}, []string{"what"}),
		Expiry: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "hub", Name: "leaf_cert_expiry_timestamp_seconds",
			Help: "When the hub leaf listener's generated certificate expires (Unix seconds).",
		}),
	}
	for _, w := range certgen.Reasons {
		m.Rotations.WithLabelValues(w)
	}
	p.Admin.Registerer().MustRegister(m.Rotations, m.Expiry)
	log := p.Log.With("component", "hubtls")
	rot, err := certgen.NewRotator(p.Client, p.Cfg.certgen(), log, m)
	if err != nil {
		return nil, err
	}
	pub := &publisher{client: p.Client, cm: p.Cfg.CABundle, log: log}
	// The hub depends on the certificates, so this hook runs before it
	// starts: it starts with a certificate, and the edges can find the CA.
	p.LC.Append(fx.StartHook(func(ctx context.Context) error {
		if err := rot.SyncUntilDone(ctx); err != nil {
			return err
		}
		bundle, _ := rot.CABundle()
		return retry(ctx, log, "publish the CA bundle", func(ctx context.Context) error { return pub.publish(ctx, bundle) })
	}))
	fxrun.Background(p.LC, log, "hub-leaf-certificates", rot.Run)
	fxrun.Background(p.LC, log, "hub-leaf-ca-bundle", func(ctx context.Context) error {
		for {
			bundle, changed := rot.CABundle()
			if err := retry(ctx, log, "publish the CA bundle", func(ctx context.Context) error { return pub.publish(ctx, bundle) }); err != nil {
				return nil // ctx ended
			}
			select {
			case <-ctx.Done():
				return nil
			case <-changed:
			}
		}
	})
	return rot, nil
}

// publisher keeps the CA bundle's ConfigMap current.
type publisher struct {
	client kubernetes.Interface
	cm     types.NamespacedName
	log    *slog.Logger
	last   string
}

// publish applies the bundle to the ConfigMap (server-side apply: it
// creates it, and writes nothing when it already holds the bundle).
func (p *publisher) publish(ctx context.Context, bundle []byte) error {
	if string(bundle) == p.last {
		return nil
	}
	cm := corev1ac.ConfigMap(p.cm.Name, p.cm.Namespace).
		WithLabels(map[string]string{"app.kubernetes.io/managed-by": "atoll-cloud"}).
		WithData(map[string]string{CAKey: string(bundle)})
	if _, err := p.client.CoreV1().ConfigMaps(p.cm.Namespace).Apply(ctx, cm, metav1.ApplyOptions{FieldManager: wellknown.FieldManager, Force: true}); err != nil {
		return fmt.Errorf("hub leaf certificates: apply ConfigMap %s: %w", p.cm, err)
	}
	p.last = string(bundle)
	p.log.Info("hub leaf CA bundle published", "configmap", p.cm.String())
	return nil
}

// retry runs f until it succeeds or ctx ends, backing off to 10 s.
func retry(ctx context.Context, log *slog.Logger, what string, f func(context.Context) error) error {
	delay := 250 * time.Millisecond
	for {
		err := f(ctx)
		if err == nil {
			return nil
		}
		log.Warn("hub leaf certificates: "+what+"; retrying", "in", delay, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 10*time.Second)
	}
}
