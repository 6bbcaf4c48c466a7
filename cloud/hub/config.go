package hub

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"time"

	"github.com/atoll-edge/atoll/cloud/identity"
)

// Config configures the embedded hub server.
type Config struct {
	// ServerName is the hub server's unique name.
	ServerName string
	// Host is the interface the client and leaf listeners bind to.
	Host string
	// ClientPort serves cloud services and operator tools (-1: random).
	ClientPort int
	// LeafPort accepts the edge nodes' leaf connections (-1: random).
	LeafPort int
	// LeafAdvertise, when set, is the leaf address gossiped to edge servers
	// instead of Host:LeafPort (e.g. the hub's public DNS name). Empty means
	// nothing is gossiped: edges keep using the URLs they were configured
	// with, so a load balancer or proxy in front of the hub is never bypassed.
	LeafAdvertise string
	// LeafTLS, when set, makes the leaf listener require TLS with this
	// certificate, read again when its files change; edges verify it
	// against their hub CA (atoll-edge --hub-ca-file).
	LeafTLS TLSFiles
	// LeafCertificates, when set, makes the leaf listener require TLS with
	// the certificate it serves at each handshake (cloud/hubtls'
	// generated one); exclusive with LeafTLS.
	LeafCertificates LeafCertificates
	// StoreDir holds the JetStream streams.
	StoreDir string
	// Domain is the JetStream domain edge clients address the hub by.
	Domain string
	// MaxMemory and MaxStore cap JetStream (0: server defaults).
	MaxMemory int64
	MaxStore  int64
	// IdentityDir holds the identity keys and the trust (cloud/identity),
	// generated on the first start (default: <StoreDir>/identity). Keep
	// it: edges' credentials are signed with its keys.
	IdentityDir string
	// Trust, when set, is what the server trusts, and it holds no keys:
	// a hub server that atoll-cloud (holding the keys) dials by URL.
	Trust *identity.Trust
	// Cluster makes this server one of a hub cluster (zero: a single
	// server). Every server of the cluster has the same Domain and a
	// unique ServerName; streams then want Replicas 3.
	Cluster ClusterConfig
	// PingInterval is how often the server pings a quiet connection; it
	// closes one that leaves MaxPingsOut pings unanswered. A leaf link that
	// dies silently (no reset, a cut cable) is then closed, and its voter
	// stops counting in the cloud (cloud/health), within about
	// (MaxPingsOut+1) × PingInterval: 12 s by default. 0:
	// DefaultPingInterval.
	PingInterval time.Duration
	// MaxPingsOut is how many pings may go unanswered (0:
	// DefaultMaxPingsOut).
	MaxPingsOut int
	// LameDuck is how long LameDuck takes to close the server's
	// connections, one at a time after a fifth of it, so that clients and
	// edge leafs move to the other servers of a cluster without a
	// reconnect storm (0: nats-server's 2 minutes).
	LameDuck time.Duration
	// MonitorAddr, when set (host:port), serves nats-server's HTTP
	// monitoring there (/varz, /jsz, /connz, /leafz, /healthz): read-only
	// and unauthenticated, so bind it to an address only monitoring
	// reaches. Empty: off.
	MonitorAddr string
}

// DefaultPingInterval and MaxPingsOut bound how long a silently dead
// connection stays open.
const (
	DefaultPingInterval = 4 * time.Second
	DefaultMaxPingsOut  = 2
)

// LeafTLSTimeout bounds a new leaf connection's TLS handshake, and
// LeafAuthTimeout its handshake and CONNECT together. After a restart
// every edge links again at once and the server's cores are shared by
// thousands of handshakes: with 5 s and 6 s (nats-server's defaults are
// 2 s and 3 s) they all ran out together and every edge started over, so
// a hub of 5,000 links never came back (bench:scale --scale-storm). The
// edges wait as long (edge/natsnode HubTLSTimeout). The price: a
// connection that never authenticates holds a goroutine and its buffers
// that long.
const (
	LeafTLSTimeout  = 30 * time.Second
	LeafAuthTimeout = 35 * time.Second
)

// ClusterConfig joins a hub server to its peers over routes.
type ClusterConfig struct {
	// Host and Port are the route listener (Port 0: no cluster; -1: a
	// random port).
	Host string
	Port int
	// Advertise is the route address peers learn from this server
	// (default: the listener's).
	Advertise string
	// Routes are the peers' route URLs, nats-route://host:port; listing
	// this server itself is harmless.
	Routes []string
	// User and Password authenticate routes (both or neither); they are
	// added to Routes that carry no credentials of their own.
	User, Password string
}

