package hub

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// TLSFiles are a PEM certificate (with its chain) and its key.
type TLSFiles struct {
	CertFile, KeyFile string
}

// Enabled reports whether files are set.
func (f TLSFiles) Enabled() bool { return f.CertFile != "" || f.KeyFile != "" }

// Validate names what is missing.
func (f TLSFiles) Validate() error {
	if f.Enabled() && (f.CertFile == "" || f.KeyFile == "") {
		return errors.New("hub: leaf TLS needs both the certificate and its key")
	}
	return nil
}

// certFiles serves the certificate of a pair of files and reads them
// again when either changes, so that a renewed certificate (cert-manager,
// a mounted Secret) takes effect on the next handshake without a restart.
type certFiles struct {
	files TLSFiles

	mu      sync.Mutex
	cert    *tls.Certificate
	modTime time.Time
}

func newCertFiles(f TLSFiles) (*certFiles, error) {
	c := &certFiles{files: f}
	if _, err := c.get(); err != nil {
		return nil, err
	}
	return c, nil
}

// get returns the current certificate, reloading it when a file is newer
// than the one loaded; a renewal that fails to load keeps the old one.
func (c *certFiles) get() (*tls.Certificate, error) {
	latest := time.Time{}
	for _, p := range []string{c.files.CertFile, c.files.KeyFile} {
		st, err := os.Stat(p)
		if err != nil {
			return c.loaded(fmt.Errorf("hub: leaf TLS: %w", err))
		}
		if st.ModTime().After(latest) {
			latest = st.ModTime()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert != nil && !latest.After(c.modTime) {
		return c.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(c.files.CertFile, c.files.KeyFile)
	if err != nil {
		if c.cert != nil {
			return c.cert, nil
		}
		return nil, fmt.Errorf("hub: leaf TLS: %w", err)
	}
	c.cert, c.modTime = &cert, latest
	return c.cert, nil
}

// loaded falls back to the certificate already loaded when the files
// cannot be read for a moment (a Secret volume being swapped).
func (c *certFiles) loaded(err error) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert != nil {
		return c.cert, nil
	}
	return nil, err
}

// serverConfig is the leaf listener's TLS configuration.
func (c *certFiles) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.get() },
	}
}
