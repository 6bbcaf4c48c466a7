package webhook

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/test/poll"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// writeSelfSigned writes a self-signed certificate for 127.0.0.1 to dir and
// returns it.
func writeSelfSigned(t *testing.T, dir string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, CertFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	writeFile(t, filepath.Join(dir, KeyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// writeFile replaces path atomically, as a kubelet updating a Secret volume
// does (by a rename, not in place).
func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// tlsClient trusts only the certificate currently in dir.
func tlsClient(t *testing.T, dir string) *http.Client {
	t.Helper()
	pemData, err := os.ReadFile(filepath.Join(dir, CertFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pemData)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 5 * time.Second}
}

// servedSerial is the serial number of the certificate the server at addr
// presents (not verified: the test compares it with what it wrote).
func servedSerial(ctx context.Context, addr string) (*big.Int, error) {
	d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // only reads the served certificate
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber, nil
}

func TestServerLifecycle(t *testing.T) {
	dir := t.TempDir()
	writeSelfSigned(t, dir)
	s, err := New(Config{Addr: "127.0.0.1:0", CertDir: dir}, protecting("a"), testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Ready(); err == nil {
		t.Error("ready before Start")
	}
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := s.Ready(); err != nil {
		t.Errorf("not ready after Start: %v", err)
	}
	if !strings.HasPrefix(s.Addr(), "127.0.0.1:") || strings.HasSuffix(s.Addr(), ":0") {
		t.Errorf("Addr() = %q, want the bound address", s.Addr())
	}

	body, _ := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "1", Kind: nodeKind, Operation: admissionv1.Update,
			Object: runtime.RawExtension{Raw: mustJSON(t, testNode("a", unreachableNoExecute))},
		},
	})
	resp, err := tlsClient(t, dir).Post("https://"+s.Addr()+DefaultPath, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var out admissionv1.AdmissionReview
	err = json.NewDecoder(resp.Body).Decode(&out)
	_ = resp.Body.Close()
	if err != nil || out.Response == nil || !out.Response.Allowed || len(out.Response.Patch) == 0 {
		t.Fatalf("review over TLS: err %v, response %+v", err, out.Response)
	}

	if err := s.Start(t.Context()); err == nil {
		t.Error("second Start succeeded")
	}
	if err := s.Stop(t.Context()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := s.Ready(); err == nil {
		t.Error("ready after Stop")
	}
	if _, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		t.Error("still listening after Stop")
	}
}

func TestServerStartErrors(t *testing.T) {
	t.Run("missing certificate", func(t *testing.T) {
		dir := t.TempDir()
		s, err := New(Config{Addr: "127.0.0.1:0", CertDir: dir}, protecting(), testLogger(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		err = s.Start(t.Context())
		if err == nil || !strings.Contains(err.Error(), dir) {
			t.Fatalf("Start = %v, want an error naming %s", err, dir)
		}
		if err := s.Stop(t.Context()); err != nil {
			t.Errorf("Stop after failed Start: %v", err)
		}
	})
	t.Run("address in use", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		dir := t.TempDir()
		writeSelfSigned(t, dir)
		s, err := New(Config{Addr: ln.Addr().String(), CertDir: dir}, protecting(), testLogger(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(t.Context()); err == nil || !strings.Contains(err.Error(), "listen") {
			t.Fatalf("Start = %v, want a listen error", err)
		}
	})
}

func TestServerReloadsRotatedCertificate(t *testing.T) {
	dir := t.TempDir()
	first := writeSelfSigned(t, dir)
	s, err := New(Config{Addr: "127.0.0.1:0", CertDir: dir}, protecting(), testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if got, err := servedSerial(ctx, s.Addr()); err != nil || got.Cmp(first.SerialNumber) != 0 {
		t.Fatalf("served serial %v (err %v), want %v", got, err, first.SerialNumber)
	}
	second := writeSelfSigned(t, dir)
	err = poll.Until(ctx, func(ctx context.Context) error {
		got, err := servedSerial(ctx, s.Addr())
		if err != nil {
			return err
		}
		if got.Cmp(second.SerialNumber) != 0 {
			return fmt.Errorf("still serving serial %v", got)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("rotated certificate not served: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "default", cfg: DefaultConfig()},
		{name: "zero path and timeout", cfg: Config{Addr: DefaultAddr, CertDir: "/certs"}},
		{name: "bad addr", cfg: Config{Addr: "9443", CertDir: "/certs"}, wantErr: "addr"},
		{name: "no cert dir", cfg: Config{Addr: ":9443"}, wantErr: "cert dir"},
		{name: "relative path", cfg: Config{Addr: ":9443", CertDir: "/c", Path: "mutate"}, wantErr: "path"},
		{name: "negative shutdown", cfg: Config{Addr: ":9443", CertDir: "/c", ShutdownTimeout: -1}, wantErr: "shutdown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, tt.cfg.Validate(), tt.wantErr)
		})
	}
}

func TestRegistrationConfigValidate(t *testing.T) {
	ca := []byte("pem")
	tests := []struct {
		name    string
		cfg     RegistrationConfig
		wantErr string
	}{
		{name: "url", cfg: RegistrationConfig{URL: "https://127.0.0.1:9443/mutate", CABundle: ca}},
		{name: "defaults need a client config", cfg: DefaultRegistrationConfig(), wantErr: "url or service"},
		{name: "service", cfg: RegistrationConfig{Service: ServiceRef{Namespace: "atoll", Name: "atoll-cloud"}, CAFile: "/ca.crt"}},
		{name: "neither", cfg: RegistrationConfig{CABundle: ca}, wantErr: "url or service"},
		{name: "both", cfg: RegistrationConfig{URL: "https://x/m", Service: ServiceRef{Namespace: "a", Name: "b"}, CABundle: ca}, wantErr: "exclusive"},
		{name: "http url", cfg: RegistrationConfig{URL: "http://x/m", CABundle: ca}, wantErr: "https"},
		{name: "no ca", cfg: RegistrationConfig{URL: "https://x/m"}, wantErr: "ca bundle"},
		{name: "timeout", cfg: RegistrationConfig{URL: "https://x/m", CABundle: ca, TimeoutSeconds: 31}, wantErr: "timeout seconds"},
		{name: "service without namespace", cfg: RegistrationConfig{Service: ServiceRef{Name: "b"}, CABundle: ca}, wantErr: "namespace"},
		{name: "service port", cfg: RegistrationConfig{Service: ServiceRef{Namespace: "a", Name: "b", Port: 70000}, CABundle: ca}, wantErr: "port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, tt.cfg.Validate(), tt.wantErr)
		})
	}
}

func checkErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("unexpected error: %v", err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Errorf("error %v, want one containing %q", err, want)
	}
}

// A client that trickles its body is cut off at the request timeout; a body
// over the limit is refused, whether announced or not.
func TestServerBoundsRequests(t *testing.T) {
	dir := t.TempDir()
	writeSelfSigned(t, dir)
	const timeout, limit = 500 * time.Millisecond, 1 << 10
	s, err := New(Config{Addr: "127.0.0.1:0", CertDir: dir, RequestTimeout: timeout, MaxRequestBytes: limit}, protecting("a"), testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	url := "https://" + s.Addr() + DefaultPath

	t.Run("announced body over the limit", func(t *testing.T) {
		resp, err := tlsClient(t, dir).Post(url, "application/json", bytes.NewReader(make([]byte, limit+1)))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("status %s, want 413", resp.Status)
		}
	})
	t.Run("chunked body over the limit", func(t *testing.T) {
		// No Content-Length: the limit applies while reading.
		pr, pw := io.Pipe()
		go func() {
			_, _ = pw.Write(make([]byte, 4*limit))
			_ = pw.Close()
		}()
		resp, err := tlsClient(t, dir).Post(url, "application/json", pr)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK && !strings.Contains(string(body), "too large") {
			t.Errorf("status %s body %q, want the body refused", resp.Status, body)
		}
	})
	t.Run("trickled body", func(t *testing.T) {
		conn, err := tls.Dial("tcp", s.Addr(), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // test client
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{", DefaultPath)
		// The server must give up on its own: read until it closes, with a
		// generous bound of our own.
		_ = conn.SetReadDeadline(time.Now().Add(10 * timeout))
		begin := time.Now()
		_, err = io.ReadAll(conn)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("server still holds the connection after %s (request timeout %s)", time.Since(begin).Round(time.Millisecond), timeout)
		}
	})
}
