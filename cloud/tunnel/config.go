package tunnel

import (
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/tlsreload"
	"github.com/atoll-edge/atoll/internal/tunnelproto"
)

// Forward is a TCP port forward: connections to Listen reach Target
// ("host:port", mapped by the node's agent to an allow-listed local
// address) on Node.
type Forward struct {
	Listen, Node, Target string
}

// ParseForward reads "listen=node/target", e.g. "127.0.0.1:9100=edge-1/127.0.0.1:9100".
func ParseForward(s string) (Forward, error) {
	listen, rest, ok := strings.Cut(s, "=")
	node, target, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 {
		return Forward{}, fmt.Errorf("forward %q: want listen=node/host:port", s)
	}
	return Forward{Listen: listen, Node: node, Target: target}, nil
}

// Config of the tunnel server.
type Config struct {
	// ConnectAddr is the HTTP CONNECT listener ("host:port", or
	// "unix:/path" for a socket the apiserver's egress selector dials);
	// empty: none.
	ConnectAddr string
	// ConnectTLS is the CONNECT listener's mutual TLS; required when a
	// TCP ConnectAddr is not loopback.
	ConnectTLS TLS
	// Forwards are TCP port forwards.
	Forwards []Forward
	// DialTimeout bounds opening a session (the agent reaching its target).
	DialTimeout time.Duration
	// Relay relays a node's sessions through a peer of its unit when the
	// node's own leaf link is known down or the node falls silent for
	// RelayAfter (internal/tunnelproto RelayPolicy).
	Relay bool
	// RelayAfter is the silence that moves a session to its next path.
	RelayAfter time.Duration
	// APIServer is kube-apiserver's "host:port": nodes whose local API
	// endpoint runs with --apiserver-via=hub reach it through this
	// replica (APIServerDial); empty: this replica relays none.
	APIServer string
	// APIServerPerNode bounds the connections to kube-apiserver this
	// replica relays for one node.
	APIServerPerNode int
	// Session tunes the session protocol.
	Session tunnelproto.Config
}

// DefaultConfig serves nothing until an address or forward is set.
func DefaultConfig() Config {
	return Config{DialTimeout: 15 * time.Second, Relay: true, RelayAfter: time.Second, APIServerPerNode: 16}
}

// Validate names the bad field.
func (c Config) Validate() error {
	if c.ConnectAddr != "" && !strings.HasPrefix(c.ConnectAddr, "unix:") {
		if _, _, err := net.SplitHostPort(c.ConnectAddr); err != nil {
			return fmt.Errorf("tunnel: ConnectAddr %q: %w", c.ConnectAddr, err)
		}
	}
	if err := c.ConnectTLS.validate(c.ConnectAddr); err != nil {
		return err
	}
	if c.ConnectTLS.Enabled() {
		if err := tlsreload.Check(tlsreload.Files(c.ConnectTLS), names); err != nil {
			return err
		}
	}
	for i, f := range c.Forwards {
		if _, _, err := net.SplitHostPort(f.Listen); err != nil {
			return fmt.Errorf("tunnel: Forwards[%d].Listen %q: %w", i, f.Listen, err)
		}
		if err := events.ValidName(f.Node); err != nil {
			return fmt.Errorf("tunnel: Forwards[%d].Node: %w", i, err)
		}
		if _, _, err := net.SplitHostPort(f.Target); err != nil {
			return fmt.Errorf("tunnel: Forwards[%d].Target %q: %w", i, f.Target, err)
		}
	}
	if c.APIServer != "" {
		if _, _, err := net.SplitHostPort(c.APIServer); err != nil {
			return fmt.Errorf("tunnel: APIServer %q: want host:port: %w", c.APIServer, err)
		}
		if c.APIServerPerNode <= 0 {
			return fmt.Errorf("tunnel: APIServerPerNode %d not positive", c.APIServerPerNode)
		}
	}
	if c.Relay && c.RelayAfter <= 0 {
		return fmt.Errorf("tunnel: RelayAfter %s not positive", c.RelayAfter)
	}
	if c.DialTimeout <= 0 {
		return fmt.Errorf("tunnel: DialTimeout %s not positive", c.DialTimeout)
	}
	return c.Session.Defaults().Validate()
}

// Enabled reports whether the server has anything to serve.
func (c Config) Enabled() bool {
	return c.ConnectAddr != "" || len(c.Forwards) > 0 || c.APIServer != ""
}
