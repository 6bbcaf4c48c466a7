package main

import (
	"bytes"
	"context"
	"flag"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"go.uber.org/fx/fxtest"

	"github.com/atoll-edge/atoll/deploy"
	"github.com/atoll-edge/atoll/edge/edgeapp"
	"github.com/atoll-edge/atoll/internal/cliflags"
	"github.com/atoll-edge/atoll/test/natstest"
)

// TestDependencyFence: the edge binary never links Kubernetes client code;
// edge agents hold no Kubernetes credentials.
func TestDependencyFence(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "k8s.io/client-go") || strings.HasPrefix(pkg, "sigs.k8s.io/controller-runtime") {
			t.Fatalf("atoll-edge depends on %s", pkg)
		}
	}
}

func TestAppStartsAndStops(t *testing.T) {
	seedFile := credsFile(t)
	t.Setenv("NODE_NAME", "edge-1")
	cfg := edgeapp.Default()
	fs := flag.NewFlagSet("atoll-edge", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	err := fs.Parse([]string{"--admin-addr=127.0.0.1:0", "--hub-url=nats-leaf://127.0.0.1:1", "--creds-file=" + seedFile,
		"--client-port=-1", "--route-host=127.0.0.1", "--route-port=-1", "--state-dir=" + t.TempDir(), "--unit=u1",
		"--proxy-addr=127.0.0.1:0", "--hosts-file=" + filepath.Join(t.TempDir(), "atoll.hosts")})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Finish()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	fxtest.New(t, edgeapp.Options(cfg, natstest.Logger(t, slog.LevelError))).RequireStart().RequireStop()
}

func TestBadConfigNamesTheField(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--node-name=a*b", "--hub-url=nats-leaf://h:7422"}, "node name"},
		{[]string{"--node-name=n", "--hub-url=http://h:7422"}, "scheme"},
		{[]string{"--node-name=n"}, "--hub-url is required"},
		{[]string{"--node-name=n", "--hub-url=nats-leaf://h:7422", "--client-host=0.0.0.0"}, "loopback"},
		{[]string{"--node-name=n", "--hub-url=nats-leaf://h:7422", "--internal-ip=x"}, "internal IP"},
		{[]string{"--node-name=n", "--hub-url=nats-leaf://h:7422", "--unit=a b"}, "unit"},
		{[]string{"--node-name=n", "--hub-url=nats-leaf://h:7422", "--proxy-addr=nowhere"}, "proxy: Addr"},
		{[]string{"--node-name=n", "--hub-url=nats-leaf://h:7422", "--hosts-file=relative"}, "hosts: Path"},
		{[]string{"--node-name=n", "--hub-url=nats-leaf://h:7422", "--admin-addr=:9470"}, "needs authentication, a bearer token file (--admin-token-file) or mutual TLS"},
		{[]string{"--node-name=n", "--hub-url=nats-leaf://h:7422", "--admin-addr=:9470", "--admin-token-file=/nonexistent/token"}, "admin: TokenFile (--admin-token-file)"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			cfg := edgeapp.Default()
			fs := flag.NewFlagSet("atoll-edge", flag.ContinueOnError)
			cfg.RegisterFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			cfg.Finish()
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate(%v) = %v, want an error about %q", tt.args, err, tt.want)
			}
		})
	}
}

// cli runs atoll-edge's command line as main does and returns its exit
// code, stdout and stderr.
func cli(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errs bytes.Buffer
	err := run(ctx, args, &out, &errs)
	code = cliflags.Exit(&errs, prog, err)
	return code, out.String(), errs.String()
}

