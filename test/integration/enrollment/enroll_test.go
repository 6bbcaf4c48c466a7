package enrollment_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/edge/enroll"
	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestBootstrapThroughTheLeaf is what atoll-edge --bootstrap-token-file
// does: the node links with the token, generates its key, enrolls over its
// own leaf link, keeps the credentials in its creds file and links with
// them; when the cloud assigns it another unit, it renews into that unit
// and hears it; restarted from the creds file alone, it links again.
func TestBootstrapThroughTheLeaf(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	log := natstest.Logger(t, slog.LevelWarn)
	h := natstest.Hub(t)
	ids, cloud := identityOnHub(ctx, t, h, log, nil, nil)
	js, err := jetstream.NewWithDomain(cloud, h.Domain())
	if err != nil {
		t.Fatal(err)
	}

	// atoll node enroll a --unit u1
	req, _ := json.Marshal(identity.TokenRequest{Node: "a", Unit: "u1", TTL: time.Hour})
	msg, err := cloud.Request(identity.TokenSubject, req, 10*time.Second)
	if err != nil || msg.Header.Get(micro.ErrorHeader) != "" {
		t.Fatalf("token: %v %v", err, msg.Header)
	}
	var tok identity.TokenReply
	if err := json.Unmarshal(msg.Data, &tok); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tokenFile, credsFile := filepath.Join(dir, "token.creds"), filepath.Join(dir, "node.creds")
	if err := os.WriteFile(tokenFile, []byte(tok.Creds), 0o600); err != nil {
		t.Fatal(err)
	}

	var assigned atomic.Pointer[string]
	u1 := "u1"
	assigned.Store(&u1)
	run := func(bootstrap string) *natsnode.Node {
		cfg := nodeConfig("a", h.LeafURLs())
		cfg.CredsFile, cfg.BootstrapFile = credsFile, bootstrap
		n, _ := enrollingNode(ctx, t, log, cfg, enroll.Config{}, func() (string, bool) { return *assigned.Load(), true })
		return n
	}
	linkedAs := func(n *natsnode.Node) {
		t.Helper()
		poll.Eventually(t, 30*time.Second, func() error {
			if _, boot := n.Bootstrapping(); boot {
				return errors.New("still on the bootstrap token")
			}
			if !n.Status().HubConnected {
				return errors.New("not linked")
			}
			return nil
		})
	}

	n := run(tokenFile)
	linkedAs(n)
	if key, ok := ids.NodeKey("a"); !ok || key != n.PublicKey() {
		t.Fatalf("the cloud knows key %q, the node links with %q", key, n.PublicKey())
	}
	if _, err := os.Stat(credsFile); err != nil {
		t.Fatalf("creds file: %v", err)
	}

	// The cloud moves a to u2: the node renews into u2 and hears it.
	subj, _ := events.AssignmentSubject("a")
	if _, err := events.PublishDurable(ctx, js, subj, &atollv1.NodeAssignment{Node: "a", Unit: "u2"}, "a@u2"); err != nil {
		t.Fatal(err)
	}
	u2 := "u2"
	assigned.Store(&u2)
	poll.Eventually(t, 30*time.Second, func() error {
		c, err := jwt.DecodeUserClaims(n.UserJWT())
		if err != nil {
			return err
		}
		if !c.Tags.Contains("unit:u2") {
			return fmt.Errorf("credentials scoped to %v", c.Tags)
		}
		return nil
	})
	agent, err := n.Connect("listener")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(agent.Close)
	got := make(chan string, 16)
	if _, err := agent.Subscribe("atoll.view.>", func(m *nats.Msg) { got <- m.Subject }); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 20*time.Second, func() error {
		_ = cloud.Publish("atoll.view.u2.unit._.u2", nil)
		select {
		case s := <-got:
			if !strings.Contains(s, "u2") {
				return fmt.Errorf("heard %s", s)
			}
			return nil
		case <-time.After(200 * time.Millisecond):
			return errors.New("u2's view not heard")
		}
	})

	// Restarted from the creds file alone.
	if err := n.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	linkedAs(run(""))
}

// identityOnHub runs atoll-cloud's identity service on hub h (its streams
// made first), with metrics m (nil: unregistered) and Kubernetes
// enrollment k (nil: off), and returns it and its connection.
func identityOnHub(ctx context.Context, t *testing.T, h *natstest.HubServer, log *slog.Logger, m *identity.Metrics, k *identity.Kubernetes) (*identity.Service, *nats.Conn) {
	t.Helper()
	cloud, err := h.Connect("cloud")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cloud.Close)
	js, err := jetstream.NewWithDomain(cloud, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	if err := eventbus.EnsureStreams(ctx, js, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	sys, err := identity.DialSystem(ctx, h.ClientConfig(), h.Issuer(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.Close)
	ids, err := identity.NewService(identity.DefaultConfig(), h.Issuer(), cloud, sys, log, m)
	if err != nil {
		t.Fatal(err)
	}
	if k != nil {
		ids.EnrollKubernetes(k)
	}
	if err := ids.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ids.Stop() })
	return ids, cloud
}

// nodeConfig is node's server configuration on loopback, linking to
// leafURLs; the caller sets its credentials.
func nodeConfig(node string, leafURLs []string) natsnode.Config {
	cfg := natsnode.Default()
	cfg.NodeName = node
	cfg.ClientPort, cfg.RoutePort, cfg.RouteHost = -1, -1, "127.0.0.1"
	cfg.HubURLs = leafURLs
	return cfg
}

// enrollingNode runs what atoll-edge runs to enroll: the node's server of
// cfg, the agent's link to it and the enroller of ecfg (its Check and
// RenewAt short unless set), following unit when not nil.
func enrollingNode(ctx context.Context, t *testing.T, log *slog.Logger, cfg natsnode.Config, ecfg enroll.Config, unit func() (string, bool)) (*natsnode.Node, *hublink.Link) {
	t.Helper()
	n, err := natsnode.New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown(context.Background()) })
	link := hublink.New(cfg.HubDomain, func(context.Context) (*nats.Conn, error) { return n.Connect("agent") }, log)
	if err := link.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Stop(context.Background()) })
	if ecfg.Check == 0 {
		ecfg.Check, ecfg.RenewAt = 200*time.Millisecond, 0.9
	}
	e, err := enroll.New(ecfg, n, link, log)
	if err != nil {
		t.Fatal(err)
	}
	if unit != nil {
		e.FollowUnit(unit)
	}
	ectx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = e.Run(ectx) }()
	t.Cleanup(func() { stop(); <-done })
	return n, link
}
