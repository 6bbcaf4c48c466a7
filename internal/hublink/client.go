package hublink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// ClientConfig says how a cloud service dials the hub, like any NATS
// client: a list of server URLs, credentials, TLS and the JetStream domain.
type ClientConfig struct {
	// URLs are the hub servers (nats://host:4222 or tls://host:4222); the
	// client picks one and fails over to the others.
	URLs []string
	// Domain is the hub's JetStream domain.
	Domain string
	// CredsFile is a NATS credentials file (JWT and nkey seed).
	CredsFile string
	// NkeySeedFile holds an nkey user seed ("SU..."); the hub knows its
	// public key (cloud/hub: a service key).
	NkeySeedFile string
	// Nkey is an in-memory nkey identity, for an embedded hub whose
	// service key never leaves the process. Not settable by flag.
	Nkey nkeys.KeyPair
	// UserJWT is Nkey's user JWT, for a hub in operator mode. Not
	// settable by flag.
	UserJWT string
	// User and Password log in with a password.
	User, Password string
	// TLS verifies the hub (CAFile) and authenticates the client to it
	// (CertFile and KeyFile). Any TLS setting turns TLS on.
	TLS TLSConfig
	// InProcess, when set, is a hub server of this process: the client
	// connects to it in process, without a socket (URLs still name it).
	// Not settable by flag.
	InProcess nats.InProcessConnProvider
}

// TLSConfig holds PEM file paths.
type TLSConfig struct {
	CAFile, CertFile, KeyFile string
}

func (t TLSConfig) enabled() bool { return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" }

// DefaultDomain is the hub's JetStream domain unless configured otherwise.
const DefaultDomain = "hub"

// ValidDomain checks a JetStream domain name.
func ValidDomain(d string) error {
	switch {
	case d == "":
		return errors.New("hub domain: empty")
	case strings.ContainsAny(d, ".*> \t"):
		return fmt.Errorf("hub domain %q: must be a single subject token", d)
	}
	return nil
}

// Validate names the first bad field.
func (c ClientConfig) Validate() error {
	if len(c.URLs) == 0 {
		return errors.New("hub url: no URL")
	}
	for _, s := range c.URLs {
		u, err := url.Parse(s)
		if err != nil {
			return fmt.Errorf("hub url %q: %w", s, err)
		}
		if u.Scheme != "nats" && u.Scheme != "tls" {
			return fmt.Errorf("hub url %q: scheme must be nats or tls", s)
		}
		if u.Host == "" {
			return fmt.Errorf("hub url %q: no host", s)
		}
		if u.User != nil {
			return fmt.Errorf("hub url %q: credentials belong in --hub-creds-file, not the URL", s)
		}
	}
	if err := ValidDomain(c.Domain); err != nil {
		return err
	}
	switch {
	case c.CredsFile != "" && (c.NkeySeedFile != "" || c.Nkey != nil):
		return errors.New("hub creds file: a credentials file carries its own nkey; do not also set an nkey")
	case c.UserJWT != "" && c.Nkey == nil:
		return errors.New("hub user JWT: no in-memory nkey signs for it")
	case c.NkeySeedFile != "" && c.Nkey != nil:
		return errors.New("hub nkey file: an in-memory nkey is set already")
	case (c.User == "") != (c.Password == ""):
		return errors.New("hub user: user and password must both be set")
	case (c.TLS.CertFile == "") != (c.TLS.KeyFile == ""):
		return errors.New("hub tls cert: certificate and key must both be set")
	}
	return nil
}

// options turns c into connection options.
func (c ClientConfig) options() ([]nats.Option, error) {
	var opts []nats.Option
	if c.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	}
	if c.NkeySeedFile != "" {
		o, err := nats.NkeyOptionFromSeed(c.NkeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("hub nkey file: %w", err)
		}
		opts = append(opts, o)
	}
	if c.Nkey != nil {
		pub, err := c.Nkey.PublicKey()
		if err != nil {
			return nil, fmt.Errorf("hub nkey: %w", err)
		}
		if c.UserJWT != "" {
			userJWT := c.UserJWT
			opts = append(opts, nats.UserJWT(func() (string, error) { return userJWT, nil }, c.Nkey.Sign))
		} else {
			opts = append(opts, nats.Nkey(pub, c.Nkey.Sign))
		}
	}
	if c.User != "" {
		opts = append(opts, nats.UserInfo(c.User, c.Password))
	}
	if c.InProcess != nil {
		opts = append(opts, nats.InProcessServer(c.InProcess))
	}
	if c.TLS.enabled() {
		opts = append(opts, nats.Secure())
		if c.TLS.CAFile != "" {
			opts = append(opts, nats.RootCAs(c.TLS.CAFile))
		}
		if c.TLS.CertFile != "" {
			opts = append(opts, nats.ClientCert(c.TLS.CertFile, c.TLS.KeyFile))
		}
	}
	return opts, nil
}

// Dialer returns a Dialer that connects to c.URLs as name. It keeps
// trying (every server in turn) until connected or ctx is done, and the
// connection reconnects forever afterwards, logging each disconnect and
// reconnect.
func (c ClientConfig) Dialer(name string, log *slog.Logger) Dialer {
	return func(ctx context.Context) (*nats.Conn, error) {
		if err := c.Validate(); err != nil {
			return nil, err
		}
		opts, err := c.options()
		if err != nil {
			return nil, err
		}
		opts = append(Options(name, log), opts...)
		opts = append(opts, nats.RetryOnFailedConnect(true), nats.ReconnectWait(500*time.Millisecond))
		nc, err := nats.Connect(strings.Join(c.URLs, ","), opts...)
		if err != nil {
			return nil, fmt.Errorf("hub link: connect to %s: %w", strings.Join(c.URLs, ","), err)
		}
		connected := nc.StatusChanged(nats.CONNECTED)
		defer nc.RemoveStatusListener(connected)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for !nc.IsConnected() {
			select {
			case <-connected:
			case <-tick.C:
				// Wrong credentials do not fix themselves: say so at once.
				if last := nc.LastError(); errors.Is(last, nats.ErrAuthorization) || errors.Is(last, nats.ErrAuthExpired) || errors.Is(last, nats.ErrAuthRevoked) {
					nc.Close()
					return nil, fmt.Errorf("hub link: %s refused the credentials: %w", strings.Join(c.URLs, ","), last)
				}
			case <-ctx.Done():
				last := nc.LastError()
				nc.Close()
				if last == nil {
					return nil, fmt.Errorf("hub link: connect to %s: %w", strings.Join(c.URLs, ","), ctx.Err())
				}
				return nil, fmt.Errorf("hub link: connect to %s: %w (last error: %w)", strings.Join(c.URLs, ","), ctx.Err(), last)
			}
		}
		log.Info("hub connected", "conn", name, "server", nc.ConnectedUrlRedacted(), "server_name", nc.ConnectedServerName(), "domain", c.Domain)
		return nc, nil
	}
}
