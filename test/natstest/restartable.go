package natstest

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atoll-edge/atoll/cloud/hub"
)

// RestartableHub is one hub server on fixed ports with a file store, that
// a test stops and starts again like a restarted process: the edges' leaf
// links reconnect to the same URL, the streams come back from disk, and
// credentials issued before stay valid (the identity keys live in the
// store directory). It implements HubServers.
type RestartableHub struct {
	t   testing.TB
	cfg hub.Config

	mu sync.Mutex
	h  *hub.Hub
}

// NewRestartableHub starts a restartable hub, stopped at the test's end.
func NewRestartableHub(t testing.TB) *RestartableHub {
	t.Helper()
	cfg := hub.Default()
	cfg.Host = "127.0.0.1"
	var err error
	if cfg.ClientPort, err = FreePort(); err != nil {
		t.Fatal(err)
	}
	if cfg.LeafPort, err = FreePort(); err != nil {
		t.Fatal(err)
	}
	cfg.StoreDir = t.TempDir()
	r := &RestartableHub{t: t, cfg: cfg}
	r.Start()
	t.Cleanup(r.Stop)
	return r
}

// Start starts the hub again (it is started by NewRestartableHub).
func (r *RestartableHub) Start() {
	r.t.Helper()
	h, err := hub.New(r.cfg, Logger(r.t, slog.LevelError))
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.Start(ctx); err != nil {
		r.t.Fatalf("start hub: %v", err)
	}
	r.mu.Lock()
	r.h = h
	r.mu.Unlock()
}

// Stop shuts the hub down, as a stopped process.
func (r *RestartableHub) Stop() {
	r.mu.Lock()
	h := r.h
	r.h = nil
	r.mu.Unlock()
	if h != nil {
		_ = h.Shutdown(context.Background())
	}
}

// Hub is the running server (nil while stopped).
func (r *RestartableHub) Hub() *hub.Hub {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.h
}

// Domain is the hub's JetStream domain.
func (r *RestartableHub) Domain() string { return r.cfg.Domain }

// IssueEdge issues node's credentials.
func (r *RestartableHub) IssueEdge(node, unit, pub string) (string, error) {
	return r.Hub().IssueEdge(node, unit, pub)
}

// LeafURLs are the hub's leaf URLs.
func (r *RestartableHub) LeafURLs() []string { return r.Hub().LeafURLs() }

// Connect is a cloud client of the running hub and its JetStream, closed
// at the test's end.
func (r *RestartableHub) Connect(t testing.TB, name string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := r.Hub().Connect(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, r.cfg.Domain)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}
