package tunnel

import (
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/atoll-edge/atoll/internal/tunnelproto"
)

// Config of the tunnel agent.
type Config struct {
	// Enabled runs the agent.
	Enabled bool
	// Kubelet is the kubelet's local address; always allowed.
	Kubelet string
	// Allow are further local "host:port" targets the cloud may reach.
	Allow []string
	// Backlog is how many new sessions may wait for the agent to take them
	// (a burst of opens beyond it is refused with "agent busy").
	Backlog int
	// Relay relays the tunnel sessions of this node's unit peers whose
	// own leaf link is down (the cloud asks; the agent checks the node is
	// a member of its unit).
	Relay bool
	// APIServerListen is a loopback "host:port" whose connections go to
	// kube-apiserver through the hub (the local API endpoint's
	// --apiserver-via=hub); empty: none.
	APIServerListen string
	// APIServerTimeout bounds getting one such connection from the cloud.
	APIServerTimeout time.Duration
	// Session tunes the session protocol.
	Session tunnelproto.Config
}

// DefaultConfig allows the kubelet on loopback only.
func DefaultConfig() Config {
	return Config{Enabled: true, Kubelet: "127.0.0.1:10250", Backlog: 4096, Relay: true, APIServerTimeout: 10 * time.Second}
}

// Validate names the bad field.
func (c Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	for _, a := range append([]string{c.Kubelet}, c.Allow...) {
		if _, _, err := splitPort(a); err != nil {
			return fmt.Errorf("tunnel: allowed target %q: %w", a, err)
		}
	}
	if c.APIServerListen != "" {
		host, _, err := net.SplitHostPort(c.APIServerListen)
		if err != nil {
			return fmt.Errorf("tunnel: apiserver listener %q: %w", c.APIServerListen, err)
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return fmt.Errorf("tunnel: apiserver listener %q is not a loopback address: whoever reaches it reaches kube-apiserver from inside the cloud", c.APIServerListen)
		}
		if c.APIServerTimeout <= 0 {
			return fmt.Errorf("tunnel: APIServerTimeout %s not positive", c.APIServerTimeout)
		}
	}
	if c.Backlog <= 0 {
		return fmt.Errorf("tunnel: Backlog %d not positive", c.Backlog)
	}
	return c.Session.Defaults().Validate()
}

func splitPort(hostport string) (string, int, error) {
	h, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port <= 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	return h, port, nil
}
