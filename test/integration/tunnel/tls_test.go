package tunnel_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/cloud/tunnel"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// testCA issues certificates into a directory.
type testCA struct {
	t    *testing.T
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	File string // the CA certificate, PEM
}

var serial int64 = 10

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &testCA{t: t, dir: dir, cert: cert, key: key, File: filepath.Join(dir, name+".crt")}
	writePEM(t, ca.File, "CERTIFICATE", der)
	return ca
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// issue writes name.crt and name.key: a server certificate for 127.0.0.1
// and localhost, or a client certificate.
func (ca *testCA) issue(name string, server bool) (certFile, keyFile string) {
	t := ca.t
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses, tmpl.DNSNames = []net.IP{net.ParseIP("127.0.0.1")}, []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(ca.dir, name+".crt"), filepath.Join(ca.dir, name+".key")
	// Write to temporary names and rename, as a Secret volume swaps files.
	writePEM(t, certFile+".new", "CERTIFICATE", der)
	writePEM(t, keyFile+".new", "EC PRIVATE KEY", keyDER)
	if err := os.Rename(keyFile+".new", keyFile); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(certFile+".new", certFile); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestConnectTLSConfig: bad combinations and bad files are refused with
// the field and the flag named.
func TestConnectTLSConfig(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	cert, key := ca.issue("server", true)
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr string
		tls  tunnel.TLS
		want string // "" when valid
	}{
		{"127.0.0.1:0", tunnel.TLS{}, ""},
		{"localhost:8132", tunnel.TLS{}, ""},
		{"[::1]:8132", tunnel.TLS{}, ""},
		{"unix:/tmp/x.sock", tunnel.TLS{}, ""},
		{"127.0.0.1:0", tunnel.TLS{CertFile: cert, KeyFile: key}, ""},
		{"0.0.0.0:8132", tunnel.TLS{CertFile: cert, KeyFile: key, ClientCAFile: ca.File}, ""},
		{":8132", tunnel.TLS{}, "needs mutual TLS (--tunnel-connect-tls-cert, --tunnel-connect-tls-key and --tunnel-connect-client-ca)"},
		{"10.0.0.1:8132", tunnel.TLS{CertFile: cert, KeyFile: key}, "needs mutual TLS"},
		{"127.0.0.1:0", tunnel.TLS{KeyFile: key}, "ConnectTLS.KeyFile (--tunnel-connect-tls-key) set without ConnectTLS.CertFile (--tunnel-connect-tls-cert)"},
		{"127.0.0.1:0", tunnel.TLS{CertFile: cert}, "ConnectTLS.CertFile (--tunnel-connect-tls-cert) set without"},
		{"127.0.0.1:0", tunnel.TLS{ClientCAFile: ca.File}, "ConnectTLS.ClientCAFile (--tunnel-connect-client-ca) set without a server certificate"},
		{"unix:/tmp/x.sock", tunnel.TLS{CertFile: cert, KeyFile: key}, "is for a TCP ConnectAddr"},
		{"", tunnel.TLS{CertFile: cert, KeyFile: key}, "set without ConnectAddr (--tunnel-connect-addr)"},
		{"127.0.0.1:0", tunnel.TLS{CertFile: filepath.Join(dir, "missing.crt"), KeyFile: key}, "ConnectTLS.CertFile (--tunnel-connect-tls-cert): open " + filepath.Join(dir, "missing.crt")},
		{"127.0.0.1:0", tunnel.TLS{CertFile: cert, KeyFile: filepath.Join(dir, "missing.key")}, "ConnectTLS.KeyFile (--tunnel-connect-tls-key): open"},
		{"127.0.0.1:0", tunnel.TLS{CertFile: garbage, KeyFile: key}, "ConnectTLS.CertFile (--tunnel-connect-tls-cert) " + garbage},
		{"127.0.0.1:0", tunnel.TLS{CertFile: cert, KeyFile: key, ClientCAFile: garbage}, "ConnectTLS.ClientCAFile (--tunnel-connect-client-ca) " + garbage + ": no PEM certificate"},
		{"127.0.0.1:0", tunnel.TLS{CertFile: cert, KeyFile: key, ClientCAFile: filepath.Join(dir, "nope")}, "ConnectTLS.ClientCAFile (--tunnel-connect-client-ca): open"},
	} {
		cfg := tunnel.DefaultConfig()
		cfg.ConnectAddr, cfg.ConnectTLS = tc.addr, tc.tls
		_, err := tunnel.New(cfg, tunnel.Names{}, nil, nil)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s %+v: %v", tc.addr, tc.tls, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s %+v: got %v, want %q", tc.addr, tc.tls, err, tc.want)
		}
	}
}

