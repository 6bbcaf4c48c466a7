package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// Server serves the admission webhook over HTTPS.
type Server struct {
	cfg     Config
	log     *slog.Logger
	handler http.Handler

	mu       sync.Mutex
	ln       net.Listener
	srv      *http.Server
	certs    *certwatcher.CertWatcher
	stopCert context.CancelFunc
	wg       sync.WaitGroup
	running  atomic.Bool
}

// New returns a server applying p's protection. reg receives the
// atoll_webhook_* metrics (nil: not registered).
func New(cfg Config, p Policy, log *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if p == nil {
		return nil, errors.New("webhook: policy is nil")
	}
	cfg = cfg.withDefaults()
	log = log.With("component", "webhook")
	hook, err := admission.StandaloneWebhook(
		&admission.Webhook{Handler: &handler{policy: p, log: log, metrics: newMetrics(reg)}},
		// Our logger, so controller-runtime's global one is never touched.
		admission.StandaloneOptions{Logger: logr.FromSlogHandler(log.Handler())},
	)
	if err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	return &Server{cfg: cfg, log: log, handler: hook}, nil
}

// Handler is the admission handler alone (no TLS), for embedding and tests.
func (s *Server) Handler() http.Handler { return s.handler }

// Start loads the certificate, listens synchronously and serves in the
// background. Rotated certificate files are reloaded until Stop.
func (s *Server) Start(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return errors.New("webhook: already started")
	}
	raw, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("webhook: listen %s: %w", s.cfg.Addr, err)
	}
	certs, err := certwatcher.New(filepath.Join(s.cfg.CertDir, CertFile), filepath.Join(s.cfg.CertDir, KeyFile))
	if err != nil {
		_ = raw.Close()
		return fmt.Errorf("webhook: load certificate from %s: %w", s.cfg.CertDir, err)
	}
	ln := tls.NewListener(raw, &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.GetCertificate})
	mux := http.NewServeMux()
	mux.Handle("POST "+s.cfg.Path, s.handler)
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	certCtx, stopCert := context.WithCancel(context.Background())
	s.ln, s.srv, s.certs, s.stopCert = ln, srv, certs, stopCert
	s.running.Store(true)
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		if err := certs.Start(certCtx); err != nil && certCtx.Err() == nil {
			s.log.Error("certificate watcher stopped; rotations are not picked up", "err", err)
		}
	}()
	go func() {
		defer s.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("webhook server stopped", "err", err)
		}
		s.running.Store(false)
	}()
	s.log.Info("webhook listening", "addr", ln.Addr().String(), "path", s.cfg.Path, "cert_dir", s.cfg.CertDir)
	return nil
}

// Addr is the bound address (after Start), e.g. "127.0.0.1:9443".
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Stop shuts the server down gracefully: in-flight reviews finish within ctx
// (or Config.ShutdownTimeout when ctx has no deadline).
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	srv, stopCert := s.srv, s.stopCert
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.ShutdownTimeout)
		defer cancel()
	}
	s.running.Store(false)
	err := srv.Shutdown(ctx)
	if err != nil {
		_ = srv.Close()
		err = fmt.Errorf("webhook: shutdown: %w", err)
	}
	stopCert()
	s.wg.Wait()
	return err
}

// Ready reports whether the server is serving with a certificate that is
// currently valid.
func (s *Server) Ready() error {
	if !s.running.Load() {
		return errors.New("webhook server not running")
	}
	s.mu.Lock()
	certs := s.certs
	s.mu.Unlock()
	cert, _ := certs.GetCertificate(nil)
	if cert == nil || cert.Leaf == nil {
		return errors.New("no serving certificate")
	}
	if now := time.Now(); now.After(cert.Leaf.NotAfter) || now.Before(cert.Leaf.NotBefore) {
		return fmt.Errorf("serving certificate is not valid now (valid %s to %s)",
			cert.Leaf.NotBefore.Format(time.RFC3339), cert.Leaf.NotAfter.Format(time.RFC3339))
	}
	return nil
}
