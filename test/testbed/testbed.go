// Package testbed assembles a whole Atoll installation on one machine for
// the local demo and the end-to-end tests: a real Kubernetes control plane
// (internal/kubetest), the hub (embedded in atoll-cloud, or a cluster of
// three servers that atoll-cloud dials by URL), the atoll-cloud application
// with its health service and admission webhook registered with the
// apiserver, the simulated kubelets (internal/edgesim) and simulated sites
// whose nodes run real atoll-edge agents (internal/sitesim).
package testbed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"time"

	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/cloud/cloudapp"
	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/cloud/webhook"
	"github.com/atoll-edge/atoll/deploy"
	"github.com/atoll-edge/atoll/edge/edgeapp"
	"github.com/atoll-edge/atoll/internal/admin"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/test/edgesim"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/sitesim"
)

// Options shape the bed.
type Options struct {
	// Dir holds every component's state and logs.
	Dir string
	// Kube configures the control plane; KCM and scheduler always run.
	Kube kubetest.Config
	// HubPort is the embedded hub's client port on 127.0.0.1 (0 or busy:
	// random).
	HubPort int
	// HubCluster runs the hub as a cluster of three servers outside
	// atoll-cloud, which dials them by URL with an nkey seed file, and
	// makes the streams R3. Default: the hub embedded in atoll-cloud.
	HubCluster bool
	// ServiceAccount runs atoll-cloud authenticated only as the
	// ServiceAccount deploy/base/atoll-cloud.yaml defines (CloudNamespace/
	// CloudServiceAccount, user CloudUser): a token from the apiserver's
	// TokenRequest API and the cluster CA, so every request it makes is
	// authorized by the manifest's RBAC. Default: the admin's client
	// certificate.
	ServiceAccount bool
	// Grids installs the apps.atoll.io CRDs (deploy/crds) and the grid
	// controllers' RBAC (deploy/base/grids.yaml) before atoll-cloud starts, so
	// its grid controllers run (--grids auto).
	Grids bool
	// Cloud and Agent adjust the cloud's and every agent's configuration.
	Cloud func(*cloudapp.Config)
	Agent func(*edgeapp.Config)
	// Net separates the loopback addresses of concurrent beds (sitesim).
	Net int
	// Logger receives every component's logs.
	Logger *slog.Logger
}

// Where deploy/base/atoll-cloud.yaml puts atoll-cloud, and the user name its
// ServiceAccount authenticates as.
const (
	CloudNamespace      = "atoll-system"
	CloudServiceAccount = "atoll-cloud"
	CloudManifest       = deploy.CloudManifest
	// GridsManifest holds the grid controllers' RBAC.
	GridsManifest = deploy.GridsManifest
)

// CloudUser is atoll-cloud's user name with Options.ServiceAccount.
var CloudUser = kubetest.ServiceAccountUser(CloudNamespace, CloudServiceAccount)

// Bed is a running installation.
type Bed struct {
	Cluster *kubetest.Cluster
	// Hub is the embedded hub (nil with Options.HubCluster).
	Hub *hub.Hub
	// HubCluster is the hub cluster (nil without Options.HubCluster).
	HubCluster *natstest.HubCluster
	// HubLink is atoll-cloud's link to the hub.
	HubLink *hublink.Link
	Health  *health.Service
	Kubelet *edgesim.Simulator
	Sites   *sitesim.Sim
	// Identity is atoll-cloud's identity service (enrollment, revocation).
	Identity *identity.Service
	// Admin is atoll-cloud's admin server (its metrics registry and its
	// /ui/ status page).
	Admin *admin.Server
	// OperatorCreds is a NATS credentials file of a human operator.
	OperatorCreds string

	cloudCfg cloudapp.Config
	cloudLog *slog.Logger
	cloud    *fx.App // nil while atoll-cloud is stopped
	stops    []func()
	dir      string

	// Replicas (replicas.go): the processes, the webhook's Service, and
	// the embedded hub's URLs once the replica runs it.
	replicas []*Replica
	proxy    *proxy
	leafURLs []string
	hubURL   string
}

