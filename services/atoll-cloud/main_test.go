package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/atoll-edge/atoll/cloud/cloudapp"
	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/test/natstest"
)

func TestAppStartsAndStops(t *testing.T) {
	cfg := cloudapp.Default()
	fs := flag.NewFlagSet("atoll-cloud", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	store := t.TempDir()
	t.Setenv("ATOLL_HUB_STORE_DIR", store)
	if err := fs.Parse([]string{"--admin-addr=127.0.0.1:0", "--hub-host=127.0.0.1", "--hub-client-port=-1", "--hub-leaf-port=-1", "--membership-source=declared"}); err != nil {
		t.Fatal(err)
	}
	if err := setup(fs, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Hub.StoreDir != store {
		t.Fatalf("store dir %q not taken from the environment", cfg.Hub.StoreDir)
	}
	fxtest.New(t, cloudapp.Options(cfg, natstest.Logger(t, slog.LevelWarn))).RequireStart().RequireStop()
}

func TestBadConfigNamesTheField(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--hub-leaf-port=70000"}, "leaf port"},
		{[]string{"--stream-replicas=0"}, "stream replicas"},
		{[]string{"--admin-addr=nonsense"}, "admin: addr"},
		{[]string{"--admin-addr=:8080"}, "needs authentication, a bearer token file (--admin-token-file) or mutual TLS"},
		{[]string{"--admin-addr=:8080", "--admin-client-ca=ca.crt"}, "admin: TLS needs a certificate and key"},
		{[]string{"--hub-url=nats://hub:4222"}, "needs --identity-dir"},
		{[]string{"--edge-creds-ttl=1s"}, "edge credentials TTL"},
		{[]string{"--membership-source=guess"}, "source"},
		{[]string{"--webhook-certs=dir", "--webhook-cert-dir="}, "cert dir"},
		{[]string{"--webhook-certs=self-signed"}, "webhook: certs"},
		{[]string{"--hub-url=nats://hub:4222", "--hub-store-dir=/data"}, "--hub-store-dir configures the embedded hub"},
		{[]string{"--hub-url=nats://hub:4222", "--hub-routes=nats-route://a:6222"}, "--hub-routes configures the embedded hub"},
		{[]string{"--hub-creds-file=/etc/atoll/cloud.creds"}, "--hub-creds-file applies to an external hub and needs --hub-url"},
		{[]string{"--hub-url=http://hub:4222"}, "scheme must be nats or tls"},
		{[]string{"--hub-url=nats://u:p@hub:4222"}, "credentials belong in"},
		{[]string{"--hub-url=nats://hub:4222", "--hub-tls-cert=c.pem"}, "certificate and key"},
		{[]string{"--hub-domain=a.b"}, "hub domain"},
		{[]string{"--hub-cluster-port=6222", "--hub-routes=http://a"}, "cluster route"},
		{[]string{"--tunnel-connect-addr=nonsense"}, "tunnel: ConnectAddr"},
		{[]string{"--tunnel-connect-addr=:8132"}, "needs mutual TLS (--tunnel-connect-tls-cert, --tunnel-connect-tls-key and --tunnel-connect-client-ca)"},
		{[]string{"--tunnel-connect-addr=:8132", "--tunnel-connect-tls-cert=/nonexistent/tls.crt", "--tunnel-connect-tls-key=/nonexistent/tls.key", "--tunnel-connect-client-ca=/nonexistent/ca.crt"}, "ConnectTLS.CertFile (--tunnel-connect-tls-cert): open /nonexistent/tls.crt"},
		{[]string{"--tunnel-forward=127.0.0.1:9100=a*b/127.0.0.1:9100"}, "tunnel: Forwards[0].Node"},
		{[]string{"--cluster-domain=.cluster.local"}, "hostrecords: ClusterDomain"},
		{[]string{"--hub-leaf-certs=self-signed"}, `hub leaf certs: "self-signed"`},
		{[]string{"--hub-leaf-certs=generate", "--hub-leaf-tls-cert=c.pem", "--hub-leaf-tls-key=k.pem"}, "generate and --hub-leaf-tls-cert/--hub-leaf-tls-key are exclusive"},
		{[]string{"--hub-leaf-certs=generate", "--membership-source=declared"}, "needs the kubernetes membership source"},
		{[]string{"--hub-leaf-tls-hosts=hub.example"}, "add --hub-leaf-certs=generate"},
		{[]string{"--hub-url=nats://hub:4222", "--identity-dir=id", "--identity-secret-name=atoll-cloud-identity"}, "with --hub-url mount the Secret at --identity-dir"},
		{[]string{"--identity-secret-name=atoll-cloud-identity", "--membership-source=declared"}, "--identity-secret-name needs the kubernetes membership source"},
		{[]string{"--identity-secret-name=Identity_Keys"}, `"Identity_Keys" is not a Secret name`},
		{[]string{"--hub-url=nats://hub:4222", "--hub-leaf-tls-cert=c.pem", "--hub-leaf-tls-key=k.pem"}, "--hub-leaf-tls-cert configures the embedded hub"},
		{[]string{"--hub-url=nats://hub:4222", "--identity-dir=id", "--hub-leaf-certs=generate", "--membership-source=declared"}, "generate keeps the certificates in a Secret"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			cfg := cloudapp.Default()
			fs := flag.NewFlagSet("atoll-cloud", flag.ContinueOnError)
			cfg.RegisterFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			err := setup(fs, &cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("setup(%v) = %v, want an error about %q", tt.args, err, tt.want)
			}
		})
	}
}

