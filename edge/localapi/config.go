package localapi

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"time"
)

// Config configures the node's local API endpoint.
type Config struct {
	// Listen is the loopback host:port the node's components reach the
	// API at (their kubeconfig's server, http://Listen).
	Listen string
	// APIServer is kube-apiserver's URL (https).
	APIServer string
	// CAFile verifies kube-apiserver's certificate.
	CAFile string
	// CertFile and KeyFile are the node's own client credentials (the
	// kubelet's: system:node:<name>); read again when they change, as
	// the kubelet rotates them. They may name the same file.
	CertFile, KeyFile string
	// Via is how kube-apiserver is reached: "direct" (dial the host of
	// APIServer) or "hub" (every connection through atoll-edge's
	// forward at HubForward, over the node's leaf link; TLS still runs
	// from here to kube-apiserver, verified against APIServer's host).
	Via string
	// HubForward is atoll-edge's --tunnel-apiserver-listen, for Via "hub".
	HubForward string
	// Dir keeps what each component read, one directory per component.
	Dir string
	// Timeout bounds a probe of kube-apiserver and a read the cache can
	// answer: past it the apiserver counts as unreachable (probe) or
	// slow (read, answered from the cache).
	Timeout time.Duration
	// ProbeInterval is how often kube-apiserver's /readyz is probed.
	ProbeInterval time.Duration
	// FlushInterval is how often changed cache records are written.
	FlushInterval time.Duration
	// Retain drops a record no component asked for in this long (0:
	// never): the objects of pods long gone.
	Retain time.Duration
}

// Default is the configuration of a node that runs YurtHub's port.
func Default() Config {
	return Config{
		Listen:        "127.0.0.1:10261",
		Via:           ViaDirect,
		HubForward:    "127.0.0.1:10263",
		Dir:           "/var/lib/atoll/local-api",
		Timeout:       5 * time.Second,
		ProbeInterval: 2 * time.Second,
		FlushInterval: time.Second,
		Retain:        7 * 24 * time.Hour,
	}
}

// RegisterFlags binds c's fields to flags of fs.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Listen, "listen", c.Listen, "loopback host:port the node's components reach the API at (their kubeconfig's server: http://HOST:PORT)")
	fs.StringVar(&c.APIServer, "apiserver", c.APIServer, "kube-apiserver's URL, e.g. https://10.0.0.1:6443")
	fs.StringVar(&c.Via, "apiserver-via", c.Via, "how kube-apiserver is reached: direct, or hub (through atoll-edge's --tunnel-apiserver-listen and the node's leaf link; TLS end to end)")
	fs.StringVar(&c.HubForward, "hub-forward", c.HubForward, "atoll-edge's --tunnel-apiserver-listen, with --apiserver-via=hub")
	fs.StringVar(&c.CAFile, "ca-file", c.CAFile, "PEM CA bundle that verifies kube-apiserver")
	fs.StringVar(&c.CertFile, "client-cert", c.CertFile, "the node's client certificate (the kubelet's, e.g. /var/lib/kubelet/pki/kubelet-client-current.pem); re-read when it changes")
	fs.StringVar(&c.KeyFile, "client-key", c.KeyFile, "the key of --client-cert (may be the same file)")
	fs.StringVar(&c.Dir, "dir", c.Dir, "directory of the cache: what each component read, kept across reboots")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "a probe or cached read that kube-apiserver does not answer in this time is answered from the cache")
	fs.DurationVar(&c.ProbeInterval, "probe-interval", c.ProbeInterval, "how often kube-apiserver's /readyz is probed")
	fs.DurationVar(&c.FlushInterval, "flush-interval", c.FlushInterval, "how often changed cache records are written to --dir")
	fs.DurationVar(&c.Retain, "retain", c.Retain, "a cached answer no component asked for in this long is dropped (0: kept for ever)")
}

// Validate names the first bad field.
func (c Config) Validate() error {
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("local API: listen %q: %w", c.Listen, err)
	}
	if !loopback(c.Listen) {
		return fmt.Errorf("local API: listen %q is not a loopback address: it serves the node's credentials to whoever reaches it", c.Listen)
	}
	u, err := url.Parse(c.APIServer)
	switch {
	case c.APIServer == "":
		return errors.New("local API: needs --apiserver, kube-apiserver's URL")
	case err != nil:
		return fmt.Errorf("local API: apiserver %q: %w", c.APIServer, err)
	case u.Scheme != "https" || u.Host == "":
		return fmt.Errorf("local API: apiserver %q: want https://HOST:PORT", c.APIServer)
	case c.CertFile == "" || c.KeyFile == "":
		return errors.New("local API: needs the node's client certificate and key (--client-cert, --client-key)")
	case c.Via != ViaDirect && c.Via != ViaHub:
		return fmt.Errorf("local API: apiserver-via %q: want %s or %s", c.Via, ViaDirect, ViaHub)
	case c.Via == ViaHub && !loopback(c.HubForward):
		return fmt.Errorf("local API: hub-forward %q: want atoll-edge's loopback --tunnel-apiserver-listen (host:port)", c.HubForward)
	case c.Dir == "":
		return errors.New("local API: needs --dir")
	case c.Retain < 0:
		return fmt.Errorf("local API: retain %s: want 0 (for ever) or more", c.Retain)
	case c.Timeout <= 0 || c.ProbeInterval <= 0 || c.FlushInterval <= 0:
		return fmt.Errorf("local API: timeout %s, probe interval %s, flush interval %s: each must be more than 0", c.Timeout, c.ProbeInterval, c.FlushInterval)
	}
	for _, f := range []string{c.CAFile, c.CertFile, c.KeyFile} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("local API: %w", err)
		}
	}
	return nil
}

// The ways to kube-apiserver (Config.Via).
const (
	ViaDirect = "direct"
	ViaHub    = "hub"
)

// loopback reports whether hostport is a loopback "host:port".
func loopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "localhost" || ip != nil && ip.IsLoopback()
}
