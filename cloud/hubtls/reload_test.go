package hubtls_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/cloud/hubtls"
	"github.com/atoll-edge/atoll/test/freeport"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestReloaderReloadsARealServer runs a real nats-server process (built
// from the pinned module) with its leaf listener on TLS and a pid file, as
// the external hub's pods do, and the reloader beside it: the server
// serves the certificate it started with; a new pair replaces it at the
// next handshake; a mismatched pair is not signalled and the server keeps
// serving the last good one.
func TestReloaderReloadsARealServer(t *testing.T) {
	dir := t.TempDir()
	server := filepath.Join(dir, "nats-server")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", server, "github.com/nats-io/nats-server/v2")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build nats-server: %v\n%s", err, out)
	}
	a, b := natstest.NewTLS(t, dir, "a"), natstest.NewTLS(t, dir, "b")
	cert, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	install := func(certFrom, keyFrom string) {
		t.Helper()
		for src, dst := range map[string]string{certFrom: cert, keyFrom: key} {
			data, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst+".new", data, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(dst+".new", dst); err != nil {
				t.Fatal(err)
			}
		}
	}
	install(a.CertFile, a.KeyFile)
	port, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(dir, "nats.pid")
	conf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, `listen: 127.0.0.1:-1
pid_file: %q
leafnodes {
  listen: 127.0.0.1:%d
  tls { cert_file: %q, key_file: %q, timeout: 2 }
}
`, pidFile, port, cert, key), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(server, "--config", conf)
	var serverLog natstest.Buffer
	cmd.Stdout, cmd.Stderr = &serverLog, &serverLog
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})

	var logs natstest.Buffer
	r := hubtls.Reloader{CertFile: cert, KeyFile: key, PIDFile: pidFile, Interval: 50 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(&logs, nil))}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	addr := fmt.Sprintf("127.0.0.1:%d", port)
	served := func(want string) {
		t.Helper()
		wait, stop := context.WithTimeout(t.Context(), 20*time.Second)
		defer stop()
		var got string
		if err := poll.Until(wait, func(context.Context) error {
			got, err = leafCertificate(addr)
			if err != nil || got != want {
				return fmt.Errorf("leaf listener serves %q (%v), want %q", got, err, want)
			}
			return nil
		}); err != nil {
			t.Fatalf("%v\nserver log:\n%s\nreloader log:\n%s", err, serverLog.String(), logs.String())
		}
	}
	served("a hub")
	install(b.CertFile, b.KeyFile)
	served("b hub")
	if n := strings.Count(logs.String(), "server reloaded"); n < 1 {
		t.Fatalf("reloader logged %d reloads:\n%s", n, logs.String())
	}

	reloads := strings.Count(logs.String(), "server reloaded")
	install(a.CertFile, b.KeyFile) // a's certificate, b's key
	time.Sleep(500 * time.Millisecond)
	if n := strings.Count(logs.String(), "server reloaded"); n != reloads {
		t.Errorf("a mismatched pair was signalled (%d reloads, want %d):\n%s", n, reloads, logs.String())
	}
	if !strings.Contains(logs.String(), "does not load") {
		t.Errorf("the mismatched pair is not reported:\n%s", logs.String())
	}
	served("b hub")
	install(a.CertFile, a.KeyFile)
	served("a hub")
}

// leafCertificate is the common name of the certificate a NATS leaf
// listener serves: it reads the server's INFO line, then upgrades to TLS.
func leafCertificate(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	if !strings.HasPrefix(line, "INFO ") || !strings.Contains(line, `"tls_required":true`) {
		return "", fmt.Errorf("not a TLS leaf listener: %s", line)
	}
	tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reads the served certificate only
	if err := tc.Handshake(); err != nil {
		return "", err
	}
	return tc.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}