// TestTunnelServerStartsAndStops: with a CONNECT listener and a forward,
// the app starts (listening) and stops (closing them).
func TestTunnelServerStartsAndStops(t *testing.T) {
	startApp(t, "--hub-host=127.0.0.1", "--hub-client-port=-1", "--hub-leaf-port=-1",
		"--tunnel-connect-addr=127.0.0.1:0", "--tunnel-forward=127.0.0.1:0=edge-1/127.0.0.1:9100").RequireStop()
}

// startApp runs atoll-cloud with args (declared membership: no Kubernetes)
// until the test ends.
func startApp(t *testing.T, args ...string) *fxtest.App {
	t.Helper()
	cfg := cloudapp.Default()
	fs := flag.NewFlagSet("atoll-cloud", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse(append([]string{"--admin-addr=127.0.0.1:0", "--membership-source=declared"}, args...)); err != nil {
		t.Fatal(err)
	}
	if err := setup(fs, &cfg); err != nil {
		t.Fatal(err)
	}
	return fxtest.New(t, cloudapp.Options(cfg, natstest.Logger(t, slog.LevelWarn))).RequireStart()
}

// TestExternalHubCluster: atoll-cloud dials a hub cluster it does not run
// (--hub-url with every server, the identity keys it trusts), and a restart with
// other stream settings updates the streams in place: R1 → R3 and a new
// size cap.
func TestExternalHubCluster(t *testing.T) {
	c := natstest.NewHubCluster(t)
	hubArgs := []string{"--hub-url=" + strings.Join(c.ClientURLs(), ","), "--identity-dir=" + c.IdentityDir()}
	startApp(t, append(hubArgs, "--stream-replicas=1")...).RequireStop()

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	log := natstest.Logger(t, slog.LevelWarn)
	link := hublink.New(c.Domain(), c.ClientConfig().Dialer("observer", log), log)
	if err := link.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = link.Stop(context.Background()) }()
	config := func() jetstream.StreamConfig {
		s, err := link.JetStream().Stream(ctx, events.StreamHealth)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config
	}
	if got := config(); got.Replicas != 1 || got.MaxBytes != -1 {
		t.Fatalf("first start: replicas %d, max bytes %d; want 1, -1", got.Replicas, got.MaxBytes)
	}
	startApp(t, append(hubArgs, "--stream-replicas=3", "--stream-max-bytes=67108864")...).RequireStop()
	if got := config(); got.Replicas != 3 || got.MaxBytes != 64<<20 {
		t.Fatalf("after restart: replicas %d, max bytes %d; want 3, %d", got.Replicas, got.MaxBytes, 64<<20)
	}
}

