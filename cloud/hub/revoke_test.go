package hub_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/internal/testenv/natstest"
	"github.com/atoll-edge/atoll/internal/testenv/poll"
)

// edgeKey is a fresh edge identity.
func edgeKey(t *testing.T) (seed, pub string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	s, _ := kp.Seed()
	p, _ := kp.PublicKey()
	return string(s), p
}

// startEdge runs a real edge server named node with seed, leafed to h.
func startEdge(t *testing.T, h *hub.Hub, node, seed string) *natsnode.Node {
	t.Helper()
	cfg := natsnode.Default()
	cfg.NodeName = node
	cfg.ClientPort, cfg.RoutePort = -1, -1
	cfg.RouteHost = "127.0.0.1"
	cfg.Seed = seed
	cfg.HubURLs = h.LeafURLs()
	n, err := natsnode.New(cfg, natstest.Logger(t, slog.LevelError))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown(context.Background()) })
	return n
}

// leafNames are the server names of h's live leaf connections.
func leafNames(t *testing.T, h *hub.Hub) map[string]int {
	t.Helper()
	lz, err := h.Server().Leafz(&server.LeafzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, l := range lz.Leafs {
		out[l.Name]++
	}
	return out
}

func waitLinked(t *testing.T, h *hub.Hub, want map[string]bool) {
	t.Helper()
	poll.Eventually(t, 10*time.Second, func() error {
		got := leafNames(t, h)
		for node, up := range want {
			if (got[node] > 0) != up {
				return fmt.Errorf("%s linked = %v, want %v (leafs %v)", node, got[node] > 0, up, got)
			}
		}
		return nil
	})
}

// staysOut fails if node gets a leaf link again within several of its
// reconnect intervals (one second each).
func staysOut(t *testing.T, h *hub.Hub, n *natsnode.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3500*time.Millisecond)
	defer cancel()
	_ = poll.Until(ctx, func(context.Context) error {
		if leafNames(t, h)[n.Name()] > 0 || n.Status().HubConnected {
			t.Fatalf("revoked edge %s reconnected", n.Name())
		}
		return fmt.Errorf("watching")
	})
}

// TestRemoveEdgeClosesLiveLink: revoking an edge closes its live leaf
// connection within seconds and refuses its reconnects; other edges keep
// their links.
func TestRemoveEdgeClosesLiveLink(t *testing.T) {
	h := natstest.Hub(t)
	seed1, pub1 := edgeKey(t)
	seed2, pub2 := edgeKey(t)
	for node, pub := range map[string]string{"e1": pub1, "e2": pub2} {
		if err := h.AddEdge(node, pub); err != nil {
			t.Fatal(err)
		}
	}
	e1 := startEdge(t, h, "e1", seed1)
	startEdge(t, h, "e2", seed2)
	waitLinked(t, h, map[string]bool{"e1": true, "e2": true})

	start := time.Now()
	h.Identities().RemoveEdge("e1")
	waitLinked(t, h, map[string]bool{"e1": false, "e2": true})
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("link closed %v after revocation, want within 5s", d)
	}
	staysOut(t, h, e1)
	waitLinked(t, h, map[string]bool{"e2": true})
}

// TestReKeyClosesOldLink: re-enrolling a node with another key closes the
// link opened with the old key.
func TestReKeyClosesOldLink(t *testing.T) {
	h := natstest.Hub(t)
	seed1, pub1 := edgeKey(t)
	_, pubNew := edgeKey(t)
	if err := h.AddEdge("e1", pub1); err != nil {
		t.Fatal(err)
	}
	e1 := startEdge(t, h, "e1", seed1)
	waitLinked(t, h, map[string]bool{"e1": true})
	if err := h.AddEdge("e1", pubNew); err != nil {
		t.Fatal(err)
	}
	waitLinked(t, h, map[string]bool{"e1": false})
	staysOut(t, h, e1)
}

// TestEdgeKeysFileRevocation: removing a node from the edge keys file
// (as an operator edits the mounted ConfigMap) revokes it at the next
// reload and closes its link; adding it back lets it in again.
func TestEdgeKeysFileRevocation(t *testing.T) {
	seed1, pub1 := edgeKey(t)
	seed2, pub2 := edgeKey(t)
	file := filepath.Join(t.TempDir(), "edge-keys.yaml")
	write := func(keys map[string]string) {
		t.Helper()
		var b []byte
		for n, k := range keys {
			b = append(b, fmt.Sprintf("%s: %s\n", n, k)...)
		}
		// Replace the file in one step, as a ConfigMap update does.
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write(map[string]string{"e1": pub1, "e2": pub2})
	h := natstest.Hub(t, func(c *hub.Config) {
		c.EdgeKeysFile = file
		c.EdgeKeysReload = 200 * time.Millisecond
	})
	e1 := startEdge(t, h, "e1", seed1)
	startEdge(t, h, "e2", seed2)
	waitLinked(t, h, map[string]bool{"e1": true, "e2": true})

	write(map[string]string{"e2": pub2})
	waitLinked(t, h, map[string]bool{"e1": false, "e2": true})
	staysOut(t, h, e1)

	write(map[string]string{"e1": pub1, "e2": pub2})
	waitLinked(t, h, map[string]bool{"e1": true, "e2": true})
}

func TestEdgeKeysReloadValidated(t *testing.T) {
	c := hub.Default()
	c.EdgeKeysFile = "/etc/atoll/edge-keys.yaml"
	c.EdgeKeysReload = 0
	if err := c.Validate(); err == nil {
		t.Fatal("accepted an edge keys file with no reload interval")
	}
}

// TestSuspendedEdgeIsRefused: a suspended edge keeps its key but is
// refused and cut; Resume lets it in again without re-enrollment.
func TestSuspendedEdgeIsRefused(t *testing.T) {
	h := natstest.Hub(t)
	seed, pub := edgeKey(t)
	if err := h.AddEdge("e1", pub); err != nil {
		t.Fatal(err)
	}
	e1 := startEdge(t, h, "e1", seed)
	waitLinked(t, h, map[string]bool{"e1": true})
	h.Identities().Suspend("e1")
	waitLinked(t, h, map[string]bool{"e1": false})
	staysOut(t, h, e1)
	h.Identities().Resume("e1")
	waitLinked(t, h, map[string]bool{"e1": true})
}
