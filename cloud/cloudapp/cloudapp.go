// Package cloudapp composes atoll-cloud: the cloud services, which dial
// the hub by URL, and the embedded hub, started only when no hub URL is
// given, as one fx application.
package cloudapp

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/cloud/console"
	"github.com/atoll-edge/atoll/cloud/grid"
	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/cloud/hubclient"
	"github.com/atoll-edge/atoll/cloud/hubtls"
	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/cloud/kube"
	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/cloud/status"
	"github.com/atoll-edge/atoll/cloud/tunnel"
	"github.com/atoll-edge/atoll/cloud/units"
	"github.com/atoll-edge/atoll/cloud/views/hostrecords"
	"github.com/atoll-edge/atoll/cloud/views/members"
	"github.com/atoll-edge/atoll/cloud/views/objects"
	"github.com/atoll-edge/atoll/cloud/webhook"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/admin"
	"github.com/atoll-edge/atoll/internal/cliflags"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/logging"
)

// Config is atoll-cloud's whole configuration.
type Config struct {
	Log   logging.Config
	Admin admin.Config
	// HubLink is how the services dial the hub. With no URL they dial
	// the embedded hub (Hub), which the app then runs.
	HubLink hublink.ClientConfig
	// Hub configures the embedded hub; unused with an external hub.
	Hub     hub.Config
	Streams events.StreamOptions
	// Units says which unit each Node is in (kubernetes membership
	// source); every service that groups Nodes into units reads it.
	Units   units.Rule
	Members members.Config
	// Kube, Health and Webhook are used with the kubernetes membership
	// source; a fabric without Kubernetes (source "declared") runs only
	// the hub and topology.
	Kube         kube.Config
	Manager      manager.Config
	Health       health.Config
	Webhook      webhook.Config
	Registration webhook.RegistrationConfig
	// Grid runs the grid workload controllers (cloud/grid) on the
	// manager, with the kubernetes membership source.
	Grid grid.Config
	// IdentityDir holds the identity keys and trust (cloud/identity): the
	// embedded hub creates them on its first start (default:
	// <hub store dir>/identity); with an external hub they must exist
	// (the servers are configured to trust them) and it is required.
	IdentityDir string
	// IdentitySecretName is the Secret of atoll-cloud's namespace that keeps
	// the embedded hub's identity (cloud/identity.SyncSecret: filled from
	// IdentityDir on the first start, restored into it when the volume is
	// new) and the registry's revocations (identity.SecretDurable)
	// (kubernetes source).
	IdentitySecretName string
	Identity           identity.Config

	// Tunnel is the tunnel server (CONNECT listener and port forwards).
	Tunnel tunnel.Config

	// ObjectViews publishes views of Services, EndpointSlices, Endpoints
	// and Nodes for the edge proxies, once for all units and each unit's
	// own Nodes in full (kubernetes source only).
	ObjectViews objects.Config

	// HostRecords publishes the StatefulSetGrid DNS records of each unit
	// for the edge hosts writers (with the grid controllers).
	HostRecords hostrecords.Config

	// Console is the status page under /ui/ on the admin listener
	// (kubernetes source only).
	Console console.Config

	// HubLeafCerts is where the hub's leaf certificate comes from: ""
	// (the --hub-leaf-tls-* files of the embedded hub, or none: plain
	// leaf links) or "generate" (cloud/hubtls; needs Kubernetes). With an
	// external hub, generate only keeps the Secret the hub servers mount
	// and the CA bundle current.
	HubLeafCerts string
	// HubLeafHosts are the generated leaf certificate's names.
	HubLeafHosts []string

	// KubernetesEnrollment enrolls edge nodes by their atoll-edge pods'
	// ServiceAccount tokens (kubernetes source only).
	KubernetesEnrollment bool
}

// HubLeafCertsGenerate has atoll-cloud generate and rotate the hub's
// leaf certificate (Config.HubLeafCerts).
const HubLeafCertsGenerate = "generate"

