// Package natsnode embeds an edge node's NATS server. The servers of one
// NodeUnit form a cluster over routes (cluster name = unit, server name =
// node), so unit-local traffic (probe reports, votes) keeps flowing while
// the cloud link is down; each server also keeps its own leafnode
// connection to the hub. The unit membership can change at runtime: SetMesh
// reloads the routes without restarting the server.
package natsnode

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/natsembed"
	"github.com/atoll-edge/atoll/internal/natslog"
)

// Mesh is the unit membership a node's server routes to.
type Mesh struct {
	// Unit is the NodeUnit; empty when the node is in no unit.
	Unit string
	// Peers are the unit's members; the node itself may be listed.
	Peers []Peer
	// User and Password authenticate routes inside the unit; every
	// member of the unit holds the same pair and no other unit does.
	User, Password string
}

// Peer is one member of a unit.
type Peer struct {
	Name string
	// RouteURL is the member's route listener, nats-route://host:port.
	RouteURL string
}

// Validate names the first problem of m.
func (m Mesh) Validate() error {
	if m.Unit == "" {
		if len(m.Peers) > 0 {
			return errors.New("mesh: peers without a unit")
		}
		return nil
	}
	if err := events.ValidUnit(m.Unit); err != nil {
		return fmt.Errorf("mesh: unit: %w", err)
	}
	if m.User == "" || m.Password == "" {
		return fmt.Errorf("mesh %s: route user and password must be set", m.Unit)
	}
	for _, p := range m.Peers {
		if err := events.ValidName(p.Name); err != nil {
			return fmt.Errorf("mesh %s: peer name: %w", m.Unit, err)
		}
		u, err := url.Parse(p.RouteURL)
		if err != nil || u.Scheme != "nats-route" || u.Host == "" {
			return fmt.Errorf("mesh %s: peer %s: route URL %q is not nats-route://host:port", m.Unit, p.Name, p.RouteURL)
		}
	}
	return nil
}

// Node is a running edge NATS server.
type Node struct {
	cfg Config
	// hubTLS verifies the hub's leaf certificate (nil: no CA configured).
	hubTLS *tls.Config
	log    *slog.Logger
	slog   *natslog.Logger // the server's logger; reports a listener that cannot bind
	seed   string
	key    nkeys.KeyPair // from seed
	// creds is the private credentials file the leaf remote reads at
	// every connect (empty: plain nkey authentication), a copy of the
	// credentials in use; src says whose they are (a bootstrap token's or
	// the shared enrollment credentials until the node enrolls).
	creds string
	// credsTemp is the temporary directory holding creds, if it is one.
	credsTemp string
	userJWT   string
	src       credSource
	agent     nkeys.KeyPair
	users     []*server.NkeyUser
	// solo authenticates routes while the node is in no unit: nobody
	// knows it, so nobody can route in.
	solo string

	// done is closed by Shutdown.
	done chan struct{}

	mu          sync.Mutex
	srv         *server.Server
	mesh        Mesh
	started     bool // Start was called: options change by reload
	leafEnabled bool
	routeURL    string
	rotations   uint64 // route credential changes within one unit
	// cloudKey is the issuer of cloudKeyOf, the user JWT it was read
	// from (CloudKey).
	cloudKey, cloudKeyOf string
}

