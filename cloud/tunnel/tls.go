package tunnel

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

// TLS is the CONNECT listener's mutual TLS: the server certificate and
// key, and the CA bundle client certificates (kube-apiserver's
// tlsConfig.clientCert) must chain to. The files are re-read when one of
// them changes (a rotated, mounted Secret), checked at most once per
// second at a handshake; a bad rotation keeps the last good files.
type TLS struct {
	CertFile, KeyFile, ClientCAFile string
}

// Enabled reports whether any file is set.
func (t TLS) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" || t.ClientCAFile != "" }

// The flags naming the TLS files, for errors an operator can act on.
const (
	flagCert     = "--tunnel-connect-tls-cert"
	flagKey      = "--tunnel-connect-tls-key"
	flagClientCA = "--tunnel-connect-client-ca"
	flagAddr     = "--tunnel-connect-addr"
)

// validate checks the combination; load checks the files.
func (t TLS) validate(addr string) error {
	if addr == "" {
		if t.Enabled() {
			return fmt.Errorf("tunnel: ConnectTLS (%s, %s, %s) set without ConnectAddr (%s)", flagCert, flagKey, flagClientCA, flagAddr)
		}
		return nil
	}
	switch {
	case t.CertFile == "" && t.KeyFile != "":
		return fmt.Errorf("tunnel: ConnectTLS.KeyFile (%s) set without ConnectTLS.CertFile (%s)", flagKey, flagCert)
	case t.CertFile != "" && t.KeyFile == "":
		return fmt.Errorf("tunnel: ConnectTLS.CertFile (%s) set without ConnectTLS.KeyFile (%s)", flagCert, flagKey)
	case t.ClientCAFile != "" && t.CertFile == "":
		return fmt.Errorf("tunnel: ConnectTLS.ClientCAFile (%s) set without a server certificate (%s, %s)", flagClientCA, flagCert, flagKey)
	}
	if strings.HasPrefix(addr, "unix:") {
		if t.Enabled() {
			return fmt.Errorf("tunnel: ConnectTLS (%s) is for a TCP ConnectAddr, not %q (a socket's file permissions guard it)", flagCert, addr)
		}
		return nil
	}
	if loopback(addr) {
		return nil
	}
	if t.CertFile == "" || t.ClientCAFile == "" {
		return fmt.Errorf("tunnel: ConnectAddr %q (%s) is reachable off this host: it needs mutual TLS (%s, %s and %s), or listen on loopback or unix:/path",
			addr, flagAddr, flagCert, flagKey, flagClientCA)
	}
	return nil
}

// loopback reports whether a host:port listens on loopback only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// tlsFiles serves a tls.Config built from TLS, reloaded on change.
type tlsFiles struct {
	files TLS
	log   *slog.Logger

	mu      sync.Mutex
	cfg     *tls.Config
	stamp   string // the files' sizes and modification times
	checked time.Time
}

func newTLSFiles(t TLS, log *slog.Logger) (*tlsFiles, error) {
	f := &tlsFiles{files: t, log: log}
	cfg, err := f.load()
	if err != nil {
		return nil, err
	}
	f.cfg, f.stamp, f.checked = cfg, f.fileStamp(), time.Now()
	return f, nil
}

func (f *tlsFiles) fileStamp() string {
	var b strings.Builder
	for _, p := range []string{f.files.CertFile, f.files.KeyFile, f.files.ClientCAFile} {
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

func (f *tlsFiles) load() (*tls.Config, error) {
	certPEM, err := os.ReadFile(f.files.CertFile)
	if err != nil {
		return nil, fmt.Errorf("tunnel: ConnectTLS.CertFile (%s): %w", flagCert, err)
	}
	keyPEM, err := os.ReadFile(f.files.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tunnel: ConnectTLS.KeyFile (%s): %w", flagKey, err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("tunnel: ConnectTLS.CertFile (%s) %s and KeyFile (%s) %s: %w", flagCert, f.files.CertFile, flagKey, f.files.KeyFile, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if f.files.ClientCAFile != "" {
		caPEM, err := os.ReadFile(f.files.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("tunnel: ConnectTLS.ClientCAFile (%s): %w", flagClientCA, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, fmt.Errorf("tunnel: ConnectTLS.ClientCAFile (%s) %s: no PEM certificate", flagClientCA, f.files.ClientCAFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// config is tls.Config.GetConfigForClient: the current files' config.
func (f *tlsFiles) config(*tls.ClientHelloInfo) (*tls.Config, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if now := time.Now(); now.Sub(f.checked) >= time.Second {
		f.checked = now
		if st := f.fileStamp(); st != f.stamp {
			cfg, err := f.load()
			if err != nil {
				// Mid-rotation (one file written, not the other) or broken:
				// keep serving the last good pair and look again later.
				f.log.Warn("tunnel TLS files changed but do not load; keeping the previous ones", "err", err)
			} else {
				f.cfg, f.stamp = cfg, st
				f.log.Info("tunnel TLS files reloaded")
			}
		}
	}
	return f.cfg, nil
}

// listener wraps ln in TLS.
func (f *tlsFiles) listener(ln net.Listener) net.Listener {
	return tls.NewListener(ln, &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: f.config})
}
