package hub

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"sigs.k8s.io/yaml"
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
	// StoreDir holds the JetStream streams.
	StoreDir string
	// Domain is the JetStream domain edge clients address the hub by.
	Domain string
	// MaxMemory and MaxStore cap JetStream (0: server defaults).
	MaxMemory int64
	MaxStore  int64
	// EdgeKeysFile is a YAML map of node name to the node's NATS nkey
	// public key ("U..."); only these nodes may open leaf connections.
	// The hub re-reads it every EdgeKeysReload: a node removed from it (or
	// given another key) loses its live leaf connection within seconds and
	// is refused when it reconnects.
	EdgeKeysFile string
	// EdgeKeysReload is how often EdgeKeysFile is re-read.
	EdgeKeysReload time.Duration
	// Operators are user/password logins for operator tools (atoll events
	// tail, nats CLI). Passwords may be bcrypt hashes.
	Operators map[string]string
	// Cluster makes this server one of a hub cluster (zero: a single
	// server). Every server of the cluster has the same Domain and a
	// unique ServerName; streams then want Replicas 3.
	Cluster ClusterConfig
}

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

		EdgeKeysReload: 5 * time.Second,
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
	case c.EdgeKeysFile != "" && c.EdgeKeysReload < 100*time.Millisecond:
		return fmt.Errorf("hub: edge keys reload %v must be at least 100ms", c.EdgeKeysReload)
	}
	if err := c.Cluster.Validate(); err != nil {
		return err
	}
	for user, pw := range c.Operators {
		if user == "" || pw == "" {
			return fmt.Errorf("hub: operator %q: user and password must both be set", user)
		}
	}
	return nil
}

// LoadEdgeKeys reads a YAML map of node name → nkey public key.
func LoadEdgeKeys(path string) (map[string]string, error) {
	data, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		return nil, fmt.Errorf("edge keys: %w", err)
	}
	return parseEdgeKeys(path, data)
}

func parseEdgeKeys(path string, data []byte) (map[string]string, error) {
	keys := map[string]string{}
	if err := yaml.UnmarshalStrict(data, &keys); err != nil {
		return nil, fmt.Errorf("edge keys %s: %w", path, err)
	}
	return keys, nil
}