// New prepares the node's server; Start runs it.
func New(cfg Config, log *slog.Logger) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	seed, userJWT, src, err := cfg.credentials()
	if err != nil {
		return nil, err
	}
	if src == credEnrollPending {
		// A key of its own until the enrollment credentials arrive: it
		// signs nothing anyone verifies and links nowhere.
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, fmt.Errorf("natsnode: key: %w", err)
		}
		b, _ := kp.Seed()
		seed = string(b)
	}
	key, err := nkeys.FromSeed([]byte(seed))
	if err != nil {
		return nil, fmt.Errorf("natsnode: seed: %w", err)
	}
	hubTLS, err := cfg.hubTLS()
	if err != nil {
		return nil, err
	}
	agent, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("natsnode: agent key: %w", err)
	}
	pub, _ := agent.PublicKey()
	var secret [16]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return nil, fmt.Errorf("natsnode: solo secret: %w", err)
	}
	n := &Node{
		cfg:         cfg,
		log:         log.With("component", "natsnode"),
		seed:        seed,
		key:         key,
		hubTLS:      hubTLS,
		agent:       agent,
		users:       []*server.NkeyUser{{Nkey: pub}},
		solo:        hex.EncodeToString(secret[:]),
		leafEnabled: src != credEnrollPending,
		done:        make(chan struct{}),
	}
	n.userJWT, n.src = userJWT, src
	if userJWT != "" || src == credEnrollPending {
		if err := n.makeCredsCopy(); err != nil {
			return nil, err
		}
		if userJWT != "" {
			if err := writeCreds(n.creds, userJWT, key); err != nil {
				return nil, err
			}
		}
	}
	n.slog = natslog.New(n.log, cfg.NodeName)
	if err := n.newServer(); err != nil {
		return nil, err
	}
	return n, nil
}

// makeCredsCopy chooses where the leaf link's copy of the credentials in
// use lives: beside the node's creds file, where the next start writes it
// again, or in a directory of its own under the system's temporary
// directory when the node has no creds file (Shutdown removes it; a
// killed process leaves it behind).
func (n *Node) makeCredsCopy() error {
	if f := n.cfg.CredsFile; f != "" && n.cfg.Seed == "" {
		dir := filepath.Dir(f)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("natsnode: credentials: %w", err)
		}
		n.creds = filepath.Join(dir, "."+filepath.Base(f)+".link")
		return nil
	}
	dir, err := os.MkdirTemp("", "atoll-natsnode-")
	if err != nil {
		return fmt.Errorf("natsnode: credentials: %w", err)
	}
	n.creds, n.credsTemp = filepath.Join(dir, "leaf.creds"), dir
	return nil
}

// newServer makes the server for the current options; callers hold mu
// (or have not shared n yet), before Start.
func (n *Node) newServer() error {
	srv, err := server.NewServer(n.options())
	if err != nil {
		return fmt.Errorf("natsnode: %w", err)
	}
	srv.SetLoggerV2(n.slog, false, false, false)
	n.srv = srv
	return nil
}

// options builds the server options for the current mesh; callers hold mu
// (or have not shared n yet).
func (n *Node) options() *server.Options {
	cluster := server.ClusterOpts{
		Name:        "solo-" + n.cfg.NodeName,
		Host:        n.cfg.RouteHost,
		Port:        n.cfg.RoutePort,
		Advertise:   n.cfg.RouteAdvertise,
		Username:    "solo",
		Password:    n.solo,
		NoAdvertise: true,
		// One connection per peer: edge units are small and their
		// traffic is light.
		PoolSize: -1,
	}
	var routes []*url.URL
	if m := n.mesh; m.Unit != "" {
		cluster.Name, cluster.Username, cluster.Password = m.Unit, m.User, m.Password
		for _, p := range m.Peers {
			if p.Name == n.cfg.NodeName {
				continue
			}
			u, _ := url.Parse(p.RouteURL)
			u.User = url.UserPassword(m.User, m.Password)
			routes = append(routes, u)
		}
	}
	hubs := make([]*url.URL, 0, len(n.cfg.HubURLs))
	for _, s := range HubOrder(n.cfg.NodeName, n.cfg.HubURLs) {
		u, _ := parseLeafURL(s)
		hubs = append(hubs, u)
	}
	ping, pings := n.cfg.HubPingInterval, n.cfg.HubMaxPingsOut
	if ping == 0 {
		ping = DefaultHubPingInterval
	}
	if pings == 0 {
		pings = DefaultHubMaxPingsOut
	}
	return &server.Options{
		PingInterval: ping,
		MaxPingsOut:  pings,
		ServerName:   n.cfg.NodeName,
		Host:         n.cfg.ClientHost,
		Port:         n.cfg.ClientPort,
		NoSigs:       true,
		MaxPayload:   1 << 20,
		Nkeys:        n.users,
		Cluster:      cluster,
		Routes:       routes,
		LeafNode: server.LeafNodeOpts{
			ReconnectInterval: HubReconnectInterval,
			Remotes:           []*server.RemoteLeafOpts{n.remote(hubs)},
		},
	}
}

