// Package hub embeds the cloud's NATS hub: a JetStream server (domain "hub")
// that every edge node's NATS server connects to as a leafnode, and that the
// cloud services use for streams and consumers.
//
// Accounts: SYS (system) and ATOLL (application, JetStream enabled). Every
// connection authenticates through Identities and is bound to ATOLL; no
// anonymous access.
package hub

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/internal/natsembed"
	"github.com/atoll-edge/atoll/internal/natslog"
)

// Account names on the hub.
const (
	AppAccount    = "ATOLL"
	SystemAccount = "SYS"
	// ClusterName is the hub's cluster name; edge units must not use it.
	ClusterName = "atoll-hub"
)

// Hub is a running hub server.
type Hub struct {
	cfg  Config
	log  *slog.Logger
	srv  *server.Server
	ids  *Identities
	svc  nkeys.KeyPair // in-process service identity
	leaf *url.URL
}

// New prepares a hub server; Start runs it.
func New(cfg Config, log *slog.Logger) (*Hub, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h := &Hub{cfg: cfg, log: log.With("component", "hub")}
	h.ids = NewIdentities(h.appAccount)
	for user, pw := range cfg.Operators {
		if err := h.ids.AddOperator(user, pw); err != nil {
			return nil, err
		}
	}
	if cfg.EdgeKeysFile != "" {
		keys, err := LoadEdgeKeys(cfg.EdgeKeysFile)
		if err != nil {
			return nil, err
		}
		for node, pub := range keys {
			if err := h.ids.AddEdge(node, pub); err != nil {
				return nil, fmt.Errorf("%s: %w", cfg.EdgeKeysFile, err)
			}
		}
	}
	svc, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("hub: service key: %w", err)
	}
	pub, _ := svc.PublicKey()
	if err := h.ids.AddService("atoll-cloud", pub); err != nil {
		return nil, err
	}
	h.svc = svc

	opts, err := h.options()
	if err != nil {
		return nil, err
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("hub: %w", err)
	}
	srv.SetLoggerV2(natslog.New(h.log, cfg.ServerName), true, false, false)
	h.srv = srv
	return h, nil
}

func (h *Hub) options() (*server.Options, error) {
	// Accounts with JetStream can only be declared in configuration text.
	conf := fmt.Sprintf(`
server_name: %q
accounts { %s: {}, %s: { jetstream: enabled } }
system_account: %s
jetstream { domain: %q, store_dir: %q, max_memory_store: %d, max_file_store: %d }
`, h.cfg.ServerName, SystemAccount, AppAccount, SystemAccount, h.cfg.Domain, h.cfg.StoreDir,
		jsLimit(h.cfg.MaxMemory), jsLimit(h.cfg.MaxStore))
	opts := &server.Options{}
	if err := opts.ProcessConfigString(conf); err != nil {
		return nil, fmt.Errorf("hub: options: %w", err)
	}
	opts.Host = h.cfg.Host
	opts.Port = h.cfg.ClientPort
	opts.NoSigs = true
	opts.MaxPayload = 1 << 20
	opts.CustomClientAuthentication = h.ids
	opts.AlwaysEnableNonce = true
	opts.LeafNode.Host = h.cfg.Host
	opts.LeafNode.Port = h.cfg.LeafPort
	opts.LeafNode.Advertise = h.cfg.LeafAdvertise
	opts.LeafNode.NoAdvertise = h.cfg.LeafAdvertise == ""
	return opts, nil
}

// jsLimit maps "unset" to the server's own default (-1).
func jsLimit(v int64) int64 {
	if v == 0 {
		return -1
	}
	return v
}

func (h *Hub) appAccount() *server.Account {
	if h.srv == nil {
		return nil
	}
	acc, err := h.srv.LookupAccount(AppAccount)
	if err != nil {
		return nil
	}
	return acc
}

// Start runs the server and waits until it accepts connections and
// JetStream is ready.
func (h *Hub) Start(ctx context.Context) error {
	if err := natsembed.Start(ctx, h.srv); err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	varz, err := h.srv.Varz(nil)
	if err != nil {
		return fmt.Errorf("hub: varz: %w", err)
	}
	host := h.cfg.Host
	if host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	h.leaf = &url.URL{Scheme: "nats-leaf", Host: net.JoinHostPort(host, strconv.Itoa(varz.LeafNode.Port))}

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
	h.log.Info("hub ready", "client_url", h.srv.ClientURL(), "leaf_url", h.leaf.String(), "domain", h.cfg.Domain, "store", h.cfg.StoreDir)
	return nil
}

// Shutdown stops the server, waiting at most until ctx is done.
func (h *Hub) Shutdown(ctx context.Context) error { return natsembed.Shutdown(ctx, h.srv) }

// Server is the embedded server, for tests and monitoring.
func (h *Hub) Server() *server.Server { return h.srv }

// Identities is the registry of who may connect.
func (h *Hub) Identities() *Identities { return h.ids }

// Domain is the hub's JetStream domain.
func (h *Hub) Domain() string { return h.cfg.Domain }

// ClientURL is where cloud services and operators connect.
func (h *Hub) ClientURL() string { return h.srv.ClientURL() }

// LeafURL is where edge servers connect their leaf remotes.
func (h *Hub) LeafURL() *url.URL { u := *h.leaf; return &u }

// Connect opens an in-process connection as the cloud service identity.
func (h *Hub) Connect(name string, opts ...nats.Option) (*nats.Conn, error) {
	return natsembed.Connect(h.srv, h.svc, name, opts...)
}
