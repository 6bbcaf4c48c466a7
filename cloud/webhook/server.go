package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// Server serves the admission webhook over HTTPS on controller-runtime's
// webhook.Server, whose certificate comes from a certwatcher on
// Config.CertDir (rotated files are picked up without a restart). It runs
// on every replica: the apiserver may call any of them.
type Server struct {
	cfg     Config
	log     *slog.Logger
	handler http.Handler
	metrics *metrics

	mu     sync.Mutex
	source CertificateSource // set by UseCertificates; else files in CertDir
	addr   string            // bound host:port, after Start
	srv    ctrlwebhook.Server
	certs  CertificateSource
	cancel context.CancelFunc
	done   chan struct{}
}

// CertificateSource hands out the serving certificate for each TLS
// handshake (a certgen.Rotator, or controller-runtime's certwatcher).
type CertificateSource interface {
	GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
}

// UseCertificates serves src's certificates instead of the files in
// Config.CertDir. Call it before Start.
func (s *Server) UseCertificates(src CertificateSource) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.source = src
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
	m := newMetrics(reg)
	hook, err := admission.StandaloneWebhook(
		&admission.Webhook{Handler: &handler{policy: p, log: log, metrics: m}},
		// Our logger, so controller-runtime's global one is never touched.
		admission.StandaloneOptions{Logger: logr.FromSlogHandler(log.Handler())},
	)
	if err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	return &Server{cfg: cfg, log: log, handler: countInvalid(hook, m, log), metrics: m}, nil
}

// Handler is the admission handler alone (no TLS), for embedding and tests.
func (s *Server) Handler() http.Handler { return s.handler }

// Start loads the certificate, starts the server and returns once it
// accepts TLS connections (or with the error that stopped it). It serves
// until Stop.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return errors.New("webhook: already started")
	}
	host, port, err := resolvePort(s.cfg.Addr)
	if err != nil {
		return err
	}
	var (
		certs   = s.source
		watcher *certwatcher.CertWatcher
	)
	if certs == nil {
		if watcher, err = certwatcher.New(filepath.Join(s.cfg.CertDir, CertFile), filepath.Join(s.cfg.CertDir, KeyFile)); err != nil {
			return fmt.Errorf("webhook: load certificate from %s: %w", s.cfg.CertDir, err)
		}
		certs = watcher
	}
	srv := ctrlwebhook.NewServer(ctrlwebhook.Options{
		Host: host, Port: port,
		TLSOpts: []func(*tls.Config){func(c *tls.Config) {
			c.MinVersion = tls.VersionTLS12
			c.GetCertificate = certs.GetCertificate
		}},
	})
	srv.Register(s.cfg.Path, bounded(postOnly(s.handler), s.cfg.RequestTimeout, s.cfg.MaxRequestBytes))

	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	if watcher != nil {
		wg.Go(func() {
			if err := watcher.Start(runCtx); err != nil && runCtx.Err() == nil {
				s.log.Error("certificate watcher stopped; rotations are not picked up", "err", err)
			}
		})
	}
	wg.Go(func() {
		if err := srv.Start(runCtx); err != nil {
			errc <- err
			if runCtx.Err() == nil {
				s.log.Error("webhook server stopped", "err", err)
			}
		}
	})
	go func() {
		wg.Wait()
		close(done)
	}()
	started := srv.StartedChecker()
	for {
		err := started(nil)
		if err == nil {
			break
		}
		select {
		case err := <-errc:
			cancel()
			<-done
			return fmt.Errorf("webhook: listen %s: %w", s.cfg.Addr, err)
		case <-ctx.Done():
			cancel()
			<-done
			return fmt.Errorf("webhook: not serving: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	s.addr, s.srv, s.certs, s.cancel, s.done = net.JoinHostPort(host, strconv.Itoa(port)), srv, certs, cancel, done
	s.log.Info("webhook listening", "addr", s.addr, "path", s.cfg.Path, "certs", s.cfg.Certs)
	return nil
}

// resolvePort turns port 0 into a free port: controller-runtime's server
// listens itself and cannot report a random port back.
func resolvePort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("webhook: addr %q: %w", addr, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, fmt.Errorf("webhook: addr %q: %w", addr, err)
	}
	if port != 0 {
		return host, port, nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", 0, fmt.Errorf("webhook: listen %s: %w", addr, err)
	}
	defer ln.Close()
	return host, ln.Addr().(*net.TCPAddr).Port, nil
}

// Addr is the bound address (after Start), e.g. "127.0.0.1:9443".
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Stop shuts the server down gracefully: in-flight reviews finish within
// ctx (or Config.ShutdownTimeout when ctx has no deadline).
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	cancel, done := s.cancel, s.done
	s.srv, s.cancel = nil, nil
	s.mu.Unlock()
	if cancel == nil {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var c context.CancelFunc
		ctx, c = context.WithTimeout(ctx, s.cfg.ShutdownTimeout)
		defer c()
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("webhook: shutdown: %w", ctx.Err())
	}
}

