// Package admin serves a service's operational endpoints: /healthz
// (liveness), /readyz (readiness), /metrics (Prometheus), /debug/pprof and
// the handlers other packages mount with Handle. Components register their
// checks; the service is ready when every readiness check passes.
//
// Authentication: on a loopback address with nothing configured every
// endpoint is open. Any other address needs a bearer token file
// (--admin-token-file) or mutual TLS (--admin-tls-cert, --admin-tls-key,
// --admin-client-ca), or the service refuses to start; then every path
// but /healthz and /readyz (the kubelet's probes) needs the token or a
// client certificate the CA signed. Configured authentication is enforced
// on loopback too.
package admin

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/atoll-edge/atoll/internal/tlsreload"
)

// Config configures the admin listener.
type Config struct {
	// Addr is host:port to listen on (":0" for a random port). The
	// services default to loopback. Any other address needs TokenFile or
	// mutual TLS (TLS with ClientCAFile).
	Addr string
	// TokenFile holds the bearer tokens that authenticate requests, one
	// per line; re-read when it changes (a mounted Secret's rotation).
	TokenFile string
	// TLS serves HTTPS; with ClientCAFile, client certificates it signs
	// authenticate requests. Re-read when the files change.
	TLS TLS
	// LoopbackPeers lets requests from a loopback address through without
	// credentials when TokenFile or TLS guard a listener off loopback: in
	// a pod, that is `kubectl port-forward` (authorized by the apiserver:
	// pods/portforward) and the pod's own processes. Leave it off where
	// the listener shares the host's network (atoll-edge), where every
	// local user is a loopback peer.
	LoopbackPeers bool
}

// RegisterFlags binds c's fields to flags of fs.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Addr, "admin-addr", c.Addr, "listen address of /healthz, /readyz, /metrics and /debug/pprof; off loopback it needs --admin-token-file or mutual TLS (/healthz and /readyz stay open for probes)")
	fs.StringVar(&c.TokenFile, "admin-token-file", c.TokenFile, "file of the bearer tokens (one per line) the admin endpoints accept; re-read when it changes")
	fs.StringVar(&c.TLS.CertFile, "admin-tls-cert", c.TLS.CertFile, "PEM certificate the admin endpoints serve HTTPS with; re-read when it changes")
	fs.StringVar(&c.TLS.KeyFile, "admin-tls-key", c.TLS.KeyFile, "PEM key of --admin-tls-cert")
	fs.StringVar(&c.TLS.ClientCAFile, "admin-client-ca", c.TLS.ClientCAFile, "PEM CA bundle: client certificates it signs authenticate to the admin endpoints (mutual TLS; needs --admin-tls-cert)")
	fs.BoolVar(&c.LoopbackPeers, "admin-loopback-open", c.LoopbackPeers, "requests from a loopback peer (kubectl port-forward into the pod) need no token or client certificate")
}

// Validate names what is wrong.
func (c Config) Validate() error {
	host, _, err := net.SplitHostPort(c.Addr)
	if err != nil {
		return fmt.Errorf("admin: addr %q: %w", c.Addr, err)
	}
	if c.TLS.enabled() && (c.TLS.CertFile == "" || c.TLS.KeyFile == "") {
		return fmt.Errorf("admin: TLS needs a certificate and key (%s and %s)", FlagTLSCert, FlagTLSKey)
	}
	if !loopbackHost(host) && c.TokenFile == "" && c.TLS.ClientCAFile == "" {
		return fmt.Errorf("admin: addr %q (%s) is reachable from other hosts: it needs authentication, "+
			"a bearer token file (%s) or mutual TLS (%s, %s and %s); or bind it to loopback",
			c.Addr, FlagAddr, FlagTokenFile, FlagTLSCert, FlagTLSKey, FlagClientCA)
	}
	// The files must load now: a typo fails the start, not the first scrape.
	if c.TokenFile != "" {
		if _, err := (&tokenFile{path: c.TokenFile}).load(); err != nil {
			return err
		}
	}
	if c.TLS.enabled() {
		if err := tlsreload.Check(tlsreload.Files(c.TLS), tlsNames); err != nil {
			return err
		}
	}
	return nil
}

// Check reports a problem, or nil when all is well. It must return
// quickly; the request's context carries a short deadline.
type Check func(ctx context.Context) error