// remote is the leaf remote to the hub: with credentials, every connect
// reads the current user JWT from the creds file (SetUserJWT) and signs
// the nonce with the node's key; without, it authenticates with the bare
// nkey.
func (n *Node) remote(hubs []*url.URL) *server.RemoteLeafOpts {
	// The URLs are already in this node's order (HubOrder): nats-server
	// must not shuffle them again.
	// RequestIsolation: the hub keeps other leafs' subscriptions to
	// itself, whether or not its operator set isolate_leafnode_interest
	// (both of Atoll's hub shapes do). Nothing an agent follows is
	// published by another node through the hub (a unit's members talk
	// over their routes); without it, every agent's queue subscription
	// to the shared views would reach every other leaf as each links.
	r := &server.RemoteLeafOpts{URLs: hubs, NoRandomize: true, Disabled: !n.leafEnabled, FirstInfoTimeout: HubInfoTimeout,
		RequestIsolation: true}
	if n.cfg.HubCompression != "" {
		r.Compression.Mode = n.cfg.HubCompression
	}
	if n.hubTLS != nil {
		r.TLS, r.TLSConfig, r.TLSTimeout = true, n.hubTLS.Clone(), HubTLSTimeout.Seconds()
	}
	if n.creds == "" {
		r.Nkey = n.seed
	} else {
		r.Credentials = n.creds
	}
	return r
}