// Ready reports whether the server accepts TLS connections with a
// certificate that is currently valid.
func (s *Server) Ready() error {
	s.mu.Lock()
	srv, certs := s.srv, s.certs
	s.mu.Unlock()
	if srv == nil {
		return errors.New("webhook server not running")
	}
	if err := srv.StartedChecker()(nil); err != nil {
		return err
	}
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

// postOnly answers 405 to anything but POST, as the apiserver only posts.
// bounded gives each request a deadline to be read and answered within, and
// refuses bodies above limit: controller-runtime's server bounds only the
// headers (ReadHeaderTimeout, MaxHeaderBytes), so a client trickling its
// body could otherwise hold a connection and a goroutine forever.
func bounded(h http.Handler, timeout time.Duration, limit int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		deadline := time.Now().Add(timeout)
		_ = rc.SetReadDeadline(deadline)
		_ = rc.SetWriteDeadline(deadline)
		if r.ContentLength > limit {
			http.Error(w, fmt.Sprintf("request body of %d bytes is over the limit of %d", r.ContentLength, limit), http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = closeOnError{ReadCloser: http.MaxBytesReader(w, r.Body, limit), h: w.Header()}
		h.ServeHTTP(w, r)
	})
}

// closeOnError has the server close the connection after its answer once
// reading the body failed (a timeout, the limit): what is left of the body
// on the connection is unknown, so it cannot carry another request, and a
// trickling client must not keep it open waiting for one.
type closeOnError struct {
	io.ReadCloser
	h http.Header
}

func (c closeOnError) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		c.h.Set("Connection", "close")
	}
	return n, err
}

// countInvalid counts and logs the requests controller-runtime refuses
// before our handler sees them: an empty or unreadable body, a wrong
// content type, a body that is not an AdmissionReview. It answers those
// itself, with an AdmissionReview whose response is not allowed and whose
// status (code 400) says what was wrong; our handler never denies, so a
// response that is not allowed is one of those.
func countInvalid(h http.Handler, m *metrics, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&invalidCounter{ResponseWriter: w, m: m, log: log, remote: r.RemoteAddr}, r)
	})
}

type invalidCounter struct {
	http.ResponseWriter
	m       *metrics
	log     *slog.Logger
	remote  string
	written bool
}

func (c *invalidCounter) Write(b []byte) (int, error) {
	if !c.written {
		c.written = true
		// The response is encoded in one write; "allowed" comes first.
		if bytes.Contains(b, []byte(`"allowed":false`)) {
			c.m.invalid.Inc()
			c.log.Warn("invalid admission request", "remote", c.remote, "response", string(b[:min(len(b), 512)]))
		}
	}
	return c.ResponseWriter.Write(b)
}

func postOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h.ServeHTTP(w, r)
	})
}