// Enabled reports whether the server runs as part of a cluster.
func (c ClusterConfig) Enabled() bool { return c.Port != 0 }

// Validate names the first bad field.
func (c ClusterConfig) Validate() error {
	if !c.Enabled() {
		if len(c.Routes) > 0 || c.Advertise != "" || c.User != "" {
			return errors.New("hub: cluster routes, advertise or user set without a cluster port")
		}
		return nil
	}
	switch {
	case c.Port < -1 || c.Port > 65535:
		return fmt.Errorf("hub: cluster port %d is outside -1..65535", c.Port)
	case c.Host == "":
		return errors.New("hub: cluster host is empty")
	case (c.User == "") != (c.Password == ""):
		return errors.New("hub: cluster user and password must both be set")
	}
	if c.Advertise != "" {
		if _, _, err := net.SplitHostPort(c.Advertise); err != nil {
			return fmt.Errorf("hub: cluster advertise %q: %w", c.Advertise, err)
		}
	}
	for _, r := range c.Routes {
		u, err := url.Parse(r)
		if err != nil || u.Scheme != "nats-route" || u.Host == "" {
			return fmt.Errorf("hub: cluster route %q is not nats-route://host:port", r)
		}
	}
	return nil
}

// routeURLs are the parsed routes, with the cluster credentials filled in.
func (c ClusterConfig) routeURLs() []*url.URL {
	out := make([]*url.URL, 0, len(c.Routes))
	for _, r := range c.Routes {
		u, _ := url.Parse(r)
		if u.User == nil && c.User != "" {
			u.User = url.UserPassword(c.User, c.Password)
		}
		out = append(out, u)
	}
	return out
}

// Default is the configuration of a production hub.
func Default() Config {
	return Config{
		ServerName: "atoll-hub-0",
		Host:       "0.0.0.0",
		ClientPort: 4222,
		LeafPort:   7422,
		StoreDir:   "/var/lib/atoll/hub",
		Domain:     "hub",
		Cluster:    ClusterConfig{Host: "0.0.0.0"},
	}
}

// Validate names the first field that is wrong.
func (c Config) Validate() error {
	switch {
	case c.ServerName == "":
		return errors.New("hub: server name is empty")
	case c.Host == "":
		return errors.New("hub: host is empty")
	case c.ClientPort < -1 || c.ClientPort > 65535:
		return fmt.Errorf("hub: client port %d is outside -1..65535", c.ClientPort)
	case c.LeafPort < -1 || c.LeafPort > 65535:
		return fmt.Errorf("hub: leaf port %d is outside -1..65535", c.LeafPort)
	case c.StoreDir == "":
		return errors.New("hub: store dir is empty")
	case c.Domain == "":
		return errors.New("hub: JetStream domain is empty")
	case c.MaxMemory < 0 || c.MaxStore < 0:
		return errors.New("hub: JetStream limits must not be negative")
	case c.Trust != nil && c.IdentityDir != "":
		return errors.New("hub: identity dir and trust are exclusive")
	case c.PingInterval < 0:
		return errors.New("hub: ping interval must not be negative")
	case c.MaxPingsOut < 0:
		return errors.New("hub: max pings out must not be negative")
	case c.LameDuck < 0:
		return errors.New("hub: lame duck duration must not be negative")
	}
	if c.MonitorAddr != "" {
		if _, port, err := net.SplitHostPort(c.MonitorAddr); err != nil || port == "" {
			return fmt.Errorf("hub: monitor address %q is not host:port", c.MonitorAddr)
		}
	}
	if err := c.LeafTLS.Validate(); err != nil {
		return err
	}
	if c.LeafTLS.Enabled() && c.LeafCertificates != nil {
		return errors.New("hub: leaf TLS: certificate files and generated certificates are exclusive")
	}
	if err := c.Cluster.Validate(); err != nil {
		return err
	}
	return nil
}

// LeafCertificates serves the leaf listener's certificate
// (tls.Config.GetCertificate; a certgen.Rotator).
type LeafCertificates interface {
	GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
}

// IdentityPath is IdentityDir or its default.
func (c Config) IdentityPath() string {
	if c.IdentityDir != "" {
		return c.IdentityDir
	}
	return filepath.Join(c.StoreDir, "identity")
}
