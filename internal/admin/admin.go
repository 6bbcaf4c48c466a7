// Package admin serves a service's operational endpoints: /healthz
// (liveness), /readyz (readiness), /metrics (Prometheus) and
// /debug/pprof. Components register their checks; the service is ready when
// every readiness check passes.
package admin

import (
	"context"
	"errors"
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
)

// Config configures the admin listener.
type Config struct {
	// Addr is host:port to listen on (":0" for a random port). The
	// services default to loopback: nothing here authenticates, and
	// /debug/pprof is among the endpoints. A non-loopback address is
	// logged as a warning at start.
	Addr string
}

// Validate names what is wrong.
func (c Config) Validate() error {
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("admin: addr %q: %w", c.Addr, err)
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

	mu        sync.RWMutex
	liveness  map[string]Check
	readiness map[string]Check

	mux *http.ServeMux
	ln  net.Listener
	srv *http.Server
}

// New returns an admin server with a fresh registry holding the Go and
// process collectors.
func New(cfg Config, log *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s := &Server{
		cfg:       cfg,
		log:       log.With("component", "admin"),
		registry:  reg,
		liveness:  map[string]Check{},
		readiness: map[string]Check{},
	}
	mux := http.NewServeMux()
	s.mux = mux
	mux.HandleFunc("GET /healthz", s.serveChecks(func() map[string]Check { return s.liveness }))
	mux.HandleFunc("GET /readyz", s.serveChecks(func() map[string]Check { return s.readiness }))
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		IdleTimeout: time.Minute, MaxHeaderBytes: 64 << 10}
	return s, nil
}

// Registry is where the service's components register their metrics.
func (s *Server) Registry() *prometheus.Registry { return s.registry }

// Handle serves h for pattern (http.ServeMux syntax) on the admin
// listener, behind whatever guards the admin endpoints. Call it before
// Start.
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
	s.ln = ln
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("admin server stopped", "err", err)
		}
	}()
	s.log.Info("admin listening", "addr", ln.Addr().String())
	if !Loopback(ln.Addr()) {
		s.log.Warn("admin endpoints are reachable from other hosts without authentication (/metrics, /debug/pprof); "+
			"bind --admin-addr to a loopback address unless a probe or scraper needs them", "addr", ln.Addr().String())
	}
	return nil
}

// Loopback reports whether addr is a loopback address (127.0.0.0/8, ::1).
func Loopback(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// Addr is the listen address (after Start).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Stop shuts the server down gracefully within ctx.
func (s *Server) Stop(ctx context.Context) error {
	return s.srv.Shutdown(ctx)
}
