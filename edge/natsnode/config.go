package natsnode

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/events"
)

// Config configures a node's embedded NATS server.
type Config struct {
	// NodeName is the Kubernetes node name; it is the server name, so it
	// must be unique across the whole fabric.
	NodeName string
	// ClientHost and ClientPort serve local NATS clients on the node (the
	// agent itself connects in process). Keep it on loopback. Port -1:
	// random. The server cannot run without it (nats-server starts its
	// routes only once the client listener is up), so a port that cannot
	// be bound fails the start.
	ClientHost string
	ClientPort int
	// RouteHost and RoutePort accept routes from the unit's other servers.
	RouteHost string
	RoutePort int
	// RouteAdvertise is the host:port unit peers dial (default: the
	// listener's address; set it to the node's InternalIP:port).
	RouteAdvertise string
	// HubURLs are the hub's leafnode URLs (nats-leaf://host:7422).
	HubURLs []string
	// HubDomain is the hub's JetStream domain.
	HubDomain string
	// HubCAFile, when set, is the PEM bundle of CAs the hub's leaf
	// certificate must chain to: the leaf link then runs over TLS and a
	// hub that cannot show such a certificate is refused. Empty: plain
	// NATS unless the hub asks for TLS (then the system's roots verify).
	HubCAFile string
	// HubServerName is the name the hub's leaf certificate must carry
	// (empty: the host dialed). atoll-cloud's generated certificate names
	// atoll-hub.atoll-system.svc, whatever address the edges dial.
	HubServerName string
	// HubCompression is the leaf link's compression, as nats-server
	// names it: off (ours: a compressed leaf costs the hub about half a
	// MiB of s2 buffers per connection, and a steady node's few small
	// messages barely compress), s2_auto (nats-server's default: by the
	// link's round trip time, none below 10 ms, then s2_fast, s2_better
	// and s2_best above 50 and 100 ms; for metered links),
	// s2_uncompressed, s2_fast, s2_better or s2_best. The edge, which
	// dials, decides: off here turns it off whatever the hub accepts.
	// Empty: nats-server's default, s2_auto.
	HubCompression string
	// HubPingInterval is how often the server pings over its leaf link
	// (and its routes and local clients); a link that leaves
	// HubMaxPingsOut pings unanswered is closed and dialed again, so one
	// that dies silently (packets dropped, as a NAT table forgetting the
	// connection does) is noticed within (HubMaxPingsOut+1) ×
	// HubPingInterval: 12 s by default, as on the hub's side
	// (cloud/hub). 0: DefaultHubPingInterval and DefaultHubMaxPingsOut.
	HubPingInterval time.Duration
	HubMaxPingsOut  int
	// Seed is the node's nkey seed ("SU..."), its identity on the hub,
	// and UserJWT the user JWT atoll-cloud issued for its public key
	// (cloud/identity). CredsFile, a NATS credentials file holding both,
	// is read when Seed is empty; renewed credentials are written back to
	// it. When it does not exist yet, BootstrapFile (a one-time bootstrap
	// token from `atoll node enroll`) opens the leaf link until the node
	// has enrolled (edge/enroll). SeedFile (a bare seed) is read when
	// neither is set, for a hub that takes plain nkeys.
	Seed          string
	UserJWT       string
	CredsFile     string
	BootstrapFile string
	// EnrollCredsFile, when CredsFile does not exist and BootstrapFile is
	// not set or does not exist either, is the installation's shared
	// enrollment credentials file (the Secret atoll-edge-enroll that
	// atoll-cloud fills): it opens the leaf link until the node has
	// enrolled with its pod's ServiceAccount token (edge/enroll).
	EnrollCredsFile string
	SeedFile        string
}

// HubCompressions are the values of Config.HubCompression ("":
// nats-server's default, s2_auto).
var HubCompressions = []string{"", "off", "s2_auto", "s2_uncompressed", "s2_fast", "s2_better", "s2_best"}

// Default is the configuration of an edge node's server.
func Default() Config {
	return Config{
		ClientHost:     "127.0.0.1",
		ClientPort:     4222,
		RouteHost:      "0.0.0.0",
		RoutePort:      6222,
		HubDomain:      "hub",
		HubCompression: "off",
		CredsFile:      "/var/lib/atoll/node.creds",
	}
}

