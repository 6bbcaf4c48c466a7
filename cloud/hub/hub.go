// Package hub embeds the cloud's NATS hub: a JetStream server (domain "hub")
// that every edge node's NATS server connects to as a leafnode, and that the
// cloud services dial like any NATS client (internal/hublink) for streams
// and consumers. atoll-cloud runs it only when no external hub URL is
// given. A server can also be one of a hub cluster (Config.Cluster): the
// servers route to each other and share a clustered JetStream in one
// domain, with streams replicated three times.
//
// Authentication is NATS' decentralized JWT auth (cloud/identity): the
// server runs in operator mode with a full account resolver in its store
// directory, trusting the operator of the identity directory; accounts SYS
// (system) and ATOLL (application, JetStream enabled). Every connection
// presents a user JWT signed by the ATOLL account's signing key and the
// server enforces the permissions it carries; no anonymous access. A
// server can run with the keys (the embedded hub: it mints the cloud
// services' credentials) or with the trust alone (Config.Trust: a hub
// server that atoll-cloud dials like an external one).
package hub

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/natsembed"
	"github.com/atoll-edge/atoll/internal/natslog"
)

// Account names on the hub.
const (
	AppAccount    = identity.AppAccount
	SystemAccount = identity.SystemAccount
)

// Hub is a running hub server.
type Hub struct {
	cfg    Config
	log    *slog.Logger
	srv    *server.Server
	slog   *natslog.Logger // the server's logger; reports a listener that cannot bind
	trust  identity.Trust
	issuer *identity.Issuer // nil on a server that holds no keys
	svc    nkeys.KeyPair    // the embedded cloud services' identity
	svcJWT string
	leaf   *url.URL
	client *url.URL
}

// New prepares a hub server; Start runs it. Without Config.Trust it loads
// the keys of Config.IdentityDir, generating them on the first start.
func New(cfg Config, log *slog.Logger) (*Hub, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h := &Hub{cfg: cfg, log: log.With("component", "hub")}
	if cfg.Trust != nil {
		h.trust = *cfg.Trust
	} else {
		keys, trust, err := identity.Setup(cfg.IdentityPath())
		if err != nil {
			return nil, fmt.Errorf("hub: %w", err)
		}
		h.trust, h.issuer = trust, identity.NewIssuer(keys, cfg.Domain)
		if h.svc, err = nkeys.CreateUser(); err != nil {
			return nil, fmt.Errorf("hub: service key: %w", err)
		}
		pub, _ := h.svc.PublicKey()
		if h.svcJWT, err = h.issuer.Service("atoll-cloud", pub); err != nil {
			return nil, fmt.Errorf("hub: %w", err)
		}
	}

	opts, err := h.options()
	if err != nil {
		return nil, err
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("hub: %w", err)
	}
	h.slog = natslog.New(h.log, cfg.ServerName)
	srv.SetLoggerV2(h.slog, true, false, false)
	h.srv = srv
	return h, nil
}