// tlsConnect sends CONNECT hostport over TLS to addr with cfg and
// returns the status line or the error.
func tlsConnect(addr, hostport string, cfg *tls.Config) (string, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", hostport, hostport)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil {
		return "", err
	}
	return resp.Status, nil
}

// TestConnectMTLS: the CONNECT listener over mutual TLS admits a client
// certificate of its client CA, refuses a client without one or with one
// of another CA, and serves a rotated server certificate without a
// restart.
func TestConnectMTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	other := newTestCA(t, dir, "other")
	cert, key := ca.issue("server", true)
	r := setupWith(t, echoServer(t), tunnel.Names{}, func(c *tunnel.Config) {
		c.ConnectTLS = tunnel.TLS{CertFile: cert, KeyFile: key, ClientCAFile: ca.File}
	})
	addr := r.servers[0].Addrs()[0].String()
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	clientPair := func(c *testCA, name string) []tls.Certificate {
		cf, kf := c.issue(name, false)
		pair, err := tls.LoadX509KeyPair(cf, kf)
		if err != nil {
			t.Fatal(err)
		}
		return []tls.Certificate{pair}
	}
	good := &tls.Config{RootCAs: roots, Certificates: clientPair(ca, "apiserver")}
	target := "n1:" + r.kubeletPort
	if st, err := tlsConnect(addr, target, good); err != nil || st != "200 OK" {
		t.Fatalf("CONNECT with a client certificate: %q %v", st, err)
	}
	if st, err := tlsConnect(addr, target, &tls.Config{RootCAs: roots}); err == nil {
		t.Fatalf("CONNECT without a client certificate answered %q", st)
	} else {
		t.Logf("without a client certificate: %v", err)
	}
	if st, err := tlsConnect(addr, target, &tls.Config{RootCAs: roots, Certificates: clientPair(other, "stranger")}); err == nil {
		t.Fatalf("CONNECT with another CA's client certificate answered %q", st)
	}
	// Plain CONNECT on the TLS port gets no answer but a TLS error.
	if c, err := net.Dial("tcp", addr); err == nil {
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil && resp.StatusCode == http.StatusOK {
			t.Fatal("plain CONNECT on the TLS listener succeeded")
		}
		c.Close()
	}

	// Rotation: new server certificate files are served without a restart.
	before := serverSerial(t, addr, good)
	cert2, _ := ca.issue("server", true)
	if cert2 != cert {
		t.Fatal("rotation wrote other file names")
	}
	deadline := time.Now().Add(30 * time.Second)
	for serverSerial(t, addr, good) == before {
		if time.Now().After(deadline) {
			t.Fatal("the rotated server certificate was not picked up within 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if st, err := tlsConnect(addr, target, good); err != nil || st != "200 OK" {
		t.Fatalf("CONNECT after rotation: %q %v", st, err)
	}
}

func serverSerial(t *testing.T, addr string, cfg *tls.Config) string {
	t.Helper()
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestKubectlThroughTunnelMTLS: the real kube-apiserver's egress
// selector reaches the tunnel over TCP with mutual TLS
// (transport.tcp.url https://…, tlsConfig caBundle/clientCert/clientKey),
// and kubectl logs and exec -i work through it.
func TestKubectlThroughTunnelMTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	cert, key := ca.issue("server", true)
	clientCert, clientKey := ca.issue("apiserver", false)
	k := startKubeCluster(t, func(c *tunnel.Config) {
		c.ConnectTLS = tunnel.TLS{CertFile: cert, KeyFile: key, ClientCAFile: ca.File}
	}, func(addr string) kubetest.Option {
		return kubetest.WithClusterEgressTLS(addr, kubetest.EgressTLS{CABundle: ca.File, ClientCert: clientCert, ClientKey: clientKey})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	k.logs(t, ctx)
	execCmd := k.kubectl(ctx, "exec", "-i", "web", "-c", "app", "--", "cat")
	execCmd.Stdin = strings.NewReader("stdin through mTLS\n")
	out, err := execCmd.CombinedOutput()
	if err != nil || string(out) != "stdin through mTLS\n" {
		t.Fatalf("kubectl exec -i: %v\n%s", err, out)
	}
}