// TestExternalHubCreds: a credentials file login works as well, and one
// another installation issued fails the start naming the hub's answer.
func TestExternalHubCreds(t *testing.T) {
	c := natstest.NewHubCluster(t)
	svc := func(i *identity.Issuer, pub string) (string, error) { return i.Service("cloud", pub) }
	good := natstest.Creds(t, c.Issuer(), svc)
	hubArgs := []string{"--hub-url=" + strings.Join(c.ClientURLs(), ","), "--identity-dir=" + c.IdentityDir()}
	startApp(t, append(hubArgs, "--hub-creds-file="+good)...).RequireStop()

	bad := natstest.Creds(t, natstest.Hub(t).Issuer(), svc)
	cfg := cloudapp.Default()
	fs := flag.NewFlagSet("atoll-cloud", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	_ = fs.Parse(append(hubArgs, "--admin-addr=127.0.0.1:0", "--membership-source=declared", "--hub-creds-file="+bad))
	if err := setup(fs, &cfg); err != nil {
		t.Fatal(err)
	}
	app := fx.New(cloudapp.Options(cfg, natstest.Logger(t, slog.LevelWarn)), fx.StartTimeout(5*time.Second))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	err := app.Start(ctx)
	if err == nil {
		_ = app.Stop(context.Background())
		t.Fatal("started with foreign credentials")
	}
	if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("start error %q does not say why", err)
	}
}

// TestHubTrust: hub-trust creates the identity keys once and prints a
// nats-server configuration that trusts them; a second run prints the
// same trust.
func TestHubTrust(t *testing.T) {
	dir := t.TempDir()
	var a, b bytes.Buffer
	if err := run(t.Context(), []string{"hub-trust", "--identity-dir=" + dir, "--resolver-dir=/data/jwt"}, &a, io.Discard); err != nil {
		t.Fatal(err)
	}
	if err := run(t.Context(), []string{"hub-trust", "--identity-dir=" + dir, "--resolver-dir=/data/jwt"}, &b, io.Discard); err != nil {
		t.Fatal(err)
	}
	if a.String() != b.String() {
		t.Error("a second run changed the trust")
	}
	for _, want := range []string{"operator:", "system_account:", "resolver: { type: full", "resolver_preload:"} {
		if !strings.Contains(a.String(), want) {
			t.Errorf("trust lacks %q:\n%s", want, a.String())
		}
	}
}

// TestOperatorCreds: operator-creds issues an operator's credentials with
// existing identity keys, with its name and lifetime, and refuses to
// invent keys. (test/integration/install logs in with them.)
func TestOperatorCreds(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	err := run(t.Context(), []string{"operator-creds", "--identity-dir=" + dir}, &out, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "identity keys") {
		t.Fatalf("operator-creds without keys: %v, want an error naming the identity keys", err)
	}
	if _, _, err := identity.Setup(dir); err != nil {
		t.Fatal(err)
	}
	if err := run(t.Context(), []string{"operator-creds", "--identity-dir=" + dir, "--name=alice", "--ttl=1h"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	userJWT, err := jwt.ParseDecoratedJWT(out.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	claims, err := jwt.DecodeUserClaims(userJWT)
	if err != nil {
		t.Fatal(err)
	}
	if claims.Name != "operator:alice" || claims.Expires == 0 || time.Until(time.Unix(claims.Expires, 0)) > time.Hour {
		t.Errorf("claims: name %q, expires %d; want operator:alice within 1h", claims.Name, claims.Expires)
	}
	if _, err := jwt.ParseDecoratedUserNKey(out.Bytes()); err != nil {
		t.Errorf("no nkey seed: %v", err)
	}
}
