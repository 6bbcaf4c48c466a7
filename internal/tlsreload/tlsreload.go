// Package tlsreload serves TLS from a certificate, a key and optionally a
// client CA bundle kept in files (a mounted Secret), re-read when one of
// them changes. The files are looked at, at most once a second, when a
// client says hello; a rotation that does not load (one file written, not
// the other yet) keeps the last good files and is logged.
//
// The admin listener (internal/admin) and the tunnel's CONNECT listener
// (cloud/tunnel) use it; errors name the configuration field and the
// flag that set each file, so an operator knows what to fix.
package tlsreload

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"
)

// Files are the paths of the server certificate, its key and the CA
// bundle client certificates must chain to (empty: no client
// certificates are asked for).
type Files struct {
	CertFile, KeyFile, ClientCAFile string
}

// Names name the files in errors: the component ("admin"), the
// configuration field holding Files ("TLS") and the flag of each file.
type Names struct {
	Component, Field          string
	CertFlag, KeyFlag, CAFlag string
}

// Server hands out the tls.Config of the current files.
type Server struct {
	files      Files
	names      Names
	clientAuth tls.ClientAuthType
	log        *slog.Logger

	mu      sync.Mutex
	cfg     *tls.Config
	stamp   string // the files' sizes and modification times
	checked time.Time
}

// New loads the files. clientAuth applies when a client CA is set
// (tls.RequireAndVerifyClientCert, or tls.VerifyClientCertIfGiven where
// some paths are open to clients without a certificate).
func New(files Files, names Names, clientAuth tls.ClientAuthType, log *slog.Logger) (*Server, error) {
	s := &Server{files: files, names: names, clientAuth: clientAuth, log: log}
	cfg, err := s.load()
	if err != nil {
		return nil, err
	}
	s.cfg, s.stamp, s.checked = cfg, s.fileStamps(), time.Now()
	return s, nil
}

// Check loads the files once, for a configuration check before start.
func Check(files Files, names Names) error {
	_, err := (&Server{files: files, names: names}).load()
	return err
}

// Listener wraps ln in TLS with the current files.
func (s *Server) Listener(ln net.Listener) net.Listener {
	return tls.NewListener(ln, &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: s.config})
}

func (s *Server) fileStamps() string {
	var b strings.Builder
	for _, p := range []string{s.files.CertFile, s.files.KeyFile, s.files.ClientCAFile} {
		if p == "" {
			continue
		}
		if st, err := os.Stat(p); err == nil {
			fmt.Fprintf(&b, "%d/%d;", st.Size(), st.ModTime().UnixNano())
		} else {
			b.WriteString("missing;")
		}
	}
	return b.String()
}

func (s *Server) load() (*tls.Config, error) {
	n := s.names
	certPEM, err := os.ReadFile(s.files.CertFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %s.CertFile (%s): %w", n.Component, n.Field, n.CertFlag, err)
	}
	keyPEM, err := os.ReadFile(s.files.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("%s: %s.KeyFile (%s): %w", n.Component, n.Field, n.KeyFlag, err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %s.CertFile (%s) %s and %s.KeyFile (%s) %s: %w",
			n.Component, n.Field, n.CertFlag, s.files.CertFile, n.Field, n.KeyFlag, s.files.KeyFile, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if s.files.ClientCAFile != "" {
		caPEM, err := os.ReadFile(s.files.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %s.ClientCAFile (%s): %w", n.Component, n.Field, n.CAFlag, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, fmt.Errorf("%s: %s.ClientCAFile (%s) %s: no PEM certificate", n.Component, n.Field, n.CAFlag, s.files.ClientCAFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, s.clientAuth
	}
	return cfg, nil
}

// config is tls.Config.GetConfigForClient: the current files' config.
func (s *Server) config(*tls.ClientHelloInfo) (*tls.Config, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now := time.Now(); now.Sub(s.checked) >= time.Second {
		s.checked = now
		if st := s.fileStamps(); st != s.stamp {
			if cfg, err := s.load(); err != nil {
				s.log.Warn(s.names.Component+" TLS files changed but do not load; keeping the previous ones", "err", err)
			} else {
				s.cfg, s.stamp = cfg, st
				s.log.Info(s.names.Component + " TLS files reloaded")
			}
		}
	}
	return s.cfg, nil
}