// writeCreds writes a NATS credentials file atomically, readable only by
// its owner.
func writeCreds(path, userJWT string, key nkeys.KeyPair) error {
	seed, err := key.Seed()
	if err != nil {
		return fmt.Errorf("natsnode: credentials: %w", err)
	}
	data, err := jwt.FormatUserConfig(userJWT, seed)
	if err != nil {
		return fmt.Errorf("natsnode: credentials: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".creds-")
	if err != nil {
		return fmt.Errorf("natsnode: credentials: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("natsnode: credentials: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("natsnode: credentials: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("natsnode: credentials: %w", err)
	}
	return nil
}

// SetUserJWT replaces the user JWT the leaf link presents (a renewed or
// re-scoped one for the node's key); see SetCredentials.
func (n *Node) SetUserJWT(userJWT string) error {
	n.mu.Lock()
	key := n.key
	n.mu.Unlock()
	return n.SetCredentials(userJWT, key)
}

// SetCredentials makes userJWT and key the node's credentials: they are
// written to the configured creds file (the node's identity from now on)
// and the leaf link reconnects with them at once, so the hub applies the
// new permissions; the unit's routes stay up meanwhile.
func (n *Node) SetCredentials(userJWT string, key nkeys.KeyPair) error {
	if userJWT == "" {
		return errors.New("natsnode: empty user JWT")
	}
	claims, err := jwt.DecodeUserClaims(userJWT)
	if err != nil {
		return fmt.Errorf("natsnode: credentials: %w", err)
	}
	pub, err := key.PublicKey()
	if err != nil || claims.Subject != pub {
		return errors.New("natsnode: credentials: the JWT is for another key")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.creds == "" {
		return errors.New("natsnode: credentials: the node authenticates with a bare nkey")
	}
	if n.userJWT == userJWT {
		return nil
	}
	if n.cfg.CredsFile != "" && n.cfg.Seed == "" {
		if err := writeCreds(n.cfg.CredsFile, userJWT, key); err != nil {
			return err
		}
	}
	if err := writeCreds(n.creds, userJWT, key); err != nil {
		return err
	}
	n.userJWT, n.key, n.src = userJWT, key, credOwn
	if seed, err := key.Seed(); err == nil {
		n.seed = string(seed)
	}
	if !n.leafEnabled {
		return nil
	}
	// A disabled remote drops its connection; enabled again, it dials
	// with the new file.
	n.leafEnabled = false
	if err := n.srv.ReloadOptions(n.options()); err != nil {
		n.leafEnabled = true
		return fmt.Errorf("natsnode: credentials: %w", err)
	}
	n.leafEnabled = true
	if err := n.srv.ReloadOptions(n.options()); err != nil {
		return fmt.Errorf("natsnode: credentials: %w", err)
	}
	return nil
}

// Bootstrapping returns the bootstrap token's JWT while the node links
// with it (it has not enrolled yet).
func (n *Node) Bootstrapping() (token string, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.src != credBootstrap {
		return "", false
	}
	return n.userJWT, true
}

// EnrollingByServiceAccount reports whether the node links with the
// shared enrollment credentials: it has not enrolled yet, and enrolls
// with its pod's ServiceAccount token.
func (n *Node) EnrollingByServiceAccount() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.src == credEnroll
}

// UserJWT is the user JWT the leaf link presents (empty: bare nkey).
func (n *Node) UserJWT() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.userJWT
}

// CloudKey is the key the cloud signs what unit peers relay with (the
// shared views, edge/viewfeed): the issuer of the node's user JWT, the
// application account's signing key. Empty when the node links with a
// bare nkey or before it has credentials (bootstrap credentials are
// issued by the same key).
func (n *Node) CloudKey() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.userJWT == "" {
		return ""
	}
	if n.userJWT != n.cloudKeyOf {
		n.cloudKeyOf, n.cloudKey = n.userJWT, ""
		if c, err := jwt.DecodeUserClaims(n.userJWT); err == nil {
			n.cloudKey = c.Issuer
		}
	}
	return n.cloudKey
}

// Meshed reports whether the node's server has a route to every other
// member of its unit (false in no unit): whatever one member publishes
// on the unit's routes then reaches it.
func (n *Node) Meshed() bool {
	n.mu.Lock()
	m, srv := n.mesh, n.srv
	n.mu.Unlock()
	if m.Unit == "" || srv == nil {
		return false
	}
	rz, err := srv.Routez(nil)
	if err != nil {
		return false
	}
	routed := make(map[string]bool, len(rz.Routes))
	for _, r := range rz.Routes {
		routed[r.RemoteName] = true
	}
	for _, p := range m.Peers {
		if p.Name != n.cfg.NodeName && !routed[p.Name] {
			return false
		}
	}
	return true
}

// PublicKey is the public key of the nkey the node links with (its
// identity on the hub; a bootstrap token's until it enrolled).
func (n *Node) PublicKey() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, _ := n.key.PublicKey()
	return p
}

// Start runs the server and waits until it accepts connections. The leaf
// link to the hub comes up in the background; the node serves its unit
// without it.
func (n *Node) Start(ctx context.Context) error {
	n.mu.Lock()
	n.started = true
	n.mu.Unlock()
	if err := natsembed.Start(ctx, n.srv, n.slog.Fatal); err != nil {
		return fmt.Errorf("natsnode: %w", err)
	}
	adv := n.cfg.RouteAdvertise
	if adv == "" {
		addr := n.srv.ClusterAddr()
		if addr == nil {
			return errors.New("natsnode: no route listener")
		}
		host := n.cfg.RouteHost
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
			host = "127.0.0.1"
		}
		adv = net.JoinHostPort(host, strconv.Itoa(addr.Port))
	}
	n.mu.Lock()
	n.routeURL = "nats-route://" + adv
	n.mu.Unlock()
	n.log.Info("edge server ready", "client_url", n.srv.ClientURL(), "route_url", n.routeURL)
	if n.EnrollmentPending() {
		go n.awaitEnrollCreds(enrollPoll)
	}
	return nil
}

// enrollPoll is how often a node waiting for the enrollment credentials
// looks for them.
const enrollPoll = time.Second

// EnrollmentPending reports whether the node waits for the shared
// enrollment credentials (Config.EnrollCredsFile) to link to the hub.
func (n *Node) EnrollmentPending() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.src == credEnrollPending
}