// StartCloud starts atoll-cloud (again, after StopCloud): Health and
// HubLink then belong to the new process. With the embedded hub, the hub
// starts with it (Hub is replaced).
func (b *Bed) StartCloud(ctx context.Context) error {
	if b.cloud != nil || len(b.replicas) > 0 {
		return errors.New("testbed: atoll-cloud is running")
	}
	populate := fx.Populate(&b.HubLink, &b.Health, &b.Identity, &b.Admin)
	if b.cloudCfg.EmbeddedHub() {
		if b.Hub != nil {
			// The agents and tools know the hub by its first ports and
			// their keys were enrolled at run time: a restarted embedded
			// hub would have neither.
			return errors.New("testbed: restarting atoll-cloud with the embedded hub is not supported; use HubCluster")
		}
		populate = fx.Options(populate, fx.Populate(&b.Hub))
	}
	app := fx.New(cloudapp.Options(b.cloudCfg, b.cloudLog), populate)
	if err := app.Err(); err != nil {
		return fmt.Errorf("atoll-cloud: %w", err)
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := app.Start(sctx); err != nil {
		return fmt.Errorf("atoll-cloud: %w", err)
	}
	b.cloud = app
	return nil
}

// StopCloud stops atoll-cloud gracefully, as a rolling restart or a scale
// to zero would: every replica down.
func (b *Bed) StopCloud(ctx context.Context) error {
	if b.cloud == nil {
		return nil
	}
	err := b.cloud.Stop(ctx)
	b.cloud = nil
	return err
}

// Start brings the bed up; Stop tears it down (also after a failed Start).
func Start(ctx context.Context, o Options) (b *Bed, err error) {
	if o.Dir == "" {
		return nil, errors.New("testbed: no dir")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	// bed, not b, in the cleanups: a failing return has already set b to
	// nil when they run.
	bed := &Bed{dir: o.Dir}
	b = bed
	defer func() {
		if err != nil {
			bed.Stop()
			b = nil
		}
	}()

	kc := o.Kube
	kc.Dir = filepath.Join(o.Dir, "kube")
	kc.ControllerManager, kc.Scheduler = true, true
	if kc.Logger == nil {
		kc.Logger = o.Logger.With("component", "kubetest")
	}
	if b.Cluster, err = kubetest.StartCluster(ctx, kc); err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	b.stops = append(b.stops, func() { _ = bed.Cluster.Stop() })

	// What every atoll-cloud installation has: its namespace,
	// ServiceAccount, RBAC, the webhook configuration it fills in and the
	// Secret of its generated webhook certificates.
	if err := applyManifest(ctx, b.Cluster, CloudManifest); err != nil {
		return nil, err
	}
	if o.Grids {
		names, err := deploy.CRDNames()
		if err != nil {
			return nil, err
		}
		for _, n := range append(names, GridsManifest) {
			if err := applyManifest(ctx, b.Cluster, n); err != nil {
				return nil, err
			}
		}
	}

	// The webhook serves on a fixed loopback port so the registration can
	// name it before the server starts.
	whPort, err := natstest.FreePort()
	if err != nil {
		return nil, err
	}
	cfg := cloudapp.Default()
	cfg.Admin.Addr = "127.0.0.1:0"
	cfg.IdentityDir = filepath.Join(o.Dir, "identity")
	if o.HubCluster {
		if b.HubCluster, err = natstest.StartHubCluster(ctx, filepath.Join(o.Dir, "hub"), o.Logger.With("service", "hub")); err != nil {
			return nil, fmt.Errorf("hub cluster: %w", err)
		}
		b.stops = append(b.stops, b.HubCluster.Close)
		// atoll-cloud holds the keys the servers trust and issues its
		// own service credentials.
		cfg.IdentityDir = b.HubCluster.IdentityDir()
		cfg.HubLink.URLs = b.HubCluster.ClientURLs()
		cfg.Streams.Replicas = 3
	} else {
		cfg.Hub.Host = "127.0.0.1"
		cfg.Hub.ClientPort = -1
		if o.HubPort > 0 && portFree(o.HubPort) {
			cfg.Hub.ClientPort = o.HubPort
		}
		cfg.Hub.LeafPort = -1
		cfg.Hub.StoreDir = filepath.Join(o.Dir, "hub")
	}
	cfg.Kube.REST = b.Cluster.RESTConfig()
	if o.ServiceAccount {
		// Longer than any bed lives; a pod's projected token is
		// refreshed by the kubelet instead.
		if cfg.Kube.REST, err = b.Cluster.ServiceAccountConfig(ctx, CloudNamespace, CloudServiceAccount, 24*time.Hour); err != nil {
			return nil, err
		}
	}
	cfg.Webhook.Addr = fmt.Sprintf("127.0.0.1:%d", whPort)
	// As in production, atoll-cloud generates its certificates (into the
	// Secret the manifest created) and the registration's caBundle.
	cfg.Webhook.Certs = webhook.CertsGenerate
	cfg.Registration.Enabled = true
	cfg.Registration.Service = webhook.ServiceRef{}
	cfg.Registration.URL = fmt.Sprintf("https://127.0.0.1:%d/mutate", whPort)
	cfg.Registration.CAFile = ""
	if o.Cloud != nil {
		o.Cloud(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b.cloudCfg, b.cloudLog = cfg, o.Logger.With("service", "atoll-cloud")
	if err := b.StartCloud(ctx); err != nil {
		return nil, err
	}
	keys, err := identity.LoadKeys(cfg.IdentityDir)
	if err != nil {
		return nil, err
	}
	if b.OperatorCreds, err = natstest.WriteCreds(o.Dir, identity.NewIssuer(keys, cfg.HubLink.Domain), func(i *identity.Issuer, pub string) (string, error) {
		return i.Operator("operator", pub, 0)
	}); err != nil {
		return nil, err
	}
	b.stops = append(b.stops, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = bed.StopCloud(ctx)
	})

	if b.Kubelet, err = edgesim.New(b.Cluster.RESTConfig(), edgesim.Config{Logger: o.Logger.With("component", "edgesim")}); err != nil {
		return nil, err
	}
	// The simulated kubelets live until Stop, not until ctx (which only
	// bounds the start).
	if err := b.Kubelet.Start(context.Background()); err != nil {
		return nil, err
	}
	b.stops = append(b.stops, b.Kubelet.Stop)

	agent := func(c *edgeapp.Config) {
		c.Kubelet.Scheme = "http" // sitesim serves a plain-HTTP kubelet /healthz
		if o.Agent != nil {
			o.Agent(c)
		}
	}
	hubs := enroller{b: bed, leafs: b.LeafURLs(), domain: cfg.HubLink.Domain}
	if b.Sites, err = sitesim.New(sitesim.Config{Hub: hubs, Kube: b.Kubelet, StateDir: filepath.Join(o.Dir, "edge"), Net: o.Net,
		UnitLabel: cfg.Units.Label, Agent: agent, Logger: o.Logger.With("service", "atoll-edge")}); err != nil {
		return nil, err
	}
	b.stops = append(b.stops, func() { _ = bed.Sites.Close(context.Background()) })
	return b, nil
}

// enroller issues the simulated nodes' credentials through atoll-cloud's
// identity service, as enrollment would: the cloud knows every node's key.
type enroller struct {
	b      *Bed
	leafs  []string
	domain string
}

func (e enroller) IssueEdge(node, unit, pub string) (string, error) {
	if e.b.Identity == nil {
		return "", errors.New("testbed: atoll-cloud is stopped or runs in replicas (enroll nodes before StartReplicas)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return e.b.Identity.IssueEdge(ctx, node, unit, pub)
}

func (e enroller) LeafURLs() []string { return e.leafs }
func (e enroller) Domain() string     { return e.domain }

// LeafURLs are where the agents' leaf remotes dial.
func (b *Bed) LeafURLs() []string {
	switch {
	case b.HubCluster != nil:
		return b.HubCluster.LeafURLs()
	case b.Hub == nil:
		return b.leafURLs // the embedded hub runs in a replica
	}
	return b.Hub.LeafURLs()
}

// HubURL is where operators' tools reach the hub (one server of a
// cluster).
func (b *Bed) HubURL() string {
	switch {
	case b.HubCluster != nil:
		return b.HubCluster.ClientURLs()[0]
	case b.Hub == nil:
		return b.hubURL // the embedded hub runs in a replica
	}
	return b.Hub.ClientURL()
}

// Stop tears everything down, last started first.
func (b *Bed) Stop() {
	for i := len(b.stops) - 1; i >= 0; i-- {
		b.stops[i]()
	}
	b.stops = nil
}

// applyManifest applies a manifest of deploy/ to the cluster.
func applyManifest(ctx context.Context, c *kubetest.Cluster, name string) error {
	data, err := deploy.Read(name)
	if err != nil {
		return fmt.Errorf("deploy/%s: %w", name, err)
	}
	objs, err := kubetest.DecodeManifests(name, data)
	if err != nil {
		return err
	}
	if err := c.Apply(ctx, objs, kubetest.ApplyOptions{}); err != nil {
		return fmt.Errorf("apply deploy/%s: %w", name, err)
	}
	return nil
}

func portFree(port int) bool {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	_ = ln.Close()
	return true
}
