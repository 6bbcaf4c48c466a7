package hublink_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/natsembed"
	"github.com/atoll-edge/atoll/test/poll"
)

func startServer(t *testing.T, o *server.Options) *server.Server {
	t.Helper()
	o.NoSigs, o.NoLog = true, true
	srv, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := natsembed.Start(ctx, srv, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// pki writes a CA and a server and a client certificate it signed.
func pki(t *testing.T) (dir string) {
	t.Helper()
	dir = t.TempDir()
	write := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hub ca"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	write("ca.crt", "CERTIFICATE", caDER)
	for i, name := range []string{"server", "client"} {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		write(name+".crt", "CERTIFICATE", der)
		kder, _ := x509.MarshalECPrivateKey(key)
		write(name+".key", "EC PRIVATE KEY", kder)
	}
	return dir
}

// TestDialTLS: with a CA, a client certificate and a key the link dials a
// hub that requires mutual TLS; without the client certificate it cannot.
func TestDialTLS(t *testing.T) {
	dir := pki(t)
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
		CertFile: filepath.Join(dir, "server.crt"), KeyFile: filepath.Join(dir, "server.key"),
		CaFile: filepath.Join(dir, "ca.crt"), Verify: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, &server.Options{Host: "127.0.0.1", Port: -1, TLSConfig: tc, TLSVerify: true, TLSTimeout: 2})
	url := "tls://127.0.0.1:" + strconv.Itoa(srv.Addr().(*net.TCPAddr).Port)
	log := slog.New(slog.DiscardHandler)

	cfg := hublink.ClientConfig{URLs: []string{url}, Domain: "hub", TLS: hublink.TLSConfig{
		CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "client.crt"), KeyFile: filepath.Join(dir, "client.key")}}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	nc, err := cfg.Dialer("test", log)(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !nc.TLSRequired() {
		t.Error("connected without TLS")
	}
	nc.Close()

	cfg.TLS.CertFile, cfg.TLS.KeyFile = "", ""
	short, cancel2 := context.WithTimeout(t.Context(), time.Second)
	defer cancel2()
	if nc, err := cfg.Dialer("test", log)(short); err == nil {
		nc.Close()
		t.Fatal("connected without a client certificate")
	}
}

// TestDialWaitsForTheHub: a service that starts before the hub connects
// once the hub is up.
func TestDialWaitsForTheHub(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	log := slog.New(slog.DiscardHandler)
	cfg := hublink.ClientConfig{URLs: []string{"nats://127.0.0.1:" + strconv.Itoa(port)}, Domain: "hub"}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	link := hublink.New(cfg.Domain, cfg.Dialer("test", log), log)
	done := make(chan error, 1)
	go func() { done <- link.Start(ctx) }()
	if err := link.Ready(ctx); err == nil {
		t.Fatal("ready before the hub is up")
	}
	startServer(t, &server.Options{Host: "127.0.0.1", Port: port})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Stop(context.Background()) })
	if err := link.Ready(ctx); err != nil {
		t.Fatalf("not ready once connected: %v", err)
	}
}

// TestLinkFailsOver: a link whose server dies reconnects to another URL
// of its list and is ready again.
func TestLinkFailsOver(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	servers := map[string]*server.Server{}
	var urls []string
	for range 2 {
		srv := startServer(t, &server.Options{Host: "127.0.0.1", Port: -1})
		u := "nats://" + srv.Addr().String()
		servers[u] = srv
		urls = append(urls, u)
	}
	cfg := hublink.ClientConfig{URLs: urls, Domain: "hub"}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	link := hublink.New(cfg.Domain, cfg.Dialer("test", log), log)
	if err := link.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Stop(context.Background()) })
	first := link.Conn().ConnectedUrl()
	servers[first].Shutdown()
	poll.Eventually(t, 10*time.Second, func() error {
		if err := link.Ready(ctx); err != nil {
			return err
		}
		if u := link.Conn().ConnectedUrl(); u == first {
			return fmt.Errorf("still on %s", u)
		}
		return nil
	})
	reg := prometheus.NewRegistry()
	reg.MustRegister(link.Collector("test"))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			got[f.GetName()] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	if got["atoll_hublink_reconnects_total"] != 1 || got["atoll_hublink_connected"] != 1 {
		t.Errorf("metrics %v, want one reconnect and connected", got)
	}
}
