package fabric_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/natsembed"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// externalHub starts one stock nats-server from the nats.conf of
// deploy/overlays/external-nats/hub-external.yaml (listeners moved to
// random loopback ports, no routes) with the trust.conf of `atoll-cloud
// hub-trust` as the manifest's header describes: the servers trust the
// identity keys of issuer. mutate changes the options read from it.
func externalHub(t *testing.T, trust identity.Trust, mutate ...func(*server.Options)) (*server.Server, natstest.TLSFiles) {
	t.Helper()
	conf, err := natstest.ExternalHubConf("../../../deploy/overlays/external-nats/hub-external.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	auth := filepath.Join(dir, "auth")
	if err := os.MkdirAll(auth, 0o700); err != nil {
		t.Fatal(err)
	}
	// The pod's mounts, here: the leaf certificate atoll-cloud generates
	// (a test CA's), the pid file's emptyDir.
	leafTLS := natstest.NewTLS(t, dir, "leaf")
	conf = strings.NewReplacer("/etc/nats/leaf-tls/tls.crt", leafTLS.CertFile, "/etc/nats/leaf-tls/tls.key", leafTLS.KeyFile,
		"/var/run/nats/", dir+"/").Replace(conf)
	files := map[string]string{
		filepath.Join(dir, "nats.conf"):   conf,
		filepath.Join(auth, "trust.conf"): trust.ServerConfig(filepath.Join(dir, "data", "jwt")),
		filepath.Join(auth, "cluster.conf"): `authorization { user: route, password: "pw" }
routes: [nats-route://route:pw@127.0.0.1:1]
`,
	}
	for name, body := range files {
		if err := os.WriteFile(name, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("POD_NAME", "atoll-hub-0")
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "nats.conf"))
	if err != nil {
		t.Fatalf("nats.conf of hub-external.yaml: %v", err)
	}
	if opts.JetStreamDomain != hublink.DefaultDomain || opts.Cluster.Name != "atoll-hub" || len(opts.Routes) != 1 {
		t.Fatalf("nats.conf: domain %q, cluster %q, routes %v", opts.JetStreamDomain, opts.Cluster.Name, opts.Routes)
	}
	if !opts.LeafNode.IsolateLeafnodeInterest {
		t.Fatal("nats.conf: leafnodes do not isolate_leafnode_interest (the hub's memory grows with leafs²)")
	}
	if opts.LeafNode.TLSConfig == nil {
		t.Fatal("nats.conf: the leaf listener does not require TLS")
	}
	if hs, auth := opts.LeafNode.TLSTimeout, opts.LeafNode.AuthTimeout; hs != hub.LeafTLSTimeout.Seconds() || auth != hub.LeafAuthTimeout.Seconds() {
		t.Fatalf("nats.conf: leaf TLS and authentication timeouts %vs and %vs, want the embedded hub's %s and %s (a restarted hub's edges all link again at once)",
			hs, auth, hub.LeafTLSTimeout, hub.LeafAuthTimeout)
	}
	// One server on loopback: no cluster, random ports, a temp store.
	opts.Cluster, opts.Routes = server.ClusterOpts{}, nil
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.LeafNode.Host, opts.LeafNode.Port = "127.0.0.1", -1
	opts.StoreDir = filepath.Join(dir, "data")
	opts.NoSigs = true
	for _, m := range mutate {
		m(opts)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := natsembed.Start(ctx, srv, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv, leafTLS
}

// TestExternalHubManifest: the hub of
// deploy/overlays/external-nats/hub-external.yaml, stock
// nats-server trusting atoll-cloud's identity keys, takes atoll-cloud (a
// service JWT it issued itself, streams reconciled in domain hub) and an
// edge node's leaf link over TLS (the leaf listener's certificate files
// as the pods mount them), whose credentials cannot be used as a plain
// client; the edge publishes into the hub's streams.
func TestExternalHubManifest(t *testing.T) {
	keys, trust, err := identity.Setup(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	issuer := identity.NewIssuer(keys, hublink.DefaultDomain)
	srv, leafTLS := externalHub(t, trust)
	log := natstest.Logger(t, slog.LevelWarn)

	cloudKey, _ := nkeys.CreateUser()
	cloudPub, _ := cloudKey.PublicKey()
	cloudJWT, err := issuer.Service("atoll-cloud", cloudPub)
	if err != nil {
		t.Fatal(err)
	}
	cfg := hublink.ClientConfig{URLs: []string{srv.ClientURL()}, Domain: hublink.DefaultDomain, Nkey: cloudKey, UserJWT: cloudJWT}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	link := hublink.New(cfg.Domain, cfg.Dialer("atoll-cloud", log), log)
	if err := link.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Stop(context.Background()) })
	if err := eventbus.EnsureStreams(ctx, link.JetStream(), events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}

	edgeKey, _ := nkeys.CreateUser()
	edgePub, _ := edgeKey.PublicKey()
	edgeJWT, err := issuer.Edge("e1", "u1", edgePub, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The edge key is leaf-only.
	if nc, err := nats.Connect(srv.ClientURL(), nats.UserJWT(func() (string, error) { return edgeJWT, nil }, edgeKey.Sign), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("an edge key connected as a client")
	}
	edgeSeed, _ := edgeKey.Seed()
	ncfg := natsnode.Default()
	ncfg.NodeName = "e1"
	ncfg.ClientPort, ncfg.RoutePort, ncfg.RouteHost = -1, -1, "127.0.0.1"
	ncfg.Seed, ncfg.UserJWT = string(edgeSeed), edgeJWT
	ncfg.HubCAFile, ncfg.HubServerName = leafTLS.CAFile, "localhost"
	varz, err := srv.Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	ncfg.HubURLs = []string{"nats-leaf://" + net.JoinHostPort("127.0.0.1", fmt.Sprint(varz.LeafNode.Port))}
	node, err := natsnode.New(ncfg, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := node.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Shutdown(context.Background()) })
	nc, err := node.Connect("agent")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ejs, err := jetstream.NewWithDomain(nc, hublink.DefaultDomain)
	if err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 20*time.Second, func() error {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := ejs.Publish(pctx, "atoll.topo.node.e1", []byte("report"))
		return err
	})
	s, err := link.JetStream().Stream(ctx, events.StreamTopology)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("TOPOLOGY holds %d messages, want 1", n)
	}
}