func (h *Hub) options() (*server.Options, error) {
	// Resolver preloads can only be declared in configuration text.
	conf := fmt.Sprintf(`
server_name: %q
%s
jetstream { domain: %q, store_dir: %q, max_memory_store: %d, max_file_store: %d }
`, h.cfg.ServerName, h.trust.ServerConfig(filepath.Join(h.cfg.StoreDir, "jwt")), h.cfg.Domain, h.cfg.StoreDir,
		jsLimit(h.cfg.MaxMemory), jsLimit(h.cfg.MaxStore))
	opts := &server.Options{}
	if err := opts.ProcessConfigString(conf); err != nil {
		return nil, fmt.Errorf("hub: options: %w", err)
	}
	opts.Host = h.cfg.Host
	opts.Port = h.cfg.ClientPort
	opts.NoSigs = true
	opts.MaxPayload = 1 << 20
	opts.PingInterval, opts.MaxPingsOut = h.cfg.PingInterval, h.cfg.MaxPingsOut
	if opts.PingInterval == 0 {
		opts.PingInterval = DefaultPingInterval
	}
	if opts.MaxPingsOut == 0 {
		opts.MaxPingsOut = DefaultMaxPingsOut
	}
	if h.cfg.MonitorAddr != "" {
		host, port, _ := net.SplitHostPort(h.cfg.MonitorAddr) // checked by Validate
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("hub: monitor port %q: %w", port, err)
		}
		opts.HTTPHost, opts.HTTPPort = host, p
	}
	if h.cfg.LameDuck > 0 {
		opts.LameDuckDuration, opts.LameDuckGracePeriod = h.cfg.LameDuck, h.cfg.LameDuck/5
	}
	opts.LeafNode.Host = h.cfg.Host
	opts.LeafNode.Port = h.cfg.LeafPort
	opts.LeafNode.Advertise = h.cfg.LeafAdvertise
	opts.LeafNode.NoAdvertise = h.cfg.LeafAdvertise == ""
	// Edges talk to each other over their unit's routes, never through
	// the hub: a leaf's interest is not propagated to the other leafs.
	// Without it every edge server's loop-detection subscription reached
	// every other leaf, and the hub's memory grew with leafs².
	opts.LeafNode.IsolateLeafnodeInterest = true
	// No subject-match caches: each connection's permissions keep one,
	// and a new leaf link's interest is checked against its permissions
	// subject by subject, every subscription of the account's other links
	// included (up to 1,024 results cached per link). With 2,000 edge
	// leafs that was half of the hub's heap (bench:scale --scale-leafs);
	// the hub's message rate is low enough to match without them.
	opts.NoSublistCache = true
	switch {
	case h.cfg.LeafTLS.Enabled():
		certs, err := newCertFiles(h.cfg.LeafTLS)
		if err != nil {
			return nil, err
		}
		opts.LeafNode.TLSConfig = certs.serverConfig()
	case h.cfg.LeafCertificates != nil:
		opts.LeafNode.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: h.cfg.LeafCertificates.GetCertificate}
	}
	opts.LeafNode.TLSTimeout, opts.LeafNode.AuthTimeout = LeafTLSTimeout.Seconds(), LeafAuthTimeout.Seconds()
	if c := h.cfg.Cluster; c.Enabled() {
		opts.Cluster = server.ClusterOpts{
			Name:      events.HubCluster,
			Host:      c.Host,
			Port:      c.Port,
			Advertise: c.Advertise,
			Username:  c.User,
			Password:  c.Password,
		}
		opts.Routes = c.routeURLs()
	}
	return opts, nil
}

// jsLimit maps "unset" to the server's own default (-1).
func jsLimit(v int64) int64 {
	if v == 0 {
		return -1
	}
	return v
}

