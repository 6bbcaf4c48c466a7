package admin

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/test/poll"
)

// TestRefusesOffLoopbackWithoutAuth: an address other hosts reach needs a
// token file or mutual TLS, and the error names the flags.
func TestRefusesOffLoopbackWithoutAuth(t *testing.T) {
	token := writeFile(t, "token", "s3cret\n")
	tests := []struct {
		name string
		cfg  Config
		want string // "" = accepted
	}{
		{"loopback v4", Config{Addr: "127.0.0.1:0"}, ""},
		{"loopback v6", Config{Addr: "[::1]:0"}, ""},
		{"localhost", Config{Addr: "localhost:0"}, ""},
		{"all interfaces", Config{Addr: ":0"}, "needs authentication, a bearer token file (--admin-token-file) or mutual TLS (--admin-tls-cert, --admin-tls-key and --admin-client-ca)"},
		{"pod address", Config{Addr: "10.0.0.5:8080"}, "--admin-addr"},
		{"TLS without client CA", Config{Addr: ":0", TLS: TLS{CertFile: "c", KeyFile: "k"}}, "--admin-token-file"},
		{"missing cert", Config{Addr: "127.0.0.1:0", TLS: TLS{CertFile: "/nonexistent/c", KeyFile: "/nonexistent/k"}}, "TLS.CertFile (--admin-tls-cert): open /nonexistent/c"},
		{"token file", Config{Addr: ":0", TokenFile: token}, ""},
		{"CA without cert", Config{Addr: "127.0.0.1:0", TLS: TLS{ClientCAFile: "ca"}}, "certificate and key (--admin-tls-cert and --admin-tls-key)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == "" && err != nil {
				t.Fatalf("Validate() = %v, want nil", err)
			}
			if tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("Validate() = %v, want an error with %q", err, tt.want)
			}
		})
	}
	if _, err := New(Config{Addr: ":0", TokenFile: filepath.Join(t.TempDir(), "missing")}, slog.New(slog.DiscardHandler)); err == nil ||
		!strings.Contains(err.Error(), "--admin-token-file") {
		t.Fatalf("New with a missing token file = %v", err)
	}
	if _, err := New(Config{Addr: ":0", TokenFile: writeFile(t, "empty", "\n \n")}, slog.New(slog.DiscardHandler)); err == nil ||
		!strings.Contains(err.Error(), "holds no token") {
		t.Fatalf("New with an empty token file = %v", err)
	}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func start(t *testing.T, cfg Config) *Server {
	t.Helper()
	s, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	s.Handle("GET /ui/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "status page") }))
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop(t.Context()) })
	return s
}

// localURL is the server's URL on loopback (it may listen on every
// interface).
func localURL(s *Server, scheme string) string {
	_, port, _ := net.SplitHostPort(s.Addr())
	return scheme + "://127.0.0.1:" + port
}