// awaitEnrollCreds waits until the enrollment credentials file holds
// credentials (the kubelet writes the Secret's key into the pod's volume
// once atoll-cloud has filled it), then links the node to the hub with
// them, or until Shutdown.
func (n *Node) awaitEnrollCreds(every time.Duration) {
	n.log.Info("waiting for the enrollment credentials (atoll-cloud writes them into the Secret atoll-edge-enroll)", "file", n.cfg.EnrollCredsFile)
	t := time.NewTicker(every)
	defer t.Stop()
	var warned string
	for {
		select {
		case <-n.done:
			return
		case <-t.C:
		}
		if _, err := os.Stat(n.cfg.EnrollCredsFile); errors.Is(err, os.ErrNotExist) {
			continue
		}
		err := n.linkWithEnrollCreds()
		if err == nil {
			n.log.Info("enrollment credentials found; linking to the hub")
			return
		}
		if err.Error() != warned {
			warned = err.Error()
			n.log.Warn("the enrollment credentials cannot be used; waiting for others", "err", err)
		}
	}
}

// linkWithEnrollCreds reads the enrollment credentials and enables the
// leaf link with them.
func (n *Node) linkWithEnrollCreds() error {
	seed, userJWT, err := readCreds(n.cfg.EnrollCredsFile)
	if err != nil {
		return err
	}
	key, err := nkeys.FromSeed([]byte(seed))
	if err != nil {
		return fmt.Errorf("natsnode: enrollment credentials: %w", err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := writeCreds(n.creds, userJWT, key); err != nil {
		return err
	}
	oldSeed, oldJWT, oldKey := n.seed, n.userJWT, n.key
	n.seed, n.userJWT, n.key, n.src, n.leafEnabled = seed, userJWT, key, credEnroll, true
	if err := n.srv.ReloadOptions(n.options()); err != nil {
		n.seed, n.userJWT, n.key, n.src, n.leafEnabled = oldSeed, oldJWT, oldKey, credEnrollPending, false
		return fmt.Errorf("natsnode: link with the enrollment credentials: %w", err)
	}
	return nil
}

// Shutdown stops the server, waiting at most until ctx is done.
func (n *Node) Shutdown(ctx context.Context) error {
	n.mu.Lock()
	select {
	case <-n.done:
	default:
		close(n.done)
	}
	n.mu.Unlock()
	err := natsembed.Shutdown(ctx, n.srv)
	if n.credsTemp != "" {
		_ = os.RemoveAll(n.credsTemp)
	} else if n.creds != "" {
		_ = os.Remove(n.creds)
	}
	return err
}

// SetMesh makes the server route to exactly the members of m's unit. It
// takes effect without a restart: routes to departed members close, routes
// to new members open, and a change of unit (or leaving every unit) swaps
// the route credentials, which also drops routes from the old unit.
//
// New credentials for the same unit (the cloud rotates them when a member
// leaves) also take effect at once: routes accepted with the old password
// are closed, and the server dials its peers with the new one. Until a
// peer applies the new credentials too, the two refuse each other's
// routes, and reconnect (every second) once both have; the departed node,
// left with the old password, stays refused.
func (n *Node) SetMesh(m Mesh) error {
	if err := m.Validate(); err != nil {
		return err
	}
	m.Peers = slices.Clone(m.Peers)
	sort.Slice(m.Peers, func(i, j int) bool { return m.Peers[i].Name < m.Peers[j].Name })
	n.mu.Lock()
	defer n.mu.Unlock()
	if meshEqual(n.mesh, m) {
		return nil
	}
	old := n.mesh
	n.mesh = m
	if !n.started {
		// The unit kept from an earlier run (edge/membership restores it
		// before the server starts): the server starts in its unit's
		// cluster, so the hub link is not closed for a cluster name
		// that changed under it.
		if err := n.newServer(); err != nil {
			n.mesh = old
			return fmt.Errorf("natsnode: mesh of unit %q: %w", m.Unit, err)
		}
		n.log.Info("starting in the unit kept from the last run", "unit", m.Unit, "peers", len(m.Peers))
		return nil
	}
	if err := n.srv.ReloadOptions(n.options()); err != nil {
		n.mesh = old
		return fmt.Errorf("natsnode: apply mesh of unit %q: %w", m.Unit, err)
	}
	if old.Unit != "" && old.Unit == m.Unit && (old.User != m.User || old.Password != m.Password) {
		n.rotations++
		n.log.Info("route credentials of the unit rotated; routes reconnect with the new ones", "unit", m.Unit, "peers", len(m.Peers))
		return nil
	}
	n.log.Info("mesh changed", "unit", m.Unit, "peers", len(m.Peers))
	return nil
}

func meshEqual(a, b Mesh) bool {
	return a.Unit == b.Unit && a.User == b.User && a.Password == b.Password && slices.Equal(a.Peers, b.Peers)
}

// SetLeafEnabled connects or disconnects the node's leaf link to the hub
// at runtime (an operator's switch, and the tests' way to cut a link).
func (n *Node) SetLeafEnabled(on bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.leafEnabled == on {
		return nil
	}
	n.leafEnabled = on
	if err := n.srv.ReloadOptions(n.options()); err != nil {
		n.leafEnabled = !on
		return fmt.Errorf("natsnode: set leaf enabled=%v: %w", on, err)
	}
	return nil
}

// Mesh returns the current unit membership.
func (n *Node) Mesh() Mesh {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.mesh
}

// RouteURL is the URL unit peers route to (valid after Start).
func (n *Node) RouteURL() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.routeURL
}

// Name is the node name.
func (n *Node) Name() string { return n.cfg.NodeName }

// Server is the embedded server, for tests and monitoring.
func (n *Node) Server() *server.Server { return n.srv }

// Connect opens an in-process connection to the node's server.
// Its replies come to the node's own inbox prefix, the only inbox the
// node's hub credentials may hear.
func (n *Node) Connect(name string, opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.CustomInboxPrefix(events.InboxPrefix(n.cfg.NodeName))}, opts...)
	return natsembed.Connect(n.srv, n.agent, name, opts...)
}

