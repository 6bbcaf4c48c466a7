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

// http passes when GET scheme://target:port/path answers 2xx.
type httpPlugin struct {
	scheme, port, path string
	token              string
	client             *http.Client
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
		b, err := os.ReadFile(filepath.Clean(c.TokenFile))
		if err != nil {
			return nil, fmt.Errorf("plugin %s: token file: %w", c.Name, err)
		}
		p.token = strings.TrimSpace(string(b))
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
	if p.token != "" {
		req.Header.Set("Authorization", "Bearer "+p.token)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return errors.New(resp.Status)
	}
	return nil
}