// Start runs the server and waits until it accepts connections and
// JetStream is ready.
func (h *Hub) Start(ctx context.Context) error {
	if err := natsembed.Start(ctx, h.srv, h.slog.Fatal); err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	varz, err := h.srv.Varz(nil)
	if err != nil {
		return fmt.Errorf("hub: varz: %w", err)
	}
	host := h.cfg.Host
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		// Edges must reach the leaf port, so this is the production
		// default; say so, since the client port listens there too.
		h.log.Warn("hub client and leaf listeners accept connections from other hosts (every connection must authenticate)",
			"host", h.cfg.Host, "client_port", varz.Port, "leaf_port", varz.LeafNode.Port)
	}
	if host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	h.leaf = &url.URL{Scheme: "nats-leaf", Host: net.JoinHostPort(host, strconv.Itoa(varz.LeafNode.Port))}
	h.client = &url.URL{Scheme: "nats", Host: net.JoinHostPort(host, strconv.Itoa(varz.Port))}
	if h.cfg.Cluster.Enabled() {
		// A clustered JetStream is ready once its peers elect a meta
		// leader, which needs a quorum of servers: the clients wait for
		// it (hubclient reconciles streams with retries), so one server
		// can start before its peers.
		h.log.Info("hub server ready", "client_url", h.client.String(), "leaf_url", h.leaf.String(),
			"cluster", events.HubCluster, "routes", len(h.cfg.Cluster.Routes), "domain", h.cfg.Domain, "store", h.cfg.StoreDir)
		return nil
	}

	if h.issuer == nil {
		h.log.Info("hub server ready", "client_url", h.client.String(), "leaf_url", h.leaf.String(), "domain", h.cfg.Domain, "store", h.cfg.StoreDir)
		return nil
	}
	// JetStream is usable once the account answers an info request.
	nc, err := h.Connect("hub-ready")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.NewWithDomain(nc, h.cfg.Domain)
	if err != nil {
		return fmt.Errorf("hub: jetstream: %w", err)
	}
	for {
		if _, err := js.AccountInfo(ctx); err == nil {
			break
		} else if ctx.Err() != nil {
			return fmt.Errorf("hub: JetStream not ready: %w", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	h.log.Info("hub ready", "client_url", h.client.String(), "leaf_url", h.leaf.String(), "domain", h.cfg.Domain, "store", h.cfg.StoreDir)
	return nil
}

// Shutdown stops the server, waiting at most until ctx is done.
func (h *Hub) Shutdown(ctx context.Context) error {
	return natsembed.Shutdown(ctx, h.srv)
}

// LameDuck stops the server the gentle way: it stops accepting
// connections, hands its JetStream leaderships to the other servers of the
// cluster, closes its connections one at a time over Config.LameDuck
// (each closed with the reason "Server Shutdown", which the other servers'
// system events carry), then shuts down. It returns once the server is
// down or ctx is done.
func (h *Hub) LameDuck(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		h.srv.LameDuckShutdown()
		h.srv.WaitForShutdown()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("hub: lame duck %s: %w", h.cfg.ServerName, ctx.Err())
	}
}

// Server is the embedded server, for tests and monitoring.
func (h *Hub) Server() *server.Server { return h.srv }

// Issuer signs user JWTs with the identity directory's keys (nil on a
// server started with Config.Trust alone).
func (h *Hub) Issuer() *identity.Issuer { return h.issuer }

// Trust is the operator and accounts the server trusts.
func (h *Hub) Trust() identity.Trust { return h.trust }

// Violations counts the permission violations the server refused.
func (h *Hub) Violations() int64 { return h.slog.Violations() }

// Domain is the hub's JetStream domain.
func (h *Hub) Domain() string { return h.cfg.Domain }

// ClientURL is where cloud services and operators connect (valid after
// Start; a wildcard listener is reached on loopback).
func (h *Hub) ClientURL() string { return h.client.String() }

// ClientConfig is how the cloud services of this process dial the hub:
// in process (no socket, no loopback TCP hop for every message they
// send and receive), named by its client URL, with the service identity
// the hub made for them at New (valid after Start; the domain before).
func (h *Hub) ClientConfig() hublink.ClientConfig {
	cfg := hublink.ClientConfig{Domain: h.cfg.Domain, Nkey: h.svc, UserJWT: h.svcJWT, InProcess: h.srv}
	if h.client != nil {
		cfg.URLs = []string{h.client.String()}
	}
	return cfg
}

// RouteURL is the URL hub peers route to (valid after Start; empty
// without a cluster).
func (h *Hub) RouteURL() string {
	if !h.cfg.Cluster.Enabled() {
		return ""
	}
	addr := h.srv.ClusterAddr()
	if addr == nil {
		return ""
	}
	host := h.cfg.Cluster.Host
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "nats-route://" + net.JoinHostPort(host, strconv.Itoa(addr.Port))
}

// Name is the server name.
func (h *Hub) Name() string { return h.cfg.ServerName }

// LeafURL is where edge servers connect their leaf remotes.
func (h *Hub) LeafURL() *url.URL { u := *h.leaf; return &u }

// LeafURLs lists LeafURL, for code that takes the leaf URLs of a hub
// cluster.
func (h *Hub) LeafURLs() []string { return []string{h.LeafURL().String()} }

// IssueEdge issues the user JWT of node in unit for the nkey public key
// pub, without expiry: how tests and tools enroll a node directly (the
// cloud enrolls through cloud/identity's service).
func (h *Hub) IssueEdge(node, unit, pub string) (string, error) {
	if h.issuer == nil {
		return "", errors.New("hub: this server holds no identity keys")
	}
	return h.issuer.Edge(node, unit, pub, 0)
}

// Connect opens an in-process connection as the cloud service identity,
// for tests and tools; the cloud services themselves dial ClientConfig.
func (h *Hub) Connect(name string, opts ...nats.Option) (*nats.Conn, error) {
	if h.issuer == nil {
		return nil, errors.New("hub: this server holds no identity keys")
	}
	return natsembed.ConnectJWT(h.srv, h.svc, h.svcJWT, name, opts...)
}
