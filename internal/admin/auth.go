package admin

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"

	"github.com/atoll-edge/atoll/internal/tlsreload"
)

// The flags that configure authentication, named in errors.
const (
	FlagAddr      = "--admin-addr"
	FlagTokenFile = "--admin-token-file"
	FlagTLSCert   = "--admin-tls-cert"
	FlagTLSKey    = "--admin-tls-key"
	FlagClientCA  = "--admin-client-ca"
)

// TLS configures HTTPS on the admin listener. With ClientCAFile,
// clients that present a certificate it signs are authenticated (mTLS).
type TLS struct {
	CertFile     string
	KeyFile      string
	ClientCAFile string
}

func (t TLS) enabled() bool { return t.CertFile != "" || t.KeyFile != "" || t.ClientCAFile != "" }

// errUnauthenticated is the reason a request without credentials is refused.
var errUnauthenticated = errors.New("admin: authentication required")

// openPaths stay reachable without credentials: the kubelet probes them.
var openPaths = map[string]bool{"/healthz": true, "/readyz": true}

// loopbackHost reports whether host (of host:port) is loopback only.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// tokenFile holds the accepted bearer tokens (one per non-empty line of
// the file, so a rotation can accept the old and the new token for a
// while), re-read when the file changes.
type tokenFile struct {
	path string
	log  *slog.Logger

	mu     sync.Mutex
	stamp  string
	hashes [][sha256.Size]byte
}

func newTokenFile(path string, log *slog.Logger) (*tokenFile, error) {
	f := &tokenFile{path: path, log: log}
	st, err := fileStamp(path)
	if err != nil {
		return nil, fmt.Errorf("admin: TokenFile (%s): %w", FlagTokenFile, err)
	}
	h, err := f.load()
	if err != nil {
		return nil, err
	}
	f.stamp, f.hashes = st, h
	return f, nil
}

func fileStamp(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d/%d", st.Size(), st.ModTime().UnixNano()), nil
}

func (f *tokenFile) load() ([][sha256.Size]byte, error) {
	data, err := os.ReadFile(f.path)
	if err != nil {
		return nil, fmt.Errorf("admin: TokenFile (%s): %w", FlagTokenFile, err)
	}
	var out [][sha256.Size]byte
	for _, line := range strings.Split(string(data), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			out = append(out, sha256.Sum256([]byte(line)))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("admin: TokenFile (%s) %s holds no token", FlagTokenFile, f.path)
	}
	return out, nil
}

// current returns the tokens, re-reading the file when it changed. A file
// that no longer loads (mid-rotation, emptied) keeps the previous tokens.
func (f *tokenFile) current() [][sha256.Size]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, err := fileStamp(f.path)
	if err == nil && st != f.stamp {
		if h, err := f.load(); err != nil {
			f.log.Warn("admin token file changed but does not load; keeping the previous tokens", "err", err)
		} else {
			f.hashes, f.stamp = h, st
			f.log.Info("admin token file reloaded", "tokens", len(h))
		}
	}
	return f.hashes
}

// valid compares token with every accepted token in constant time (the
// hashes have a fixed length, so not even the length leaks).
func (f *tokenFile) valid(token string) bool {
	got := sha256.Sum256([]byte(token))
	ok := 0
	for _, h := range f.current() {
		ok |= subtle.ConstantTimeCompare(got[:], h[:])
	}
	return ok == 1
}

// tlsNames name the admin TLS files in errors.
var tlsNames = tlsreload.Names{Component: "admin", Field: "TLS", CertFlag: FlagTLSCert, KeyFlag: FlagTLSKey, CAFlag: FlagClientCA}

// authenticate wraps next: /healthz and /readyz are open; every other
// path needs a verified client certificate (with a client CA) or a
// bearer token from the token file, when either is configured.
func (s *Server) authenticate(next http.Handler) http.Handler {
	if s.tokens == nil && s.cfg.TLS.ClientCAFile == "" {
		return next // loopback only (Validate): open, as the tests and local runs want
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if openPaths[r.URL.Path] || s.authenticated(r) {
			next.ServeHTTP(w, r)
			return
		}
		if s.tokens != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="atoll-admin"`)
		} else {
			w.Header().Set("WWW-Authenticate", `Bearer realm="atoll-admin", error="invalid_request", error_description="client certificate required"`)
		}
		http.Error(w, errUnauthenticated.Error(), http.StatusUnauthorized)
	})
}

func (s *Server) authenticated(r *http.Request) bool {
	if s.cfg.LoopbackPeers {
		if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil && loopbackHost(host) {
			return true
		}
	}
	if s.cfg.TLS.ClientCAFile != "" && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		return true
	}
	if s.tokens == nil {
		return false
	}
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	return ok && strings.EqualFold(scheme, "Bearer") && s.tokens.valid(strings.TrimSpace(token))
}
