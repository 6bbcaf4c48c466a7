package main

import (
	"flag"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"
	"go.uber.org/fx/fxtest"

	"github.com/atoll-edge/atoll/edge/edgeapp"
	"github.com/atoll-edge/atoll/internal/testenv/natstest"
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
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	seedFile := filepath.Join(t.TempDir(), "node.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NODE_NAME", "edge-1")
	cfg := edgeapp.Default()
	fs := flag.NewFlagSet("atoll-edge", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	err := fs.Parse([]string{"--admin-addr=127.0.0.1:0", "--hub-url=nats-leaf://127.0.0.1:1", "--seed-file=" + seedFile,
		"--client-port=-1", "--route-host=127.0.0.1", "--route-port=-1", "--state-dir=" + t.TempDir(), "--unit=u1"})
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
		{[]string{"--node-name=n"}, "no hub URL"},
		{[]string{"--node-name=n", "--hub-url=nats-leaf://h:7422", "--client-host=0.0.0.0"}, "loopback"},
		{[]string{"--node-name=n", "--hub-url=nats-leaf://h:7422", "--internal-ip=x"}, "internal IP"},
		{[]string{"--node-name=n", "--hub-url=nats-leaf://h:7422", "--unit=a b"}, "unit"},
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