// HubLink identifies the node's current leaf connection to the hub.
type HubLink struct {
	// ID is the connection's id on the node's server: a new connection
	// (a reconnect, to the same hub server or another) has a new one. 0
	// while the link is down.
	ID uint64
	// Server is the hub server's name.
	Server string
}

// HubLink returns the node's current leaf connection to the hub (zero
// while it is down).
func (n *Node) HubLink() HubLink {
	if n.srv == nil || n.srv.NumLeafNodes() == 0 {
		return HubLink{}
	}
	lz, err := n.srv.Leafz(nil)
	if err != nil {
		return HubLink{}
	}
	var l HubLink
	for _, li := range lz.Leafs {
		// One remote, so one connection; the newest wins should a
		// closing one still be listed.
		if li.ID > l.ID {
			l = HubLink{ID: li.ID, Server: li.Name}
		}
	}
	return l
}

// Status is a snapshot of the server's links.
type Status struct {
	Unit string
	// RoutedPeers are the names of the servers this one has routes to.
	RoutedPeers []string
	// HubConnected is true while the leaf link to the hub is up.
	HubConnected bool
	// HubServer names the hub server the leaf link is on ("" while down).
	HubServer string
	// RouteRotations counts the route credential changes applied within
	// one unit since the server started.
	RouteRotations uint64
}

// Status reports the server's current links.
func (n *Node) Status() Status {
	n.mu.Lock()
	st := Status{Unit: n.mesh.Unit, RouteRotations: n.rotations}
	n.mu.Unlock()
	if l := n.HubLink(); l.ID != 0 {
		st.HubConnected, st.HubServer = true, l.Server
	}
	if rz, err := n.srv.Routez(nil); err == nil {
		for _, r := range rz.Routes {
			if !slices.Contains(st.RoutedPeers, r.RemoteName) {
				st.RoutedPeers = append(st.RoutedPeers, r.RemoteName)
			}
		}
	}
	sort.Strings(st.RoutedPeers)
	return st
}