// TestCommandLineErrors: every wrong command line is one line naming what
// is wrong plus a usage hint, exit code 2; -h prints the usage and exits 0;
// a failed start is one line, exit code 1; nothing dumps fx's graph.
func TestCommandLineErrors(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	seedFile := credsFile(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := strconv.Itoa(busy.Addr().(*net.TCPAddr).Port)
	base := []string{"--admin-addr=127.0.0.1:0", "--hub-url=nats-leaf://127.0.0.1:1", "--creds-file=" + seedFile,
		"--route-host=127.0.0.1", "--route-port=-1", "--state-dir=" + t.TempDir()}
	tests := []struct {
		name string
		args []string
		code int
		want string // the first line of stderr; with code 1 its last, after the app's log
	}{
		{"unknown flag", []string{"--bogus"}, 2, "atoll-edge: flag provided but not defined: -bogus"},
		{"bad value", []string{"--client-port=abc"}, 2, `atoll-edge: invalid value "abc" for flag -client-port: parse error`},
		{"argument", []string{"--node-name=n1", "extra"}, 2, `atoll-edge: unexpected argument "extra" (atoll-edge takes only flags)`},
		{"no node name", base, 2, "atoll-edge: --node-name is required (or $NODE_NAME, or $ATOLL_NODE_NAME)"},
		{"bad log level", append([]string{"--node-name=n1", "--log-level=loud"}, base...), 2, `atoll-edge: log level "loud": want debug, info, warn or error`},
		{"client port in use", append([]string{"--node-name=n1", "--client-port=" + busyPort}, base...), 1,
			`atoll-edge: start: natsnode: start n1: Error listening on port: 127.0.0.1:` + busyPort + `, "listen tcp 127.0.0.1:` + busyPort + `: bind: address already in use"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			code, stdout, stderr := cli(t, tt.args...)
			lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
			if code == 1 {
				if strings.Contains(stderr, "could not build") || strings.Contains(stderr, `"component":"fx"`) {
					t.Fatalf("fx's graph or events in the output:\n%s", stderr)
				}
				lines = lines[len(lines)-1:]
			}
			if code != tt.code || lines[0] != tt.want {
				t.Fatalf("exit %d, stderr:\n%s\nwant exit %d and first line\n%s", code, stderr, tt.code, tt.want)
			}
			wantLines := 1
			if tt.code == 2 {
				wantLines = 2
				if lines[1] != "Run 'atoll-edge -h' for usage." {
					t.Fatalf("no usage hint: %q", lines[1])
				}
			}
			if len(lines) != wantLines || stdout != "" {
				t.Fatalf("stderr has %d lines, want %d; stdout %q:\n%s", len(lines), wantLines, stdout, stderr)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("took %v to fail", d)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, arg := range []string{"-h", "--help", "-help"} {
		code, stdout, stderr := cli(t, arg)
		if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "usage: atoll-edge") || !strings.Contains(stdout, "-node-name") {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q", arg, code, stdout, stderr)
		}
	}
}

// credsFile writes a NATS credentials file: a user JWT (of an account no
// hub trusts: these tests need no hub) and its seed.
func credsFile(t *testing.T) string {
	t.Helper()
	acc, _ := nkeys.CreateAccount()
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	tok, err := jwt.NewUserClaims(pub).Encode(acc)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	data, err := jwt.FormatUserConfig(tok, seed)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "node.creds")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestHostUnits: the systemd units of deploy/host run atoll-edge and its
// local API endpoint with flags they accept, given the example
// environment files, which they read from /etc/atoll.
func TestHostUnits(t *testing.T) {
	for _, tt := range []struct{ unit, env string }{
		{"atoll-edge.service", "atoll-edge.env"},
		{"atoll-local-api.service", "local-api.env"},
	} {
		t.Run(tt.unit, func(t *testing.T) {
			u, err := deploy.ReadHostUnit(tt.unit)
			if err != nil {
				t.Fatal(err)
			}
			if u.EnvironmentFile != "/etc/atoll/"+tt.env {
				t.Errorf("EnvironmentFile=%s, want /etc/atoll/%s", u.EnvironmentFile, tt.env)
			}
			env, err := deploy.ReadHostEnv(tt.env)
			if err != nil {
				t.Fatal(err)
			}
			t.Setenv("NODE_NAME", "")
			for _, kv := range env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			if u.Exec[0] != "/usr/local/bin/atoll-edge" {
				t.Fatalf("ExecStart runs %s", u.Exec[0])
			}
			if len(u.Exec) > 1 && u.Exec[1] == "local-api" {
				fs, cfg, _, _ := localAPIFlags()
				if err := fs.Parse(u.Exec[2:]); err != nil {
					t.Fatal(err)
				}
				if err := cliflags.FromEnv(fs, "ATOLL_"); err != nil {
					t.Fatal(err)
				}
				// The node's files (kubeadm's paths), here stand-ins.
				if cfg.CAFile != "/etc/kubernetes/pki/ca.crt" || cfg.CertFile != "/var/lib/kubelet/pki/kubelet-client-current.pem" {
					t.Errorf("the unit reads the CA from %s and the node's certificate from %s, not kubeadm's paths", cfg.CAFile, cfg.CertFile)
				}
				stand := filepath.Join(t.TempDir(), "file")
				if err := os.WriteFile(stand, nil, 0o600); err != nil {
					t.Fatal(err)
				}
				cfg.CAFile, cfg.CertFile, cfg.KeyFile = stand, stand, stand
				if err := cfg.Validate(); err != nil {
					t.Fatal(err)
				}
				return
			}
			cfg := edgeapp.Default()
			fs := flag.NewFlagSet(prog, flag.ContinueOnError)
			cfg.RegisterFlags(fs)
			if err := fs.Parse(u.Exec[1:]); err != nil {
				t.Fatal(err)
			}
			if err := cliflags.FromEnv(fs, "ATOLL_"); err != nil {
				t.Fatal(err)
			}
			cfg.Finish()
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			if cfg.NATS.NodeName != "edge-1" {
				t.Errorf("node name %q from the environment file, want edge-1", cfg.NATS.NodeName)
			}
		})
	}
}
