// Package natstest starts real Atoll NATS fabrics for tests: an embedded
// hub or a cluster of three hub servers (HubCluster, which can kill and
// restart a server), edge servers grouped into units, and a fault-injecting
// TCP proxy to cut links. Everything listens on random loopback ports and is cleaned up
// with the test.
package natstest

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/edge/natsnode"
)

// Logger returns a slog logger writing to t.Log at level and above; it
// goes quiet once the test has finished.
func Logger(t testing.TB, level slog.Level) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

type testWriter struct {
	t    testing.TB
	mu   sync.Mutex
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Helper()
		w.t.Log(string(p[:len(p)-1]))
	}
	return len(p), nil
}

// Hub starts a hub with JetStream in t.TempDir() on random loopback ports.
func Hub(t testing.TB, mutate ...func(*hub.Config)) *hub.Hub {
	t.Helper()
	cfg := hub.Default()
	cfg.Host = "127.0.0.1"
	cfg.ClientPort, cfg.LeafPort = -1, -1
	cfg.StoreDir = t.TempDir()
	for _, m := range mutate {
		m(&cfg)
	}
	h, err := hub.New(cfg, Logger(t, slog.LevelWarn))
	if err != nil {
		t.Fatalf("hub: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.Start(ctx); err != nil {
		t.Fatalf("start hub: %v", err)
	}
	t.Cleanup(func() { _ = h.Shutdown(context.Background()) })
	return h
}

// HubServers is a hub an edge server can join: one server (*hub.Hub) or
// a cluster (*HubCluster).
type HubServers interface {
	// IssueEdge issues the user JWT of node in unit (empty: none yet)
	// for its nkey public key pub.
	IssueEdge(node, unit, pub string) (string, error)
	// LeafURLs are the servers' leaf URLs.
	LeafURLs() []string
}

// EdgeOptions tune Edge.
type EdgeOptions struct {
	// HubURL overrides the hub's leaf URL (e.g. a Proxy in front of it).
	HubURL string
	// HubCAFile makes the leaf link TLS, verified against these CAs.
	HubCAFile string
	// HubServerName is the name the hub's certificate must carry (empty:
	// the host dialed).
	HubServerName string
	// HubCompression is the leaf link's compression (natsnode.Config;
	// empty: the default).
	HubCompression string
	// Unit is the unit the node's credentials are scoped to (Unit sets
	// it; empty: none).
	Unit string
	// Seed and UserJWT, when set, are the node's credentials (nothing is
	// issued).
	Seed, UserJWT string
	// Logger receives the server's log (default: t.Log at warn and above).
	Logger *slog.Logger
}

// Edge issues node's credentials with h and starts its edge server on random loopback
// ports, with a leaf remote to every server of h. The server is in no unit
// until SetMesh (see Unit).
func Edge(t testing.TB, h HubServers, node string, o EdgeOptions) *natsnode.Node {
	t.Helper()
	seed, userJWT := []byte(o.Seed), o.UserJWT
	if o.Seed == "" {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		seed, _ = kp.Seed()
		pub, _ := kp.PublicKey()
		if userJWT, err = h.IssueEdge(node, o.Unit, pub); err != nil {
			t.Fatalf("enroll %s: %v", node, err)
		}
	}
	cfg := natsnode.Default()
	cfg.NodeName = node
	cfg.ClientPort, cfg.RoutePort = -1, -1
	cfg.RouteHost = "127.0.0.1"
	cfg.Seed, cfg.UserJWT = string(seed), userJWT
	cfg.HubURLs = h.LeafURLs()
	cfg.HubCAFile, cfg.HubServerName = o.HubCAFile, o.HubServerName
	if o.HubCompression != "" {
		cfg.HubCompression = o.HubCompression
	}
	if o.HubURL != "" {
		cfg.HubURLs = []string{o.HubURL}
	}
	log := o.Logger
	if log == nil {
		log = Logger(t, slog.LevelWarn)
	}
	n, err := natsnode.New(cfg, log)
	if err != nil {
		t.Fatalf("edge %s: %v", node, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := n.Start(ctx); err != nil {
		t.Fatalf("start edge %s: %v", node, err)
	}
	t.Cleanup(func() { _ = n.Shutdown(context.Background()) })
	return n
}

// Unit starts one edge server per node name and meshes them as unit.
func Unit(t testing.TB, h HubServers, unit string, o EdgeOptions, nodes ...string) []*natsnode.Node {
	t.Helper()
	out := make([]*natsnode.Node, 0, len(nodes))
	o.Unit = unit
	for _, name := range nodes {
		out = append(out, Edge(t, h, name, o))
	}
	// Every server first accepts the unit's route credentials, then
	// dials its peers: a server that dialed a peer still on its solo
	// credentials would be refused (an authentication error in the log).
	creds := MeshOf(unit)
	for _, n := range out {
		if err := n.SetMesh(creds); err != nil {
			t.Fatalf("unit %s credentials on %s: %v", unit, n.Name(), err)
		}
	}
	SetMesh(t, unit, out...)
	return out
}

// MeshOf returns the mesh in which exactly nodes form unit.
func MeshOf(unit string, nodes ...*natsnode.Node) natsnode.Mesh {
	m := natsnode.Mesh{Unit: unit, User: "route-" + unit, Password: "secret-" + unit}
	for _, n := range nodes {
		m.Peers = append(m.Peers, natsnode.Peer{Name: n.Name(), RouteURL: n.RouteURL()})
	}
	return m
}

// SetMesh gives every node the mesh of unit made of nodes.
func SetMesh(t testing.TB, unit string, nodes ...*natsnode.Node) {
	t.Helper()
	m := MeshOf(unit, nodes...)
	for _, n := range nodes {
		if err := n.SetMesh(m); err != nil {
			t.Fatalf("mesh %s on %s: %v", unit, n.Name(), err)
		}
	}
}

// Buffer is a bytes.Buffer safe for one writer goroutine and concurrent
// readers, for capturing a command's output while a test polls it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }

// String returns everything written so far.
func (s *Buffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// Creds writes a NATS credentials file for a new user of h's keys issued
// by issue (e.g. an operator's), in t.TempDir(), and returns its path.
func Creds(t testing.TB, issuer *identity.Issuer, issue func(i *identity.Issuer, pub string) (string, error)) string {
	t.Helper()
	path, err := WriteCreds(t.TempDir(), issuer, issue)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// OperatorCreds writes the credentials of a human operator of h.
func OperatorCreds(t testing.TB, issuer *identity.Issuer) string {
	return Creds(t, issuer, func(i *identity.Issuer, pub string) (string, error) { return i.Operator("ops", pub, 0) })
}

// WriteCreds is Creds without a test: the file user.creds in dir.
func WriteCreds(dir string, issuer *identity.Issuer, issue func(i *identity.Issuer, pub string) (string, error)) (string, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", err
	}
	pub, _ := kp.PublicKey()
	userJWT, err := issue(issuer, pub)
	if err != nil {
		return "", err
	}
	data, err := identity.FormatCreds(userJWT, kp)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "user.creds")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return "", err
	}
	return path, nil
}

// The hub the harness starts (cloud/hub), named for the tests of the
// edge, which never import the cloud themselves.
type (
	// HubServer is a hub server (Hub, RestartableHub.Hub).
	HubServer = hub.Hub
	// HubConfig is a hub server's configuration, for Hub's mutators.
	HubConfig = hub.Config
	// HubTLS is a hub listener's certificate and key files.
	HubTLS = hub.TLSFiles
)

// EdgeServer is an edge node's NATS server (edge/natsnode), as Edge and
// Unit start it.
type EdgeServer = natsnode.Node