func request(t *testing.T, c *http.Client, url, token string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestBearerToken: off loopback with a token file, the probes are open,
// everything else (metrics, pprof, mounted handlers) needs the token; the
// file is re-read when it is rotated, and a broken rotation keeps the
// previous tokens.
func TestBearerToken(t *testing.T) {
	tokenPath := writeFile(t, "token", "old-token\n")
	s := start(t, Config{Addr: ":0", TokenFile: tokenPath})
	base := localURL(s, "http")
	c := http.DefaultClient

	for _, p := range []string{"/healthz", "/readyz"} {
		if resp, body := request(t, c, base+p, ""); resp.StatusCode != 200 {
			t.Errorf("%s without a token = %d %q, want 200 (kubelet probes)", p, resp.StatusCode, body)
		}
	}
	for _, p := range []string{"/metrics", "/debug/pprof/", "/ui/"} {
		for _, tok := range []string{"", "wrong", "old-token-but-longer", "old-toke"} {
			resp, _ := request(t, c, base+p, tok)
			if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s with token %q = %d (WWW-Authenticate %q), want 401 Bearer", p, tok, resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
			}
		}
		if resp, body := request(t, c, base+p, "old-token"); resp.StatusCode != 200 {
			t.Errorf("%s with the token = %d %q", p, resp.StatusCode, body)
		}
	}
	if _, body := request(t, c, base+"/ui/", "old-token"); body != "status page" {
		t.Errorf("mounted handler served %q", body)
	}

	// Rotation, as a Secret volume does it: a new file swapped in.
	rotate := func(content string) {
		tmp := tokenPath + ".new"
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		// A later modification time than the first file even on a
		// coarse clock.
		later := time.Now().Add(time.Duration(len(content)) * time.Second)
		if err := os.Chtimes(tmp, later, later); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, tokenPath); err != nil {
			t.Fatal(err)
		}
	}
	rotate("new-token\nold-token\n") // overlap: both accepted
	for _, tok := range []string{"new-token", "old-token"} {
		if resp, _ := request(t, c, base+"/metrics", tok); resp.StatusCode != 200 {
			t.Errorf("during the overlap, %q = %d", tok, resp.StatusCode)
		}
	}
	rotate("new-token\n")
	if resp, _ := request(t, c, base+"/metrics", "old-token"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("old token after rotation = %d, want 401", resp.StatusCode)
	}
	if resp, _ := request(t, c, base+"/metrics", "new-token"); resp.StatusCode != 200 {
		t.Errorf("new token after rotation = %d", resp.StatusCode)
	}
	rotate("\n\n\n\n\n\n") // broken: keep the previous token
	if resp, _ := request(t, c, base+"/metrics", "new-token"); resp.StatusCode != 200 {
		t.Errorf("token after a broken rotation = %d, want the previous one kept", resp.StatusCode)
	}
}

// pki is a CA, a server certificate for 127.0.0.1 and client certificates.
type pki struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caPool *x509.CertPool
}

func newPKI(t *testing.T, name string) *pki {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	p := &pki{dir: t.TempDir(), ca: ca, caKey: key, caPool: x509.NewCertPool()}
	p.caPool.AddCert(ca)
	p.write(t, "ca.crt", "CERTIFICATE", der)
	return p
}

func (p *pki) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// issue writes name.crt and name.key and returns the pair.
func (p *pki) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (certFile, keyFile string, pair tls.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = p.write(t, name+".crt", "CERTIFICATE", der), p.write(t, name+".key", "EC PRIVATE KEY", kder)
	pair, err = tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, pair
}

// TestMutualTLS: off loopback with a client CA, the probes are open over
// HTTPS without a client certificate (as the kubelet probes), the rest
// needs a certificate the CA signed; a token still works beside it.
func TestMutualTLS(t *testing.T) {
	p := newPKI(t, "admin-ca")
	certFile, keyFile, _ := p.issue(t, "server", x509.ExtKeyUsageServerAuth)
	_, _, client := p.issue(t, "prometheus", x509.ExtKeyUsageClientAuth)
	other := newPKI(t, "other-ca")
	_, _, stranger := other.issue(t, "stranger", x509.ExtKeyUsageClientAuth)

	s := start(t, Config{Addr: ":0", TokenFile: writeFile(t, "token", "tok\n"),
		TLS: TLS{CertFile: certFile, KeyFile: keyFile, ClientCAFile: filepath.Join(p.dir, "ca.crt")}})
	base := localURL(s, "https")
	clientWith := func(certs ...tls.Certificate) *http.Client {
		return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: p.caPool, Certificates: certs}}}
	}
	anonymous, trusted := clientWith(), clientWith(client)

	for _, path := range []string{"/healthz", "/readyz"} {
		if resp, body := request(t, anonymous, base+path, ""); resp.StatusCode != 200 {
			t.Errorf("%s without a client certificate = %d %q, want 200", path, resp.StatusCode, body)
		}
	}
	for _, path := range []string{"/metrics", "/ui/"} {
		if resp, _ := request(t, anonymous, base+path, ""); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s without a client certificate = %d, want 401", path, resp.StatusCode)
		}
		if resp, body := request(t, trusted, base+path, ""); resp.StatusCode != 200 {
			t.Errorf("%s with a trusted client certificate = %d %q", path, resp.StatusCode, body)
		}
		if resp, _ := request(t, anonymous, base+path, "tok"); resp.StatusCode != 200 {
			t.Errorf("%s with the token over TLS = %d", path, resp.StatusCode)
		}
	}
	// A certificate from another CA is not sent (the server names its
	// CA) or fails the handshake: never authenticated.
	if resp, err := clientWith(stranger).Get(base + "/metrics"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("a client certificate of another CA: /metrics = %d, want 401", resp.StatusCode)
		}
	}
	// Plain HTTP gets no answer from a TLS listener.
	if resp, err := http.Get(localURL(s, "http") + "/healthz"); err == nil && resp.StatusCode == 200 {
		resp.Body.Close()
		t.Error("plain HTTP served on the TLS listener")
	}
}

