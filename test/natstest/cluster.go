package natstest

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/natsembed"
	"github.com/atoll-edge/atoll/test/freeport"
)

// HubCluster is a hub of clustered servers in one process, each on its
// own loopback ports and store directory, that a test can kill and restart
// one at a time. The servers are what an operator runs outside atoll-cloud:
// in operator mode with a full resolver, trusting the operator of an
// identity directory (IdentityDir) they hold no keys of. The cluster
// issues credentials with those keys, as atoll-cloud would.
type HubCluster struct {
	log    *slog.Logger
	cfgs   []hub.Config
	dir    string
	issuer *identity.Issuer

	mu      sync.Mutex
	servers []*hub.Hub // nil while killed
	svc     nkeys.KeyPair
	svcJWT  string
}

// ClusterSize is the number of servers HubCluster starts.
const ClusterSize = 3

// NewHubCluster starts ClusterSize clustered hub servers and waits until
// their JetStream has a leader. mutate adjusts every server's config.
func NewHubCluster(t testing.TB, mutate ...func(*hub.Config)) *HubCluster {
	t.Helper()
	c, err := StartHubCluster(context.Background(), t.TempDir(), Logger(t, slog.LevelWarn), mutate...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// StartHubCluster is NewHubCluster without a test: dir holds the stores,
// Close stops it. A start that loses a port to another process is retried
// on fresh ports.
func StartHubCluster(ctx context.Context, dir string, log *slog.Logger, mutate ...func(*hub.Config)) (*HubCluster, error) {
	const attempts = 3
	for attempt := 1; ; attempt++ {
		c, err := startHubCluster(ctx, filepath.Join(dir, fmt.Sprintf("try-%d", attempt)), log, mutate...)
		if err == nil || attempt == attempts || !strings.Contains(err.Error(), "address already in use") {
			return c, err
		}
		log.Warn("hub cluster lost a port race, retrying on fresh ports", "attempt", attempt, "err", err)
	}
}

func startHubCluster(ctx context.Context, dir string, log *slog.Logger, mutate ...func(*hub.Config)) (*HubCluster, error) {
	c := &HubCluster{log: log, dir: filepath.Join(dir, "identity")}
	keys, trust, err := identity.Setup(c.dir)
	if err != nil {
		return nil, err
	}
	c.issuer = identity.NewIssuer(keys, hub.Default().Domain)
	if c.svc, err = nkeys.CreateUser(); err != nil {
		return nil, err
	}
	pub, _ := c.svc.PublicKey()
	if c.svcJWT, err = c.issuer.Service("atoll-cloud-test", pub); err != nil {
		return nil, err
	}
	ports := make([][3]int, ClusterSize) // client, leaf, route
	var routes []string
	for i := range ports {
		for j := range ports[i] {
			if ports[i][j], err = FreePort(); err != nil {
				return nil, err
			}
		}
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", ports[i][2]))
	}
	for i := range ClusterSize {
		cfg := hub.Default()
		cfg.ServerName = fmt.Sprintf("atoll-hub-%d", i)
		cfg.Host = "127.0.0.1"
		cfg.ClientPort, cfg.LeafPort = ports[i][0], ports[i][1]
		cfg.StoreDir = filepath.Join(dir, cfg.ServerName)
		cfg.Cluster = hub.ClusterConfig{Host: "127.0.0.1", Port: ports[i][2], Routes: routes, User: "hub-route", Password: "hub-route-secret"}
		cfg.Trust = &trust
		cfg.LameDuck = 5 * time.Second // LameDuck is quick in tests
		for _, m := range mutate {
			m(&cfg)
		}
		c.cfgs = append(c.cfgs, cfg)
	}
	c.servers = make([]*hub.Hub, ClusterSize)
	var wg sync.WaitGroup
	errs := make([]error, ClusterSize)
	for i := range ClusterSize {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = c.start(ctx, i) }()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			c.Close()
			return nil, err
		}
	}
	if err := c.waitJetStream(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *HubCluster) start(ctx context.Context, i int) error {
	h, err := hub.New(c.cfgs[i], c.log)
	if err != nil {
		return fmt.Errorf("hub server %d: %w", i, err)
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := h.Start(sctx); err != nil {
		return fmt.Errorf("start hub server %d: %w", i, err)
	}
	c.mu.Lock()
	c.servers[i] = h
	c.mu.Unlock()
	return nil
}

// waitJetStream waits until the cluster's JetStream answers through every
// running server.
func (c *HubCluster) waitJetStream(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, h := range c.running() {
		nc, err := c.Connect(h, "cluster-ready")
		if err != nil {
			return err
		}
		js, err := jetstream.NewWithDomain(nc, h.Domain())
		if err != nil {
			nc.Close()
			return err
		}
		for {
			actx, cancel := context.WithTimeout(ctx, time.Second)
			_, err = js.AccountInfo(actx)
			cancel()
			if err == nil {
				break
			}
			select {
			case <-ctx.Done():
				nc.Close()
				return fmt.Errorf("hub cluster: JetStream not ready on %s: %w (%v)", h.Name(), ctx.Err(), err)
			case <-time.After(100 * time.Millisecond):
			}
		}
		nc.Close()
	}
	return nil
}

func (c *HubCluster) running() []*hub.Hub {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*hub.Hub
	for _, h := range c.servers {
		if h != nil {
			out = append(out, h)
		}
	}
	return out
}

// Server returns server i (nil while killed).
func (c *HubCluster) Server(i int) *hub.Hub {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.servers[i]
}

// Kill stops server i.
func (c *HubCluster) Kill(i int) error {
	c.mu.Lock()
	h := c.servers[i]
	c.servers[i] = nil
	c.mu.Unlock()
	if h == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return h.Shutdown(ctx)
}

// LameDuck stops server i in lame duck mode (hub.Hub.LameDuck; set
// hub.Config.LameDuck to make it quick) and waits until it is down.
func (c *HubCluster) LameDuck(ctx context.Context, i int) error {
	c.mu.Lock()
	h := c.servers[i]
	c.mu.Unlock()
	if h == nil {
		return fmt.Errorf("hub server %d is not running", i)
	}
	err := h.LameDuck(ctx)
	c.mu.Lock()
	c.servers[i] = nil
	c.mu.Unlock()
	return err
}

// Restart starts server i again, on its old ports and store, and waits
// until the cluster's JetStream answers through it.
func (c *HubCluster) Restart(ctx context.Context, i int) error {
	if c.Server(i) != nil {
		return fmt.Errorf("hub server %d is running", i)
	}
	if err := c.start(ctx, i); err != nil {
		return err
	}
	return c.waitJetStream(ctx)
}

// Close stops every server.
func (c *HubCluster) Close() {
	for i := range c.servers {
		_ = c.Kill(i)
	}
}

// IssueEdge issues node's user JWT in unit for the nkey public key pub.
func (c *HubCluster) IssueEdge(node, unit, pub string) (string, error) {
	return c.issuer.Edge(node, unit, pub, 0)
}

// Issuer signs credentials with the cluster's identity keys.
func (c *HubCluster) Issuer() *identity.Issuer { return c.issuer }

// IdentityDir holds the keys and trust the servers were configured with,
// for atoll-cloud's --identity-dir.
func (c *HubCluster) IdentityDir() string { return c.dir }

// Connect opens an in-process connection to server h as the test service.
func (c *HubCluster) Connect(h *hub.Hub, name string, opts ...nats.Option) (*nats.Conn, error) {
	return natsembed.ConnectJWT(h.Server(), c.svc, c.svcJWT, name, opts...)
}

// LeafURLs are every server's leaf URL, for edge leaf remotes.
func (c *HubCluster) LeafURLs() []string {
	out := make([]string, len(c.cfgs))
	for i, cfg := range c.cfgs {
		out[i] = fmt.Sprintf("nats-leaf://%s:%d", cfg.Host, cfg.LeafPort)
	}
	return out
}

// ClientURLs are every server's client URL.
func (c *HubCluster) ClientURLs() []string {
	out := make([]string, len(c.cfgs))
	for i, cfg := range c.cfgs {
		out[i] = fmt.Sprintf("nats://%s:%d", cfg.Host, cfg.ClientPort)
	}
	return out
}

// Domain is the hub's JetStream domain.
func (c *HubCluster) Domain() string { return c.cfgs[0].Domain }

// ClientConfig dials the cluster (every server's URL) as the test
// service identity.
func (c *HubCluster) ClientConfig() hublink.ClientConfig {
	return hublink.ClientConfig{URLs: c.ClientURLs(), Domain: c.Domain(), Nkey: c.svc, UserJWT: c.svcJWT}
}

// FreePort returns a loopback TCP port free at the time of the call,
// outside the ephemeral range (see package freeport).
func FreePort() (int, error) { return freeport.Port() }
