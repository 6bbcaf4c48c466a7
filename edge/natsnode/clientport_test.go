package natsnode_test

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/test/natstest"
)

func clientPortNode(t *testing.T, port int) (*natsnode.Node, error) {
	t.Helper()
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	cfg := natsnode.Default()
	cfg.NodeName = "n1"
	cfg.Seed = string(seed)
	cfg.HubURLs = []string{"nats-leaf://127.0.0.1:1"}
	cfg.ClientPort, cfg.RoutePort, cfg.RouteHost = port, -1, "127.0.0.1"
	n, err := natsnode.New(cfg, natstest.Logger(t, slog.LevelError+1))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t.Cleanup(func() { _ = n.Shutdown(context.Background()) })
	return n, n.Start(ctx)
}

// TestClientPortInUseFailsTheStart: a client port held by another process
// fails the start at once with the listener's error, rather than a
// server running on without it and a start that times out.
func TestClientPortInUseFailsTheStart(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	port := busy.Addr().(*net.TCPAddr).Port
	start := time.Now()
	_, err = clientPortNode(t, port)
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:"+strconv.Itoa(port)) || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("start with the client port in use: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v to fail", d)
	}
}

// TestClientPortZeroIsRejected: port 0 would silently mean nats-server's
// default 4222; the configuration names the field instead.
func TestClientPortZeroIsRejected(t *testing.T) {
	cfg := natsnode.Default()
	cfg.NodeName, cfg.HubURLs, cfg.ClientPort = "n1", []string{"nats-leaf://127.0.0.1:1"}, 0
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "client port 0") {
		t.Fatalf("Validate: %v", err)
	}
}