// Validate names the first field that is wrong.
func (c Config) Validate() error {
	if err := events.ValidName(c.NodeName); err != nil {
		return fmt.Errorf("natsnode: node name: %w", err)
	}
	if ip := net.ParseIP(c.ClientHost); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("natsnode: client host %q must be a loopback address", c.ClientHost)
	}
	if c.ClientPort < -1 || c.ClientPort == 0 || c.ClientPort > 65535 {
		return fmt.Errorf("natsnode: client port %d is outside 1..65535 (or -1 for random)", c.ClientPort)
	}
	if c.RouteHost == "" {
		return errors.New("natsnode: route host is empty")
	}
	if c.RoutePort < -1 || c.RoutePort == 0 || c.RoutePort > 65535 {
		return fmt.Errorf("natsnode: route port %d is outside 1..65535 (or -1 for random)", c.RoutePort)
	}
	if c.RouteAdvertise != "" {
		if _, _, err := net.SplitHostPort(c.RouteAdvertise); err != nil {
			return fmt.Errorf("natsnode: route advertise %q: %w", c.RouteAdvertise, err)
		}
	}
	if len(c.HubURLs) == 0 {
		return errors.New("natsnode: no hub URL")
	}
	for _, u := range c.HubURLs {
		if _, err := parseLeafURL(u); err != nil {
			return err
		}
	}
	if !slices.Contains(HubCompressions, c.HubCompression) {
		return fmt.Errorf("natsnode: hub compression %q is not one of %s", c.HubCompression, strings.Join(HubCompressions[1:], ", "))
	}
	if c.HubDomain == "" {
		return errors.New("natsnode: hub domain is empty")
	}
	if c.HubPingInterval < 0 || c.HubMaxPingsOut < 0 {
		return fmt.Errorf("natsnode: hub ping interval %v and max pings out %d must not be negative", c.HubPingInterval, c.HubMaxPingsOut)
	}
	if c.Seed == "" && c.SeedFile == "" && c.CredsFile == "" {
		return errors.New("natsnode: no credentials: set the creds file")
	}
	if (c.BootstrapFile != "" || c.EnrollCredsFile != "") && c.CredsFile == "" {
		return errors.New("natsnode: a bootstrap token or enrollment credentials need a creds file to keep the enrolled credentials in")
	}
	if c.UserJWT != "" && c.Seed == "" {
		return errors.New("natsnode: a user JWT without its seed")
	}
	return nil
}

// DefaultHubPingInterval and DefaultHubMaxPingsOut notice a silently dead
// leaf link within 12 s.
const (
	DefaultHubPingInterval = 4 * time.Second
	DefaultHubMaxPingsOut  = 2
)

// The leaf remote's pace and patience. A lost link dials the hub again
// after HubReconnectInterval (nats-server adds up to as much again at
// random after a failed dial). Once the hub accepted the connection, the
// node waits up to HubInfoTimeout for its INFO and HubTLSTimeout for the
// TLS handshake: a hub restarted under thousands of links answers slowly
// (the INFO is sent when the server gets to the accepted connection: in
// a restart under 5,000 links, 16,000 connections waited more than 5 s
// for it in the first 2.5 minutes), and a node that gave up is back a
// second later with a new connection for the hub to take. nats-server's
// defaults, 1 s and 2 s, are for a server that has time for each. The
// hub's own leaf timeouts are as long (cloud/hub). A dead hub server
// fails the dial; only one that accepts connections and then says
// nothing costs the wait, before the next server is tried.
const (
	HubReconnectInterval = time.Second
	HubInfoTimeout       = 30 * time.Second
	HubTLSTimeout        = 30 * time.Second
)

func parseLeafURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("natsnode: hub URL %q: %w", s, err)
	}
	switch u.Scheme {
	case "nats-leaf", "nats", "tls":
	default:
		return nil, fmt.Errorf("natsnode: hub URL %q: scheme must be nats-leaf, nats or tls", s)
	}
	if u.User != nil {
		return nil, fmt.Errorf("natsnode: hub URL %q: credentials belong in the seed, not the URL", s)
	}
	return u, nil
}

// readCreds reads a NATS credentials file.
func readCreds(path string) (seed, userJWT string, err error) {
	b, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		return "", "", fmt.Errorf("natsnode: %w", err)
	}
	if userJWT, err = jwt.ParseDecoratedJWT(b); err != nil {
		return "", "", fmt.Errorf("natsnode: creds file %s: %w", path, err)
	}
	kp, err := jwt.ParseDecoratedNKey(b)
	if err != nil {
		return "", "", fmt.Errorf("natsnode: creds file %s: %w", path, err)
	}
	s, _ := kp.Seed()
	return string(s), userJWT, nil
}

// Where the credentials in use come from (Config.credentials).
type credSource int

const (
	credOwn       credSource = iota // the node's own (or a bare nkey)
	credBootstrap                   // a one-time bootstrap token
	credEnroll                      // the shared enrollment credentials
	// credEnrollPending: the node will link with the shared enrollment
	// credentials, which atoll-cloud has not written yet.
	credEnrollPending
)