// Default is the production configuration.
func Default() Config {
	return Config{
		Log: logging.Default(),
		// A port-forward to the status page (/ui/) arrives from loopback.
		Admin:       admin.Config{Addr: "127.0.0.1:8080", LoopbackPeers: true},
		HubLink:     hublink.ClientConfig{Domain: hublink.DefaultDomain},
		Hub:         hub.Default(),
		Streams:     events.DefaultStreamOptions(),
		Units:       units.DefaultRule(),
		Members:     members.DefaultConfig(),
		Kube:        kube.DefaultConfig(),
		Manager:     manager.DefaultConfig(),
		Health:      health.DefaultConfig(),
		Webhook:     webhook.DefaultConfig(),
		Identity:    identity.DefaultConfig(),
		Grid:        grid.DefaultConfig(),
		Tunnel:      tunnel.DefaultConfig(),
		ObjectViews: objects.DefaultConfig(),
		HostRecords: hostrecords.DefaultConfig(),
		Console:     console.DefaultConfig(),
		// Nodes join by being nodes: their atoll-edge pods prove it.
		KubernetesEnrollment: true,
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
	c.Admin.RegisterFlags(fs)
	fs.BoolVar(&c.Console.Enabled, "console", c.Console.Enabled, "serve the live status page under /ui/ on the admin listener (--admin-addr; same access as the other admin endpoints)")
	fs.Var((*cliflags.List)(&c.HubLink.URLs), "hub-url", "external hub: comma-separated nats:// or tls:// URLs of its servers (empty: run the embedded hub)")
	fs.StringVar(&c.HubLink.Domain, "hub-domain", c.HubLink.Domain, "JetStream domain of the hub")
	fs.StringVar(&c.HubLink.CredsFile, "hub-creds-file", c.HubLink.CredsFile, "external hub: NATS credentials file of the service (default: atoll-cloud issues its own with the --identity-dir keys)")
	fs.StringVar(&c.HubLink.TLS.CAFile, "hub-tls-ca", c.HubLink.TLS.CAFile, "external hub: CA bundle that signs the hub's certificate (turns TLS on)")
	fs.StringVar(&c.HubLink.TLS.CertFile, "hub-tls-cert", c.HubLink.TLS.CertFile, "external hub: client certificate (turns TLS on)")
	fs.StringVar(&c.HubLink.TLS.KeyFile, "hub-tls-key", c.HubLink.TLS.KeyFile, "external hub: client certificate's key")
	fs.StringVar(&c.Hub.ServerName, "hub-name", c.Hub.ServerName, "hub server name (unique in the hub cluster)")
	fs.StringVar(&c.Hub.Host, "hub-host", c.Hub.Host, "interface the hub's client and leaf listeners bind to")
	fs.IntVar(&c.Hub.ClientPort, "hub-client-port", c.Hub.ClientPort, "hub client port for services and operators (-1: random)")
	fs.IntVar(&c.Hub.LeafPort, "hub-leaf-port", c.Hub.LeafPort, "hub leafnode port for edge nodes (-1: random)")
	fs.StringVar(&c.Hub.LeafAdvertise, "hub-leaf-advertise", c.Hub.LeafAdvertise, "leaf address gossiped to edges (empty: none)")
	fs.StringVar(&c.Hub.LeafTLS.CertFile, "hub-leaf-tls-cert", c.Hub.LeafTLS.CertFile, "embedded hub: PEM certificate (with chain) the leaf listener requires TLS with; re-read when it changes (empty: plain leaf links)")
	fs.StringVar(&c.Hub.LeafTLS.KeyFile, "hub-leaf-tls-key", c.Hub.LeafTLS.KeyFile, "embedded hub: the leaf certificate's PEM key")
	fs.BoolVar(&c.KubernetesEnrollment, "kubernetes-enrollment", c.KubernetesEnrollment, "enroll edge nodes by their atoll-edge pods' ServiceAccount tokens (audience "+identity.DefaultEnrollAudience+", checked with a TokenReview), linking with the shared enrollment credentials atoll-cloud keeps in the Secret "+identity.DefaultEnrollSecret+" of its namespace (kubernetes membership source)")
	fs.StringVar(&c.HubLeafCerts, "hub-leaf-certs", c.HubLeafCerts, "generate (atoll-cloud generates the hub leaf listener's CA and certificate in the Secret "+hubtls.DefaultSecret+", rotates them and publishes the CA bundle in the ConfigMap "+hubtls.DefaultCABundle+" of its namespace, for atoll-edge --hub-ca-file; the embedded hub serves them, external hub servers mount the Secret), or empty (the embedded hub's --hub-leaf-tls-* files, or plain leaf links)")
	fs.Var((*cliflags.List)(&c.HubLeafHosts), "hub-leaf-tls-hosts", "comma-separated names of the generated leaf certificate, which edges check with --hub-tls-server-name (default "+hubtls.DefaultHost+")")
	fs.DurationVar(&c.Hub.PingInterval, "hub-ping-interval", hub.DefaultPingInterval, "embedded hub: how often it pings a quiet connection (edge leaf links included); one leaving --hub-max-pings-out unanswered is closed, so a silently dead leaf link is closed within (max+1) × interval")
	fs.IntVar(&c.Hub.MaxPingsOut, "hub-max-pings-out", hub.DefaultMaxPingsOut, "embedded hub: unanswered pings before a connection is closed")
	fs.StringVar(&c.Hub.MonitorAddr, "hub-monitor-listen", c.Hub.MonitorAddr, "embedded hub: host:port of nats-server's HTTP monitoring (/varz, /jsz, /connz, /leafz, /healthz; read-only, unauthenticated: bind it where only monitoring reaches; empty: off)")
	fs.StringVar(&c.Hub.StoreDir, "hub-store-dir", c.Hub.StoreDir, "JetStream storage directory")
	fs.Int64Var(&c.Hub.MaxMemory, "hub-max-memory", c.Hub.MaxMemory, "JetStream memory limit in bytes (0: server default)")
	fs.Int64Var(&c.Hub.MaxStore, "hub-max-store", c.Hub.MaxStore, "JetStream storage limit in bytes (0: server default)")
	fs.IntVar(&c.Hub.Cluster.Port, "hub-cluster-port", c.Hub.Cluster.Port, "embedded hub: route port of a hub cluster (0: a single server; -1: random)")
	fs.StringVar(&c.Hub.Cluster.Host, "hub-cluster-host", c.Hub.Cluster.Host, "embedded hub: interface of the route listener")
	fs.StringVar(&c.Hub.Cluster.Advertise, "hub-cluster-advertise", c.Hub.Cluster.Advertise, "embedded hub: host:port peers route to (default: the listener)")
	fs.Var((*cliflags.List)(&c.Hub.Cluster.Routes), "hub-routes", "embedded hub: comma-separated nats-route:// URLs of the other hub servers")
	fs.StringVar(&c.Hub.Cluster.User, "hub-cluster-user", c.Hub.Cluster.User, "embedded hub: user that authenticates routes")
	fs.StringVar(&c.Hub.Cluster.Password, "hub-cluster-password", c.Hub.Cluster.Password, "embedded hub: password that authenticates routes")
	fs.StringVar(&c.IdentityDir, "identity-dir", c.IdentityDir, "directory of the NATS identity keys (operator, accounts): created by the embedded hub on first start (default <hub-store-dir>/identity); required with --hub-url")
	fs.StringVar(&c.IdentitySecretName, "identity-secret-name", c.IdentitySecretName, "embedded hub: a Secret of atoll-cloud's namespace, created empty, that keeps the identity of --identity-dir and the registry's revocations: filled on the first start, restored from when the directory or the hub's store is new (a new volume); a directory holding other keys than the Secret is refused (empty: the directory and the store only)")
	fs.DurationVar(&c.Identity.EdgeTTL, "edge-creds-ttl", c.Identity.EdgeTTL, "lifetime of an edge node's credentials; nodes renew them before they expire (0: no expiry)")
	fs.DurationVar(&c.Identity.MaxTokenTTL, "max-bootstrap-ttl", c.Identity.MaxTokenTTL, "longest lifetime of a bootstrap token (atoll node enroll --ttl)")
	fs.IntVar(&c.Streams.Replicas, "stream-replicas", c.Streams.Replicas, "replicas of the hub streams (1, or 3 for a hub cluster)")
	fs.Int64Var(&c.Streams.MaxBytes, "stream-max-bytes", c.Streams.MaxBytes, "storage cap of each hub stream in bytes (0: none)")
	fs.DurationVar(&c.Members.NodeTTL, "node-ttl", c.Members.NodeTTL, "declared source: drop a node from its unit after this long without a topology report")
	fs.StringVar(&c.Members.Source, "membership-source", c.Members.Source, "where units come from: kubernetes (a node label) or declared (the agents' --unit)")
	fs.StringVar(&c.Units.Label, "unit-label", c.Units.Label, "node label whose value names the node's unit")
	fs.BoolVar(&c.HostRecords.Enabled, "host-records", c.HostRecords.Enabled, "publish per-unit StatefulSetGrid DNS records for the edge hosts writers (when the grid API is served)")
	fs.StringVar(&c.HostRecords.ClusterDomain, "cluster-domain", c.HostRecords.ClusterDomain, "cluster domain of the StatefulSetGrid DNS names (<ssg>-<i>.<svc>.<ns>.svc.<domain>; empty: names end in .svc and the edge completes them)")
	fs.BoolVar(&c.ObjectViews.Enabled, "object-views", c.ObjectViews.Enabled, "publish views of Services, EndpointSlices, Endpoints and Nodes for the edge endpoints proxies (once for all units; each unit's own Nodes in full)")
	fs.StringVar(&c.Kube.Kubeconfig, "kubeconfig", c.Kube.Kubeconfig, "kubeconfig file (empty: in-cluster)")
	fs.Var((*cliflags.Float32)(&c.Kube.QPS), "kube-qps", "sustained requests/s of the main Kubernetes client (cache, leader election, topology, webhook registration)")
	fs.IntVar(&c.Kube.Burst, "kube-burst", c.Kube.Burst, "burst of the main Kubernetes client")
	fs.Var((*cliflags.Float32)(&c.Health.Protect.QPS), "protect-qps", "sustained requests/s of the protection writes (unreachable taints, endpoint readiness, holds), on a client of their own")
	fs.IntVar(&c.Health.Protect.Burst, "protect-burst", c.Health.Protect.Burst, "burst of the protection writes")
	fs.Var((*cliflags.Float32)(&c.Health.Info.QPS), "annotate-qps", "sustained requests/s of the informational writes (verdict annotations), on a client and queue of their own")
	fs.IntVar(&c.Health.Info.Burst, "annotate-burst", c.Health.Info.Burst, "burst of the informational writes")
	fs.BoolVar(&c.Manager.LeaderElect, "leader-elect", c.Manager.LeaderElect, "only the holder of a Lease writes to Kubernetes (required with more than one replica)")
	fs.StringVar(&c.Manager.LeaderElectionID, "leader-election-id", c.Manager.LeaderElectionID, "name of the leader election Lease")
	fs.StringVar(&c.Manager.LeaderElectionNamespace, "leader-election-namespace", c.Manager.LeaderElectionNamespace, "namespace of the leader election Lease")
	fs.StringVar(&c.Manager.Identity, "leader-election-identity", c.Manager.Identity, "this replica's name in the Lease, unique among replicas (the pod's name: a restarted container takes its Lease back at once); empty: host name and a random suffix")
	fs.DurationVar(&c.Health.HoldTime, "hold-time", c.Health.HoldTime, "keep the pods of a unit cut off entirely from the cloud this long (0: never)")
	fs.DurationVar(&c.Health.CutGrace, "cut-grace", c.Health.CutGrace, "a voter whose leaf link the hub reported closed stops counting at once, but its votes keep protecting this long: a site's links are reported closed one at a time (0: at once)")
	fs.DurationVar(&c.Health.UnheardAfter, "unheard-after", c.Health.UnheardAfter, "hold a unit whose every member the cloud lost once none of its voters' ballots arrived for this long, though their votes still count; a member whose agent sent none for this long and whose Lease is stale is lost, as if its link closed: longer than the voters' keep-alive, shorter than their TTL less a keep-alive (0: once the last vote ran out)")
	fs.DurationVar(&c.Health.ReturnGrace, "return-grace", c.Health.ReturnGrace, "a node protected until its kubelet reported again keeps its serving pods' endpoints ready this long after, while the kubelet posts their status (0: they follow the pods at once)")
	fs.DurationVar(&c.Health.RejoinGrace, "rejoin-grace", c.Health.RejoinGrace, "keep a held unit held once the cloud hears it again while one of its members is still lost with no verdict of its peers, at most this long (0: the first ballot or Ready member ends the hold)")
	fs.DurationVar(&c.Health.VoteTTL, "vote-ttl", c.Health.VoteTTL, "lifetime of a vote that carries no TTL")
	fs.DurationVar(&c.Health.MaxVoteTTL, "max-vote-ttl", c.Health.MaxVoteTTL, "reject a vote that asks to count longer than this")
	fs.DurationVar(&c.Health.MaxVoteSkew, "max-vote-skew", c.Health.MaxVoteSkew, "reject a vote whose time is further than this from the hub's clock")
	fs.StringVar(&c.Webhook.Addr, "webhook-addr", c.Webhook.Addr, "listen address of the mutating admission webhook")
	fs.StringVar(&c.Webhook.Certs, "webhook-certs", c.Webhook.Certs, "where the webhook's certificate comes from: generate (atoll-cloud generates and rotates it in --webhook-cert-secret and keeps the caBundle in sync), dir (--webhook-cert-dir, caBundle from --webhook-ca-file) or cert-manager (--webhook-cert-dir; cert-manager's CA injector sets the caBundle)")
	fs.StringVar(&c.Webhook.CertDir, "webhook-cert-dir", c.Webhook.CertDir, "directory with the webhook's tls.crt and tls.key (--webhook-certs dir or cert-manager)")
	fs.StringVar(&c.Webhook.CertSecret.Name, "webhook-cert-secret", c.Webhook.CertSecret.Name, "Secret (in --webhook-service-namespace) of the generated webhook certificates (--webhook-certs generate)")
	fs.BoolVar(&c.Registration.Enabled, "webhook-register", c.Registration.Enabled, "create or update the MutatingWebhookConfiguration at start")
	fs.StringVar(&c.Registration.URL, "webhook-url", c.Registration.URL, "https URL the apiserver calls (instead of --webhook-service)")
	fs.StringVar(&c.Registration.Service.Namespace, "webhook-service-namespace", c.Registration.Service.Namespace, "namespace of the webhook Service")
	fs.StringVar(&c.Registration.Service.Name, "webhook-service", c.Registration.Service.Name, "name of the webhook Service (empty with --webhook-url)")
	fs.StringVar(&c.Registration.CAFile, "webhook-ca-file", c.Registration.CAFile, "CA bundle that signs the webhook certificate, for the registration (--webhook-certs dir)")
	fs.BoolVar(&c.Registration.FailOpen, "webhook-fail-open", c.Registration.FailOpen, "register no fail-closed guard: while atoll-cloud is down, protected nodes can be tainted for eviction")
	fs.StringVar(&c.Grid.Mode, "grids", c.Grid.Mode, "grid workload controllers (DeploymentGrid, StatefulSetGrid, ServiceGrid): auto (when the apps.atoll.io CRDs are installed), on or off")
	fs.DurationVar(&c.Grid.Resync, "grid-resync", c.Grid.Resync, "re-reconcile every grid this often (0: never; children, nodes and unit events drive them)")
	fs.IntVar(&c.Grid.Workers, "grid-workers", c.Grid.Workers, "concurrent reconciles of each grid controller")
	fs.Var((*cliflags.Float32)(&c.Grid.QPS), "grid-qps", "sustained requests/s of the grid controllers' writes (children, grid status), on a client of their own")
	fs.IntVar(&c.Grid.Burst, "grid-burst", c.Grid.Burst, "burst of the grid controllers' writes")
	// Tunnel server.
	fs.StringVar(&c.Tunnel.ConnectAddr, "tunnel-connect-addr", c.Tunnel.ConnectAddr, "HTTP CONNECT listener for kube-apiserver's egress selector (host:port, or unix:/path); empty: none")
	fs.StringVar(&c.Tunnel.ConnectTLS.CertFile, "tunnel-connect-tls-cert", c.Tunnel.ConnectTLS.CertFile, "PEM server certificate of the TCP CONNECT listener (re-read when it changes)")
	fs.StringVar(&c.Tunnel.ConnectTLS.KeyFile, "tunnel-connect-tls-key", c.Tunnel.ConnectTLS.KeyFile, "PEM key of --tunnel-connect-tls-cert")
	fs.StringVar(&c.Tunnel.ConnectTLS.ClientCAFile, "tunnel-connect-client-ca", c.Tunnel.ConnectTLS.ClientCAFile, "PEM CA bundle the CONNECT clients' certificates (kube-apiserver's egress tlsConfig.clientCert) must chain to; a TCP listener off loopback requires it with the certificate and key")
	fs.Var((*forwardList)(&c.Tunnel.Forwards), "tunnel-forward", "comma-separated TCP port forwards listen=node/host:port through the tunnel")
	fs.StringVar(&c.Tunnel.APIServer, "tunnel-apiserver", c.Tunnel.APIServer, "kube-apiserver's host:port, which nodes whose local API endpoint runs with --apiserver-via=hub reach through this replica (TLS end to end: the replica relays bytes); empty: none")
	fs.IntVar(&c.Tunnel.APIServerPerNode, "tunnel-apiserver-per-node", c.Tunnel.APIServerPerNode, "most connections to kube-apiserver this replica relays for one node")
	fs.DurationVar(&c.Tunnel.DialTimeout, "tunnel-dial-timeout", c.Tunnel.DialTimeout, "longest wait for a node's agent to reach a tunnel target")
	fs.BoolVar(&c.Tunnel.Relay, "tunnel-relay", c.Tunnel.Relay, "relay a node's tunnel sessions through a unit peer while its own leaf link is down or silent")
	fs.DurationVar(&c.Tunnel.RelayAfter, "tunnel-relay-after", c.Tunnel.RelayAfter, "silence from a node after which a tunnel session tries its next path (direct, then each unit peer)")
	fs.DurationVar(&c.Tunnel.Session.LinkTimeout, "tunnel-link-timeout", c.Tunnel.Session.LinkTimeout, "a tunnel session survives a loss of the node's link shorter than this (0: 10s)")
	fs.DurationVar(&c.Tunnel.Session.IdleTimeout, "tunnel-idle-timeout", c.Tunnel.Session.IdleTimeout, "end a tunnel session after this long without a byte either way (0: never)")
	fs.Var((*cliflags.List)(&c.Registration.GuardUsers), "webhook-guard-users", "comma-separated identities of the node lifecycle controller (default: its service account and system:kube-controller-manager)")
}

// Load finishes the configuration (nothing to read today).
func (c *Config) Load() error { return nil }

// Kubernetes reports whether the app runs its Kubernetes side (health
// service and webhook).
func (c Config) Kubernetes() bool { return c.Members.Source == members.SourceKubernetes }

// EmbeddedHub reports whether the app runs the hub itself (no hub URL).
func (c Config) EmbeddedHub() bool { return len(c.HubLink.URLs) == 0 }

// setFlag is a flag and whether its field differs from the default.
type setFlag struct {
	flag string
	set  bool
}

// firstSet names the first flag of fs that is set.
func firstSet(fs []setFlag) string {
	for _, f := range fs {
		if f.set {
			return f.flag
		}
	}
	return ""
}

// hubFlags checks that the flags of one hub shape are not given with the
// other: embedded-hub settings mean nothing to an external hub, and the
// embedded hub's services log in with a key the hub makes for them.
func (c Config) hubFlags() error {
	d := Default()
	if c.EmbeddedHub() {
		l, dl := c.HubLink, d.HubLink
		if f := firstSet([]setFlag{
			{"--hub-creds-file", l.CredsFile != dl.CredsFile},
			{"--hub-tls-ca", l.TLS.CAFile != dl.TLS.CAFile},
			{"--hub-tls-cert", l.TLS.CertFile != dl.TLS.CertFile},
			{"--hub-tls-key", l.TLS.KeyFile != dl.TLS.KeyFile},
		}); f != "" {
			return fmt.Errorf("hub url: %s applies to an external hub and needs --hub-url", f)
		}
		return nil
	}
	h, dh := c.Hub, d.Hub
	if f := firstSet([]setFlag{
		{"--hub-name", h.ServerName != dh.ServerName},
		{"--hub-host", h.Host != dh.Host},
		{"--hub-client-port", h.ClientPort != dh.ClientPort},
		{"--hub-leaf-port", h.LeafPort != dh.LeafPort},
		{"--hub-leaf-advertise", h.LeafAdvertise != dh.LeafAdvertise},
		{"--hub-leaf-tls-cert", h.LeafTLS.CertFile != dh.LeafTLS.CertFile},
		{"--hub-leaf-tls-key", h.LeafTLS.KeyFile != dh.LeafTLS.KeyFile},
		{"--hub-store-dir", h.StoreDir != dh.StoreDir},
		{"--hub-max-memory", h.MaxMemory != dh.MaxMemory},
		{"--hub-max-store", h.MaxStore != dh.MaxStore},
		{"--hub-cluster-port", h.Cluster.Port != dh.Cluster.Port},
		{"--hub-cluster-host", h.Cluster.Host != dh.Cluster.Host},
		{"--hub-cluster-advertise", h.Cluster.Advertise != dh.Cluster.Advertise},
		{"--hub-routes", len(h.Cluster.Routes) > 0},
		{"--hub-cluster-user", h.Cluster.User != dh.Cluster.User},
		{"--hub-cluster-password", h.Cluster.Password != dh.Cluster.Password},
		{"--hub-monitor-listen", h.MonitorAddr != dh.MonitorAddr},
	}); f != "" {
		return fmt.Errorf("hub url: %s configures the embedded hub, which does not run with --hub-url", f)
	}
	return nil
}

// resolved is c with the settings one component holds for all given to
// each: the unit rule, the streams' replicas.
func (c Config) resolved() Config {
	c.Members.Replicas = c.Streams.Replicas
	c.Health.Replicas = c.Streams.Replicas
	c.Members.Units = c.Units
	c.Health.Units = c.Units
	c.ObjectViews.Units = c.Units
	c.HostRecords.Units = c.Units
	c.Console.Units = c.Units
	c.Registration.UnitLabel = c.Units.Label
	// The protected set lives in atoll-cloud's own namespace, beside its
	// leader Lease.
	c.Health.ProtectedNamespace = c.Manager.LeaderElectionNamespace
	c.Registration.ProtectedNamespace = c.Manager.LeaderElectionNamespace
	c.Grid.UnitLabel = c.Units.Label
	return c
}

// Validate checks every component's configuration.
func (c Config) Validate() error {
	c = c.resolved()
	if err := c.hubFlags(); err != nil {
		return err
	}
	checks := []interface{ Validate() error }{c.Admin, c.Streams, c.Members, c.Identity, c.Tunnel}
	if err := hublink.ValidDomain(c.HubLink.Domain); err != nil {
		return err
	}
	switch c.HubLeafCerts {
	case "":
		if len(c.HubLeafHosts) > 0 {
			return errors.New("hub leaf certs: --hub-leaf-tls-hosts names generated certificates: add --hub-leaf-certs=generate")
		}
	case HubLeafCertsGenerate:
		if c.Hub.LeafTLS.Enabled() {
			return errors.New("hub leaf certs: generate and --hub-leaf-tls-cert/--hub-leaf-tls-key are exclusive")
		}
		if !c.Kubernetes() {
			return errors.New("hub leaf certs: generate keeps the certificates in a Secret and needs the kubernetes membership source")
		}
		checks = append(checks, c.hubTLS())
	default:
		return fmt.Errorf("hub leaf certs: %q: want %s or nothing", c.HubLeafCerts, HubLeafCertsGenerate)
	}
	if c.EmbeddedHub() {
		c.Hub.Domain = c.HubLink.Domain
		checks = append(checks, c.Hub)
	} else {
		checks = append(checks, c.HubLink)
	}
	if c.Kubernetes() {
		checks = append(checks, c.Kube, c.Manager, c.Health, c.Webhook, c.Grid, c.ObjectViews, c.HostRecords)
		if c.Console.Enabled {
			checks = append(checks, c.Console)
		}
		if c.Registration.Enabled {
			if err := c.Registration.ValidateFor(c.Webhook); err != nil {
				return err
			}
		}
	}
	for _, v := range checks {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	if c.IdentityDir == "" && !c.EmbeddedHub() {
		return errors.New("hub url: an external hub needs --identity-dir, the keys its servers trust")
	}
	if c.IdentitySecretName != "" {
		switch {
		case !c.EmbeddedHub():
			return errors.New("identity secret: --identity-secret-name keeps the embedded hub's identity; with --hub-url mount the Secret at --identity-dir")
		case !c.Kubernetes():
			return errors.New("identity secret: --identity-secret-name needs the kubernetes membership source")
		case validation.IsDNS1123Subdomain(c.IdentitySecretName) != nil:
			return fmt.Errorf("identity secret: %q is not a Secret name: %s", c.IdentitySecretName, strings.Join(validation.IsDNS1123Subdomain(c.IdentitySecretName), "; "))
		}
	}
	return nil
}

// healthStates gives the NodeUnits the health service's unit
// disruption states and their changes.
type healthStates struct{ h *health.Service }

func (s healthStates) UnitDisruption(unit string) (string, bool) {
	st, known := s.h.UnitStateKnown(unit)
	return string(st), known
}

func (s healthStates) OnChange(fn func(unit string)) {
	s.h.OnUnitState(func(unit string, _ health.UnitState) { fn(unit) })
}

// kubernetesEnrollment provides the identity service its Kubernetes
// enrollment when it is on.
func kubernetesEnrollment(c Config) fx.Option {
	if !c.KubernetesEnrollment || !c.Kubernetes() {
		return fx.Options()
	}
	return fx.Provide(func(client kubernetes.Interface) (*identity.Kubernetes, error) {
		return identity.NewKubernetes(identity.DefaultKubernetesConfig(c.Manager.LeaderElectionNamespace), client)
	})
}

// durableRegistry keeps the identity registry's revocations in the
// identity Secret, beside the keys, when atoll-cloud keeps them there
// (--identity-secret-name): a new hub volume keeps them too.
func durableRegistry(c Config) fx.Option {
	if c.IdentitySecretName == "" {
		return fx.Options()
	}
	return fx.Provide(func(client kubernetes.Interface) identity.Durable {
		return identity.SecretDurable{Client: client,
			Ref: types.NamespacedName{Namespace: c.Manager.LeaderElectionNamespace, Name: c.IdentitySecretName}}
	})
}

// hubTLS is the configuration of the generated leaf certificate.
func (c Config) hubTLS() hubtls.Config {
	cfg := hubtls.DefaultConfig(c.Manager.LeaderElectionNamespace)
	if len(c.HubLeafHosts) > 0 {
		cfg.Hosts = c.HubLeafHosts
	}
	return cfg
}

// StartTimeout bounds atoll-cloud's start. A hub cluster that starts with
// it (a fresh install, a restart of the whole cluster) takes up to about
// a minute to elect its JetStream leaders on a busy control plane; a
// replica that waits for them in process is ready as soon as they are,
// where one that exited would wait out its container's restart back-off.
const StartTimeout = 2 * time.Minute

// Options is the atoll-cloud application.
func Options(c Config, log *slog.Logger) fx.Option {
	c = c.resolved()
	if c.Registration.Service.Namespace != "" {
		c.Webhook.CertSecret.Namespace = c.Registration.Service.Namespace
	}
	k8s := fx.Options()
	if c.Kubernetes() {
		k8s = fx.Options(
			fx.Supply(c.Kube, c.Manager, c.Health, c.Webhook, c.Registration, c.Grid),
			kube.Module,
			manager.Module,
			health.Module,
			grid.Module,
			// With the grid controllers, the NodeUnits are kept
			// (their disruption state from the health service, followed
			// as it changes).
			fx.Invoke(func(g *grid.Controllers, m *manager.Manager, h *health.Service, log *slog.Logger, reg prometheus.Registerer) error {
				if g == nil {
					return nil
				}
				return units.SetupNodeUnits(m, c.Units, healthStates{h}, log, reg)
			}),
			webhook.Module,
			status.Module,
			fx.Supply(c.ObjectViews),
			fx.Provide(func(i *identity.Issuer) objects.ViewSigner { return i.ViewSigner() }),
			objects.Module,
			fx.Supply(c.HostRecords),
			fx.Provide(func(g *grid.Controllers) hostrecords.GridsServed { return g != nil }),
			hostrecords.Module,
			fx.Supply(c.Console),
			console.Module,
		)
	}
	c.Identity.Replicas = c.Streams.Replicas
	// The services dial the hub the same way in both shapes; only the
	// endpoint differs. With an external hub, atoll-cloud holds the
	// identity keys the servers trust, and logs in with a service JWT it
	// issues itself unless credentials are given.
	leafCerts := fx.Options()
	if c.HubLeafCerts == HubLeafCertsGenerate {
		leafCerts = fx.Options(fx.Supply(c.hubTLS()), hubtls.Module)
	}
	hubShape := fx.Options(
		fx.Provide(func() (*identity.Issuer, hubclient.Endpoint, error) { return externalHub(c) }),
	)
	if c.HubLeafCerts == HubLeafCertsGenerate {
		// The external hub's servers start once the Secret holds their
		// certificate (their pods mount its keys): fill it before
		// waiting for them. A module of its own, declared before
		// hubclient's, so that its start hook runs first.
		hubShape = fx.Options(hubShape, leafCerts,
			fx.Module("hub-leaf-certs", fx.Invoke(func(hub.LeafCertificates) {})))
	}
	if c.EmbeddedHub() {
		c.Hub.Domain = c.HubLink.Domain
		c.Hub.IdentityDir = c.IdentityDir
		hubConfig := fx.Supply(c.Hub)
		if c.IdentitySecretName != "" {
			// The identity is in place before the hub loads it.
			hubConfig = fx.Provide(func(client kubernetes.Interface, log *slog.Logger) (hub.Config, error) {
				ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
				defer cancel()
				ref := types.NamespacedName{Namespace: c.Manager.LeaderElectionNamespace, Name: c.IdentitySecretName}
				return c.Hub, identity.SyncSecret(ctx, client, ref, c.Hub.IdentityPath(), log.With("component", "identity"))
			})
		}
		hubShape = fx.Options(
			hubConfig,
			leafCerts,
			hub.Module,
			fx.Provide(func(h *hub.Hub) hubclient.Endpoint { return h }),
			fx.Provide(func(h *hub.Hub) *identity.Issuer { return h.Issuer() }),
		)
	}
	return fx.Options(
		fx.Supply(c.Admin, c.Streams, c.Members, log),
		fx.WithLogger(fxrun.Logger(log)),
		fx.StartTimeout(StartTimeout),
		admin.Module,
		hubShape,
		hubclient.Module,
		fx.Supply(c.Identity),
		identity.Module,
		kubernetesEnrollment(c),
		durableRegistry(c),
		// Deleting a Node revokes its edge's credentials until it is back.
		fx.Provide(func(s *identity.Service) members.EdgeGate { return s }),
		// Unit views carry the keys of the nodes' credentials, for peers
		// to verify what they sign.
		fx.Provide(func(s *identity.Service) members.NodeKeys { return s }),
		members.Module,
		fx.Supply(c.Tunnel),
		tunnel.Module,
		k8s,
	)
}

// forwardList is the --tunnel-forward flag.
type forwardList []tunnel.Forward

func (f *forwardList) String() string {
	if f == nil {
		return ""
	}
	out := make([]string, 0, len(*f))
	for _, x := range *f {
		out = append(out, x.Listen+"="+x.Node+"/"+x.Target)
	}
	return strings.Join(out, ",")
}

func (f *forwardList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		x, err := tunnel.ParseForward(s)
		if err != nil {
			return err
		}
		*f = append(*f, x)
	}
	return nil
}

// externalHub loads the identity keys for an external hub and the service
// credentials atoll-cloud dials it with.
func externalHub(c Config) (*identity.Issuer, hubclient.Endpoint, error) {
	keys, err := identity.LoadKeys(c.IdentityDir)
	if err != nil {
		return nil, nil, fmt.Errorf("external hub: %w (the hub servers must trust these keys: see deploy/overlays/external-nats/hub-external.yaml)", err)
	}
	issuer := identity.NewIssuer(keys, c.HubLink.Domain)
	l := c.HubLink
	if l.CredsFile == "" && l.NkeySeedFile == "" && l.Nkey == nil && l.User == "" {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, nil, err
		}
		pub, _ := kp.PublicKey()
		if l.UserJWT, err = issuer.Service("atoll-cloud", pub); err != nil {
			return nil, nil, err
		}
		l.Nkey = kp
	}
	return issuer, hubclient.Static(l), nil
}
