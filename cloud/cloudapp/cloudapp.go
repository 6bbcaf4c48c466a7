// Package cloudapp composes atoll-cloud: the embedded hub and the cloud
// services, as one fx application.
package cloudapp

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"
	"sigs.k8s.io/yaml"

	"github.com/atoll-edge/atoll/cloud/bus"
	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/cloud/kube"
	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/cloud/status"
	"github.com/atoll-edge/atoll/cloud/topology"
	"github.com/atoll-edge/atoll/cloud/webhook"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/admin"
	"github.com/atoll-edge/atoll/internal/logging"
)

// Config is atoll-cloud's whole configuration.
type Config struct {
	Log      logging.Config
	Admin    admin.Config
	Hub      hub.Config
	Streams  events.StreamOptions
	Topology topology.Config
	// Kube, Health and Webhook are used with the kubernetes membership
	// source; a fabric without Kubernetes (source "declared") runs only
	// the hub and topology.
	Kube         kube.Config
	Manager      manager.Config
	Health       health.Config
	Webhook      webhook.Config
	Registration webhook.RegistrationConfig
	// OperatorsFile is a YAML map of operator user → password (or bcrypt
	// hash), merged into Hub.Operators.
	OperatorsFile string
}

// Default is the production configuration.
func Default() Config {
	return Config{
		Log:      logging.Default(),
		Admin:    admin.Config{Addr: ":8080"},
		Hub:      hub.Default(),
		Streams:  events.DefaultStreamOptions(),
		Topology: topology.DefaultConfig(),
		Kube:     kube.DefaultConfig(),
		Manager:  manager.DefaultConfig(),
		Health:   health.DefaultConfig(),
		Webhook:  webhook.DefaultConfig(),
		Registration: webhook.RegistrationConfig{
			Enabled: true,
			Service: webhook.ServiceRef{Namespace: "atoll-system", Name: "atoll-cloud-webhook"},
			CAFile:  "/etc/atoll/webhook/ca.crt",
		},
	}
}

// RegisterFlags binds c's fields to flags of fs.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Log.Level, "log-level", c.Log.Level, "log level: debug, info, warn, error")
	fs.StringVar(&c.Log.Format, "log-format", c.Log.Format, "log format: json or text")
	fs.StringVar(&c.Admin.Addr, "admin-addr", c.Admin.Addr, "listen address of /healthz, /readyz and /metrics")
	fs.StringVar(&c.Hub.ServerName, "hub-name", c.Hub.ServerName, "hub server name (unique in the hub cluster)")
	fs.StringVar(&c.Hub.Host, "hub-host", c.Hub.Host, "interface the hub's client and leaf listeners bind to")
	fs.IntVar(&c.Hub.ClientPort, "hub-client-port", c.Hub.ClientPort, "hub client port for services and operators (-1: random)")
	fs.IntVar(&c.Hub.LeafPort, "hub-leaf-port", c.Hub.LeafPort, "hub leafnode port for edge nodes (-1: random)")
	fs.StringVar(&c.Hub.LeafAdvertise, "hub-leaf-advertise", c.Hub.LeafAdvertise, "leaf address gossiped to edges (empty: none)")
	fs.StringVar(&c.Hub.StoreDir, "hub-store-dir", c.Hub.StoreDir, "JetStream storage directory")
	fs.StringVar(&c.Hub.Domain, "hub-domain", c.Hub.Domain, "JetStream domain of the hub")
	fs.Int64Var(&c.Hub.MaxMemory, "hub-max-memory", c.Hub.MaxMemory, "JetStream memory limit in bytes (0: server default)")
	fs.Int64Var(&c.Hub.MaxStore, "hub-max-store", c.Hub.MaxStore, "JetStream storage limit in bytes (0: server default)")
	fs.StringVar(&c.Hub.EdgeKeysFile, "edge-keys-file", c.Hub.EdgeKeysFile, "YAML map of node name to its nkey public key")
	fs.StringVar(&c.OperatorsFile, "operators-file", c.OperatorsFile, "YAML map of operator user to password or bcrypt hash")
	fs.IntVar(&c.Streams.Replicas, "stream-replicas", c.Streams.Replicas, "replicas of the hub streams (1, or 3 for a hub cluster)")
	fs.DurationVar(&c.Topology.NodeTTL, "node-ttl", c.Topology.NodeTTL, "declared source: drop a node from its unit after this long without a topology report")
	fs.StringVar(&c.Topology.Source, "membership-source", c.Topology.Source, "where units come from: kubernetes (a node label) or declared (the agents' --unit)")
	fs.StringVar(&c.Topology.UnitLabel, "unit-label", c.Topology.UnitLabel, "node label whose value names the node's unit")
	fs.StringVar(&c.Kube.Kubeconfig, "kubeconfig", c.Kube.Kubeconfig, "kubeconfig file (empty: in-cluster)")
	fs.BoolVar(&c.Manager.LeaderElect, "leader-elect", c.Manager.LeaderElect, "only the holder of a Lease writes to Kubernetes (required with more than one replica)")
	fs.StringVar(&c.Manager.LeaderElectionID, "leader-election-id", c.Manager.LeaderElectionID, "name of the leader election Lease")
	fs.StringVar(&c.Manager.LeaderElectionNamespace, "leader-election-namespace", c.Manager.LeaderElectionNamespace, "namespace of the leader election Lease")
	fs.DurationVar(&c.Health.HoldTime, "hold-time", c.Health.HoldTime, "keep the pods of a unit cut off entirely from the cloud this long (0: never)")
	fs.DurationVar(&c.Health.VoteTTL, "vote-ttl", c.Health.VoteTTL, "lifetime of a vote that carries no TTL")
	fs.StringVar(&c.Webhook.Addr, "webhook-addr", c.Webhook.Addr, "listen address of the mutating admission webhook")
	fs.StringVar(&c.Webhook.CertDir, "webhook-cert-dir", c.Webhook.CertDir, "directory with the webhook's tls.crt and tls.key")
	fs.BoolVar(&c.Registration.Enabled, "webhook-register", c.Registration.Enabled, "create or update the MutatingWebhookConfiguration at start")
	fs.StringVar(&c.Registration.URL, "webhook-url", c.Registration.URL, "https URL the apiserver calls (instead of --webhook-service)")
	fs.StringVar(&c.Registration.Service.Namespace, "webhook-service-namespace", c.Registration.Service.Namespace, "namespace of the webhook Service")
	fs.StringVar(&c.Registration.Service.Name, "webhook-service", c.Registration.Service.Name, "name of the webhook Service (empty with --webhook-url)")
	fs.StringVar(&c.Registration.CAFile, "webhook-ca-file", c.Registration.CAFile, "CA bundle that signs the webhook certificate, for the registration")
}