// credentials returns the node's nkey seed, validated, its user JWT
// (empty for plain nkey authentication) and where they come from.
func (c Config) credentials() (seed, userJWT string, src credSource, err error) {
	seed, userJWT = c.Seed, c.UserJWT
	switch {
	case seed != "":
	case c.CredsFile != "":
		_, statErr := os.Stat(c.CredsFile)
		if !errors.Is(statErr, os.ErrNotExist) {
			if seed, userJWT, err = readCreds(c.CredsFile); err != nil {
				return "", "", credOwn, err
			}
			break
		}
		bootstrapMissing := c.BootstrapFile == ""
		if !bootstrapMissing {
			_, err := os.Stat(c.BootstrapFile)
			bootstrapMissing = errors.Is(err, os.ErrNotExist) && c.EnrollCredsFile != ""
		}
		switch {
		case !bootstrapMissing:
			if seed, userJWT, err = readCreds(c.BootstrapFile); err != nil {
				return "", "", credOwn, fmt.Errorf("natsnode: bootstrap token: %w", err)
			}
			src = credBootstrap
		case c.EnrollCredsFile != "":
			if _, err := os.Stat(c.EnrollCredsFile); errors.Is(err, os.ErrNotExist) {
				// The Secret's key appears once atoll-cloud has written it:
				// the node starts unlinked and waits (Node.Start).
				return "", "", credEnrollPending, nil
			}
			if seed, userJWT, err = readCreds(c.EnrollCredsFile); err != nil {
				return "", "", credOwn, fmt.Errorf("natsnode: enrollment credentials (atoll-cloud writes them into the Secret atoll-edge-enroll): %w", err)
			}
			src = credEnroll
		default:
			if seed, userJWT, err = readCreds(c.CredsFile); err != nil {
				return "", "", credOwn, err
			}
		}
	default:
		b, err := os.ReadFile(filepath.Clean(c.SeedFile))
		if err != nil {
			return "", "", credOwn, fmt.Errorf("natsnode: seed file: %w", err)
		}
		seed = strings.TrimSpace(string(b))
	}
	kp, err := nkeys.FromSeed([]byte(seed))
	if err != nil {
		return "", "", credOwn, fmt.Errorf("natsnode: seed: %w", err)
	}
	defer kp.Wipe()
	if pub, _ := kp.PublicKey(); !nkeys.IsValidPublicUserKey(pub) {
		return "", "", credOwn, errors.New("natsnode: seed is not a user nkey seed (SU...)")
	}
	return seed, userJWT, src, nil
}

// hubTLS is the leaf link's TLS configuration when HubCAFile is set. The
// bundle is read again when the file changes (a CA rotated by atoll-cloud
// reaches the node as an updated ConfigMap), so every handshake verifies
// against the bundle as it is then; the name checked is HubServerName, or
// the host dialed.
func (c Config) hubTLS() (*tls.Config, error) {
	if c.HubCAFile == "" {
		return nil, nil
	}
	roots := &caFile{path: filepath.Clean(c.HubCAFile)}
	if _, err := roots.pool(); err != nil {
		return nil, err
	}
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: c.HubServerName,
		// Verified by VerifyConnection, against the bundle as it is at
		// each handshake: the standard check would use a pool fixed now.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
	}
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		pool, err := roots.pool()
		if err != nil {
			return err
		}
		if len(cs.PeerCertificates) == 0 {
			return errors.New("natsnode: the hub showed no certificate")
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err = cs.PeerCertificates[0].Verify(x509.VerifyOptions{DNSName: cs.ServerName, Roots: pool, Intermediates: inter})
		if err != nil {
			return fmt.Errorf("natsnode: the hub's certificate: %w (hub CA file %s)", err, roots.path)
		}
		return nil
	}
	return cfg, nil
}

// caFile is a PEM bundle of CAs on disk, parsed again when it changes.
type caFile struct {
	path string

	mu      sync.Mutex
	modTime time.Time
	size    int64
	cached  *x509.CertPool
}

// pool returns the bundle's CAs; a bundle that changed into something
// unparsable keeps the last good one.
func (f *caFile) pool() (*x509.CertPool, error) {
	st, err := os.Stat(f.path)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		if f.cached != nil {
			return f.cached, nil
		}
		return nil, fmt.Errorf("natsnode: hub CA file: %w", err)
	}
	if f.cached != nil && st.ModTime().Equal(f.modTime) && st.Size() == f.size {
		return f.cached, nil
	}
	data, err := os.ReadFile(f.path)
	if err != nil {
		if f.cached != nil {
			return f.cached, nil
		}
		return nil, fmt.Errorf("natsnode: hub CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		if f.cached != nil {
			return f.cached, nil
		}
		return nil, fmt.Errorf("natsnode: hub CA file %s: no PEM certificate in it", f.path)
	}
	f.cached, f.modTime, f.size = pool, st.ModTime(), st.Size()
	return pool, nil
}
