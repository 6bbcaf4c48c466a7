package prober

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Target is one unit member to check.
type Target struct {
	Name string
	IP   string
}

// Plugin checks one target; nil means the check passed. Check must return
// soon after ctx is done: the round's budget relies on it.
type Plugin interface {
	Check(ctx context.Context, t Target) error
}

// PluginConfig configures one check plugin.
type PluginConfig struct {
	// Kind selects the plugin: "tcp", "http", or one added with Register.
	Kind string
	// Name labels the plugin in reports and metrics (default: Kind).
	Name string
	// Weight of the plugin: a passing check adds 100*Weight to the score.
	Weight float64
	// Timeout of one attempt.
	Timeout time.Duration
	// Retries after a failed attempt, within the same round.
	Retries int
	// Port to dial (tcp) or to send the request to (http).
	Port int
	// HTTP only: scheme (http or https), path, optional bearer token file,
	// CA bundle file, and whether to skip certificate verification (a
	// kubelet's serving certificate is often self-signed).
	Scheme             string
	Path               string
	TokenFile          string
	CAFile             string
	InsecureSkipVerify bool
	// Args are free-form settings for plugins added with Register.
	Args map[string]string
}

// Factory builds a plugin from its configuration.
type Factory func(PluginConfig) (Plugin, error)

var (
	registryMu sync.RWMutex
	registry   = map[string]Factory{
		"tcp":  newTCP,
		"http": newHTTP,
	}
)

// Register adds a plugin kind. It panics if kind is taken, like
// database/sql.Register: registration is a program's setup, not input.
func Register(kind string, f Factory) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[kind]; dup {
		panic("prober: plugin kind registered twice: " + kind)
	}
	registry[kind] = f
}

// Kinds lists the registered plugin kinds.
func Kinds() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	out := make([]string, 0, len(registry))
	for k := range registry {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// NewPlugin builds the plugin c configures (its Kind registered).
func NewPlugin(c PluginConfig) (Plugin, error) { return build(c) }

func build(c PluginConfig) (Plugin, error) {
	registryMu.RLock()
	f, ok := registry[c.Kind]
	registryMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("plugin %q: unknown kind %q (have %s)", c.Name, c.Kind, strings.Join(Kinds(), ", "))
	}
	return f(c)
}

// tcp passes when a TCP connection to the target's port opens.
type tcpPlugin struct{ port string }

func newTCP(c PluginConfig) (Plugin, error) {
	if c.Port < 1 || c.Port > 65535 {
		return nil, fmt.Errorf("plugin %s: port %d is outside 1..65535", c.Name, c.Port)
	}
	return tcpPlugin{port: strconv.Itoa(c.Port)}, nil
}

func (p tcpPlugin) Check(ctx context.Context, t Target) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(t.IP, p.port))
	if err != nil {
		return err
	}
	return conn.Close()
}

// http passes when GET scheme://target:port/path answers 2xx. An answer
// of 401 or 403 passes too: the server is up and said no, which is how a
// kubelet with anonymous authentication off (kubeadm's, every managed
// offering's) answers a request without credentials, and how any kubelet
// answers credentials it cannot verify (its webhook authentication and
// authorization ask the apiserver, which a site cut off from the cloud
// cannot reach). Without a token that answer is expected; with one it is
// reported as Refused.
type httpPlugin struct {
	scheme, port, path string
	token              *tokenFile
	client             *http.Client
}

// Refused is a check the target answered by refusing the credentials the
// checker sent (HTTP 401 or 403): the target is alive, so the check
// counts as passed, and the checker's credentials (or the target's view
// of them) need attention.
type Refused struct{ Status string }

func (r *Refused) Error() string {
	return "refused the probe's credentials (" + r.Status + "): the target is up; check the token and its rights (get nodes/healthz), or the target's link to the apiserver"
}

// tokenFile is a bearer token read from a file, read again when the
// file changes (a projected ServiceAccount token is rotated in place).
type tokenFile struct {
	path string

	mu      sync.Mutex
	modTime time.Time
	token   string
}

func (f *tokenFile) get() (string, error) {
	st, err := os.Stat(f.path)
	if err != nil {
		return "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !st.ModTime().Equal(f.modTime) || f.token == "" {
		b, err := os.ReadFile(f.path)
		if err != nil {
			return "", err
		}
		f.token, f.modTime = strings.TrimSpace(string(b)), st.ModTime()
	}
	return f.token, nil
}

func newHTTP(c PluginConfig) (Plugin, error) {
	if c.Port < 1 || c.Port > 65535 {
		return nil, fmt.Errorf("plugin %s: port %d is outside 1..65535", c.Name, c.Port)
	}
	p := &httpPlugin{scheme: c.Scheme, port: strconv.Itoa(c.Port), path: c.Path}
	if p.scheme == "" {
		p.scheme = "https"
	}
	if p.scheme != "http" && p.scheme != "https" {
		return nil, fmt.Errorf("plugin %s: scheme %q: want http or https", c.Name, c.Scheme)
	}
	if p.path == "" {
		p.path = "/healthz"
	}
	if !strings.HasPrefix(p.path, "/") {
		return nil, fmt.Errorf("plugin %s: path %q must start with /", c.Name, c.Path)
	}
	if c.TokenFile != "" {
		p.token = &tokenFile{path: filepath.Clean(c.TokenFile)}
		if _, err := p.token.get(); err != nil {
			return nil, fmt.Errorf("plugin %s: token file: %w", c.Name, err)
		}
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.InsecureSkipVerify} //nolint:gosec // opt-in for self-signed kubelet certificates
	if c.CAFile != "" {
		pem, err := os.ReadFile(filepath.Clean(c.CAFile))
		if err != nil {
			return nil, fmt.Errorf("plugin %s: CA file: %w", c.Name, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("plugin %s: CA file %s holds no PEM certificate", c.Name, c.CAFile)
		}
		tlsCfg.RootCAs = pool
	}
	p.client = &http.Client{
		Transport: &http.Transport{
			TLSClientConfig:     tlsCfg,
			DisableKeepAlives:   true, // a probe must open a fresh connection
			TLSHandshakeTimeout: 5 * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return p, nil
}

func (p *httpPlugin) Check(ctx context.Context, t Target) error {
	url := p.scheme + "://" + net.JoinHostPort(t.IP, p.port) + p.path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if p.token != nil {
		token, err := p.token.get()
		if err != nil {
			return fmt.Errorf("token file: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode <= 299:
		return nil
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		if p.token == nil {
			return nil // the answer to a request without credentials
		}
		return &Refused{Status: resp.Status}
	default:
		return errors.New(resp.Status)
	}
}