// TestLoopbackOpen: with nothing configured on loopback, everything is
// open, mounted handlers too.
func TestLoopbackOpen(t *testing.T) {
	s := start(t, Config{Addr: "127.0.0.1:0"})
	for _, path := range []string{"/metrics", "/ui/", "/debug/pprof/"} {
		if resp, _ := request(t, http.DefaultClient, "http://"+s.Addr()+path, ""); resp.StatusCode != 200 {
			t.Errorf("%s on loopback = %d", path, resp.StatusCode)
		}
	}
}

// TestTLSRotation: a renewed serving certificate written over the files
// is served without a restart.
func TestTLSRotation(t *testing.T) {
	p := newPKI(t, "admin-ca")
	certFile, keyFile, _ := p.issue(t, "server", x509.ExtKeyUsageServerAuth)
	s := start(t, Config{Addr: "127.0.0.1:0", TLS: TLS{CertFile: certFile, KeyFile: keyFile}})
	served := func() string {
		conn, err := tls.Dial("tcp", s.Addr(), &tls.Config{RootCAs: p.caPool, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	if got := served(); got != "server" {
		t.Fatalf("served %q", got)
	}
	// issue writes <name>.crt/.key: renew under the same names, later
	// modification times, as a cert-manager Secret update does.
	renewed, renewedKey, _ := p.issue(t, "server-renewed", x509.ExtKeyUsageServerAuth)
	for _, f := range [][2]string{{renewed, certFile}, {renewedKey, keyFile}} {
		if err := os.Rename(f[0], f[1]); err != nil {
			t.Fatal(err)
		}
		later := time.Now().Add(time.Minute)
		if err := os.Chtimes(f[1], later, later); err != nil {
			t.Fatal(err)
		}
	}
	poll.Eventually(t, 30*time.Second, func() error {
		if got := served(); got != "server-renewed" {
			return fmt.Errorf("served %q, want the renewed certificate", got)
		}
		return nil
	})
}

// TestLoopbackPeers: with LoopbackPeers, a request from a loopback peer
// (kubectl port-forward into the pod) needs no token; any other peer
// still does.
func TestLoopbackPeers(t *testing.T) {
	tokenPath := writeFile(t, "token", "tok\n")
	for _, open := range []bool{false, true} {
		s, err := New(Config{Addr: ":0", TokenFile: tokenPath, LoopbackPeers: open}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		h := s.authenticate(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
		for _, tt := range []struct {
			peer string
			want int
		}{
			{"127.0.0.1:5123", http.StatusUnauthorized},
			{"[::1]:5123", http.StatusUnauthorized},
			{"10.1.2.3:5123", http.StatusUnauthorized},
			{"[2001:db8::1]:5123", http.StatusUnauthorized},
		} {
			if open && (strings.HasPrefix(tt.peer, "127.") || strings.HasPrefix(tt.peer, "[::1]")) {
				tt.want = http.StatusOK
			}
			r := httptest.NewRequest(http.MethodGet, "/ui/", nil)
			r.RemoteAddr = tt.peer
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tt.want {
				t.Errorf("LoopbackPeers=%v, peer %s without a token: %d, want %d", open, tt.peer, w.Code, tt.want)
			}
		}
	}
}