// Server is the admin HTTP server and the service's metrics registry.
type Server struct {
	cfg      Config
	log      *slog.Logger
	registry *prometheus.Registry
	recorder *recorder
	mux      *http.ServeMux
	tokens   *tokenFile        // nil without Config.TokenFile
	tls      *tlsreload.Server // nil without Config.TLS

	mu        sync.RWMutex
	liveness  map[string]Check
	readiness map[string]Check

	ln  net.Listener
	srv *http.Server
}

// New returns an admin server with a fresh registry holding the Go and
// process collectors.
func New(cfg Config, log *slog.Logger) (s *Server, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s = &Server{
		cfg:       cfg,
		log:       log.With("component", "admin"),
		registry:  reg,
		recorder:  &recorder{reg: reg},
		liveness:  map[string]Check{},
		readiness: map[string]Check{},
	}
	if cfg.TokenFile != "" {
		if s.tokens, err = newTokenFile(cfg.TokenFile, s.log); err != nil {
			return nil, err
		}
	}
	if cfg.TLS.enabled() {
		// Verified if given, not required: the kubelet's probes of
		// /healthz and /readyz come without a client certificate; the
		// other paths check for a verified chain (authenticate).
		if s.tls, err = tlsreload.New(tlsreload.Files(cfg.TLS), tlsNames, tls.VerifyClientCertIfGiven, s.log); err != nil {
			return nil, err
		}
	}
	mux := http.NewServeMux()
	s.mux = mux
	mux.HandleFunc("GET /healthz", s.serveChecks(func() map[string]Check { return s.liveness }))
	mux.HandleFunc("GET /readyz", s.serveChecks(func() map[string]Check { return s.readiness }))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	s.srv = &http.Server{Handler: s.authenticate(mux), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		IdleTimeout: time.Minute, MaxHeaderBytes: 64 << 10,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	return s, nil
}

// Registry is the registry /metrics serves.
func (s *Server) Registry() *prometheus.Registry { return s.registry }

// Registerer is where the service's components register their metrics:
// the registry, which also remembers what was registered (Descriptors).
func (s *Server) Registerer() prometheus.Registerer { return s.recorder }

// Descriptors returns the descriptors of every metric registered through
// Registerer, including vectors that have no series yet.
func (s *Server) Descriptors() []*prometheus.Desc { return s.recorder.descriptors() }

// Handle mounts h on pattern (http.ServeMux syntax) behind the same
// authentication as the other endpoints: off loopback it needs the
// bearer token or a client certificate. Call it before Start.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// AddLiveness registers a check that fails /healthz: the process is stuck
// and should be restarted.
func (s *Server) AddLiveness(name string, c Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.liveness[name] = c
}

// AddReadiness registers a check that fails /readyz: the service cannot do
// its work right now.
func (s *Server) AddReadiness(name string, c Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readiness[name] = c
}

func (s *Server) serveChecks(set func() map[string]Check) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		s.mu.RLock()
		checks := maps.Clone(set())
		s.mu.RUnlock()
		var b strings.Builder
		failed := false
		for _, n := range slices.Sorted(maps.Keys(checks)) {
			if err := checks[n](ctx); err != nil {
				failed = true
				fmt.Fprintf(&b, "[-] %s: %v\n", n, err)
			} else {
				fmt.Fprintf(&b, "[+] %s ok\n", n)
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if failed {
			w.WriteHeader(http.StatusServiceUnavailable)
			b.WriteString("not ok\n")
		} else {
			b.WriteString("ok\n")
		}
		_, _ = w.Write([]byte(b.String()))
	}
}

// Start listens synchronously and serves in the background.
func (s *Server) Start(context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("admin: listen %s: %w", s.cfg.Addr, err)
	}
	if s.tls != nil {
		ln = s.tls.Listener(ln)
	}
	s.ln = ln
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("admin server stopped", "err", err)
		}
	}()
	s.log.Info("admin listening", "addr", ln.Addr().String(), "tls", s.tls != nil,
		"token", s.tokens != nil, "client_ca", s.cfg.TLS.ClientCAFile != "")
	return nil
}

// Addr is the listen address (after Start).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Stop shuts the server down gracefully within ctx.
func (s *Server) Stop(ctx context.Context) error {
	return s.srv.Shutdown(ctx)
}