// Load finishes the configuration: reads the operators file.
func (c *Config) Load() error {
	if c.OperatorsFile == "" {
		return nil
	}
	data, err := os.ReadFile(filepath.Clean(c.OperatorsFile))
	if err != nil {
		return fmt.Errorf("operators file: %w", err)
	}
	ops := map[string]string{}
	if err := yaml.UnmarshalStrict(data, &ops); err != nil {
		return fmt.Errorf("operators file %s: %w", c.OperatorsFile, err)
	}
	if c.Hub.Operators == nil {
		c.Hub.Operators = map[string]string{}
	}
	for u, p := range ops {
		c.Hub.Operators[u] = p
	}
	return nil
}

// Kubernetes reports whether the app runs its Kubernetes side (health
// service and webhook).
func (c Config) Kubernetes() bool { return c.Topology.Source == topology.SourceKubernetes }

// Validate checks every component's configuration.
func (c Config) Validate() error {
	checks := []interface{ Validate() error }{c.Admin, c.Hub, c.Streams, c.Topology}
	if c.Kubernetes() {
		checks = append(checks, c.Kube, c.Manager, c.Health, c.Webhook)
		if c.Registration.Enabled {
			checks = append(checks, c.Registration)
		}
	}
	for _, v := range checks {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// Options is the atoll-cloud application.
func Options(c Config, log *slog.Logger) fx.Option {
	c.Topology.Replicas = c.Streams.Replicas
	c.Health.Replicas = c.Streams.Replicas
	c.Health.UnitLabel = c.Topology.UnitLabel
	c.Registration.UnitLabel = c.Topology.UnitLabel
	k8s := fx.Options()
	if c.Kubernetes() {
		k8s = fx.Options(
			fx.Supply(c.Kube, c.Manager, c.Health, c.Webhook, c.Registration),
			kube.Module,
			manager.Module,
			health.Module,
			webhook.Module,
			status.Module,
		)
	}
	return fx.Options(
		fx.Supply(c.Admin, c.Hub, c.Streams, c.Topology, log),
		fx.WithLogger(func() fxevent.Logger {
			l := &fxevent.SlogLogger{Logger: log.With("component", "fx")}
			l.UseLogLevel(slog.LevelDebug)
			return l
		}),
		admin.Module,
		hub.Module,
		bus.Module,
		topology.Module,
		k8s,
	)
}
