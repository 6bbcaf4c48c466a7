package enrollment_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/cloud/hub"
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

// fabric is a hub shape with atoll-cloud's identity service on it.
type fabric struct {
	ids      *identity.Service
	issuer   *identity.Issuer
	leafURLs []string
	client   hublink.ClientConfig
	cloud    *nats.Conn
}

// IssueEdge enrolls through the identity service, which records the key.
func (f fabric) IssueEdge(node, unit, pub string) (string, error) {
	return f.ids.IssueEdge(context.Background(), node, unit, pub)
}

func (f fabric) LeafURLs() []string { return f.leafURLs }

func start(t *testing.T, shape string, cfg identity.Config) fabric {
	t.Helper()
	var f fabric
	switch shape {
	case "embedded":
		h := natstest.Hub(t)
		f.issuer, f.leafURLs, f.client = h.Issuer(), h.LeafURLs(), h.ClientConfig()
	case "cluster":
		c := natstest.NewHubCluster(t)
		f.issuer, f.leafURLs, f.client = c.Issuer(), c.LeafURLs(), c.ClientConfig()
		cfg.Replicas = 3
	}
	return f.serve(t, cfg, nil)
}

// serve starts the identity service on f's hub, keeping its durable part
// in d (nil: none).
func (f fabric) serve(t *testing.T, cfg identity.Config, d identity.Durable) fabric {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	log := natstest.Logger(t, slog.LevelWarn)
	var err error
	if f.cloud, err = f.client.Dialer("cloud", log)(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.cloud.Close)
	sys, err := identity.DialSystem(ctx, f.client, f.issuer, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.Close)
	if f.ids, err = identity.NewService(cfg, f.issuer, f.cloud, sys, log, nil); err != nil {
		t.Fatal(err)
	}
	if d != nil {
		f.ids.KeepDurable(d)
	}
	poll.Eventually(t, 30*time.Second, func() error { return f.ids.Start(ctx) })
	t.Cleanup(func() { _ = f.ids.Stop() })
	return f
}

func linked(t *testing.T, want bool, n *natsnode.Node, within time.Duration) {
	t.Helper()
	poll.Eventually(t, within, func() error {
		if got := n.Status().HubConnected; got != want {
			return fmt.Errorf("%s linked %v, want %v", n.Name(), got, want)
		}
		return nil
	})
}

// staysOff fails when n links within d.
func staysOff(t *testing.T, n *natsnode.Node, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if n.Status().HubConnected {
			t.Fatalf("%s linked again", n.Name())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var shapes = []string{"embedded", "cluster"}

// TestRevoke: atoll node revoke (the revoke endpoint, called with an
// operator's credentials) closes the node's live leaf within seconds on
// every hub shape, and the node cannot link again; its unit peer keeps
// its link.
func TestRevoke(t *testing.T) {
	for _, shape := range shapes {
		t.Run(shape, func(t *testing.T) {
			f := start(t, shape, identity.DefaultConfig())
			nodes := natstest.Unit(t, f, "u1", natstest.EdgeOptions{}, "a", "b")
			linked(t, true, nodes[0], 20*time.Second)
			linked(t, true, nodes[1], 20*time.Second)
			if _, ok := f.ids.NodeKey("a"); !ok {
				t.Fatal("no key recorded for a")
			}
			// Unit views follow key changes (topology.NodeKeys).
			var notified atomic.Int32
			f.ids.NotifyKeys(func() { notified.Add(1) })

			ops, err := nats.Connect(f.client.URLs[0], nats.UserCredentials(natstest.OperatorCreds(t, f.issuer)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(ops.Close)
			req, _ := json.Marshal(identity.RevokeRequest{Node: "a"})
			start := time.Now()
			msg, err := ops.Request(identity.RevokeSubject, req, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if e := msg.Header.Get(micro.ErrorHeader); e != "" {
				t.Fatalf("revoke refused: %s", e)
			}
			linked(t, false, nodes[0], 5*time.Second)
			t.Logf("leaf closed %v after the revocation", time.Since(start).Round(time.Millisecond))
			staysOff(t, nodes[0], 3*time.Second)
			if !nodes[1].Status().HubConnected {
				t.Error("b lost its link")
			}
			if _, ok := f.ids.NodeKey("a"); ok {
				t.Error("a revoked node still has a key")
			}
			if notified.Load() == 0 {
				t.Error("the revocation did not notify the key watchers")
			}
			// Unknown nodes are refused with a clear error.
			req, _ = json.Marshal(identity.RevokeRequest{Node: "ghost"})
			msg, err = ops.Request(identity.RevokeSubject, req, 10*time.Second)
			if err != nil || msg.Header.Get(micro.ErrorCodeHeader) != "400" {
				t.Fatalf("revoke of an unknown node: %v %v", err, msg.Header)
			}
		})
	}
}

// TestSuspendResume: a suspended node (its Kubernetes Node deleted) is cut
// off and stays off; resumed, it links again with the same credentials.
func TestSuspendResume(t *testing.T) {
	f := start(t, "embedded", identity.DefaultConfig())
	n := natstest.Edge(t, f, "a", natstest.EdgeOptions{Unit: "u1"})
	linked(t, true, n, 20*time.Second)
	var notified atomic.Int32
	f.ids.NotifyKeys(func() { notified.Add(1) })
	f.ids.Suspend("a")
	linked(t, false, n, 5*time.Second)
	staysOff(t, n, 2*time.Second)
	if _, ok := f.ids.NodeKey("a"); ok || notified.Load() != 1 {
		t.Errorf("suspended: key still published (%v) or %d notifications, want 1", ok, notified.Load())
	}
	f.ids.Resume("a")
	linked(t, true, n, 20*time.Second)
	if _, ok := f.ids.NodeKey("a"); !ok || notified.Load() != 2 {
		t.Errorf("resumed: key published %v, %d notifications, want 2", ok, notified.Load())
	}
}

// token asks the token endpoint for a bootstrap token of node.
func token(t *testing.T, f fabric, node, unit string, ttl time.Duration) string {
	t.Helper()
	req, _ := json.Marshal(identity.TokenRequest{Node: node, Unit: unit, TTL: ttl})
	msg, err := f.cloud.Request(identity.TokenSubject, req, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if e := msg.Header.Get(micro.ErrorHeader); e != "" {
		t.Fatalf("token refused: %s", e)
	}
	var rep identity.TokenReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		t.Fatal(err)
	}
	return rep.Creds
}

// bootstrap connects with the bootstrap token creds as node's enrollment
// client and enrolls.
func bootstrap(ctx context.Context, f fabric, creds []byte, node string) (string, nkeys.KeyPair, error) {
	tok, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return "", nil, err
	}
	kp, err := jwt.ParseDecoratedNKey(creds)
	if err != nil {
		return "", nil, err
	}
	seed, _ := kp.Seed()
	nc, err := nats.Connect(strings.Join(f.client.URLs, ","), nats.UserJWTAndSeed(tok, string(seed)),
		nats.CustomInboxPrefix(events.InboxPrefix(node)), nats.MaxReconnects(0))
	if err != nil {
		return "", nil, err
	}
	defer nc.Close()
	// On a hub cluster the service's interest reaches the server this
	// client is on a moment after the service subscribed.
	for {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		userJWT, key, err := enroll.Bootstrap(rctx, nc, node, tok)
		cancel()
		if !errors.Is(err, nats.ErrNoResponders) || ctx.Err() != nil {
			return userJWT, key, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// asService sends an enrollment request with token for node as a cloud
// service could (the only other identities allowed on the subject), to
// check the service's own checks.
func asService(t *testing.T, f fabric, node string, creds []byte) error {
	t.Helper()
	tok, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		t.Fatal(err)
	}
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	subj, _ := events.EnrollSubject(node)
	data, _ := json.Marshal(events.EnrollRequest{Token: tok, Key: pub})
	msg, err := f.cloud.Request(subj, data, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if e := msg.Header.Get(micro.ErrorHeader); e != "" {
		return errors.New(e)
	}
	return nil
}

// TestEnrollment: a node enrolls once with its bootstrap token and gets
// credentials for the key it generated, which link it; the same token is
// refused the second time (the service refuses a spent token, and its
// user is revoked once the node had time to read its reply: revoked at
// once, the reply was lost to the connection's close about one time in
// three), a token of another node is refused, an expired token is
// refused.
func TestEnrollment(t *testing.T) {
	for _, shape := range shapes {
		t.Run(shape, func(t *testing.T) {
			f := start(t, shape, identity.DefaultConfig())
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()

			creds := []byte(token(t, f, "a", "u1", time.Hour))
			userJWT, kp, err := bootstrap(ctx, f, creds, "a")
			if err != nil {
				t.Fatal(err)
			}
			pub, _ := kp.PublicKey()
			if key, ok := f.ids.NodeKey("a"); !ok || key != pub {
				t.Fatalf("recorded key %q, enrolled %q", key, pub)
			}
			seed, _ := kp.Seed()
			n := natstest.Edge(t, f, "a", natstest.EdgeOptions{Seed: string(seed), UserJWT: userJWT})
			linked(t, true, n, 20*time.Second)

			if _, _, err := bootstrap(ctx, f, creds, "a"); err == nil {
				t.Error("a token enrolled twice")
			}
			// The spent token's user is revoked once the node had time
			// to read its reply: it cannot log in any more.
			poll.Eventually(t, 20*time.Second, refused(f, creds))
			if err := asService(t, f, "a", creds); err == nil || !strings.Contains(err.Error(), "used already") {
				t.Errorf("spent token: %v", err)
			}
			// Another node's token, for a.
			other := []byte(token(t, f, "b", "u1", time.Hour))
			if _, _, err := bootstrap(ctx, f, other, "a"); err == nil {
				t.Error("b's token enrolled a")
			}
			if err := asService(t, f, "a", other); err == nil || !strings.Contains(err.Error(), "another node") {
				t.Errorf("b's token for a: %v", err)
			}
			// Expired.
			short := []byte(token(t, f, "c", "u1", time.Second))
			time.Sleep(2100 * time.Millisecond) // the token's expiry has a resolution of seconds
			if _, _, err := bootstrap(ctx, f, short, "c"); err == nil {
				t.Error("an expired token enrolled")
			}
			if err := asService(t, f, "c", short); err == nil || !strings.Contains(err.Error(), "expired") {
				t.Errorf("expired token: %v", err)
			}
			if _, ok := f.ids.NodeKey("c"); ok {
				t.Error("c enrolled")
			}
		})
	}
}

// TestRenewKeepsLinked: a node renews its credentials with its current
// ones; the leaf reconnects with the new JWT at once and the node keeps
// publishing; its key stays the same.
func TestRenewKeepsLinked(t *testing.T) {
	f := start(t, "embedded", identity.DefaultConfig())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	n := natstest.Edge(t, f, "a", natstest.EdgeOptions{Unit: "u1"})
	linked(t, true, n, 20*time.Second)
	agent, err := n.Connect("agent")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(agent.Close)
	old := n.UserJWT()
	time.Sleep(1100 * time.Millisecond) // a new JWT has a new issue time
	fresh, err := enroll.Renew(ctx, agent, "a", n.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	if fresh == old {
		t.Fatal("renewal returned the old JWT")
	}
	if err := n.SetUserJWT(fresh); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.NewWithDomain(f.cloud, "hub")
	if err != nil {
		t.Fatal(err)
	}
	if err := eventbus.EnsureStreams(ctx, js, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	seen := make(chan struct{}, 1)
	sub, err := f.cloud.Subscribe("atoll.topo.node.a", func(*nats.Msg) {
		select {
		case seen <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	poll.Eventually(t, 10*time.Second, func() error {
		_ = agent.Publish("atoll.topo.node.a", []byte("x"))
		select {
		case <-seen:
			return nil
		default:
			return errors.New("nothing arrived")
		}
	})
	// A key that is not the node's cannot renew.
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	if _, err := enroll.Renew(ctx, agent, "a", pub); err == nil {
		t.Error("renewed for another key")
	}
}

// refused returns a check that the user of creds is refused by the hub.
func refused(f fabric, creds []byte) func() error {
	return func() error {
		tok, _ := jwt.ParseDecoratedJWT(creds)
		kp, _ := jwt.ParseDecoratedNKey(creds)
		seed, _ := kp.Seed()
		nc, err := nats.Connect(strings.Join(f.client.URLs, ","), nats.UserJWTAndSeed(tok, string(seed)), nats.MaxReconnects(0))
		if errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthRevoked) {
			return nil
		}
		if err != nil {
			return err
		}
		nc.Close()
		return errors.New("the spent token's user still logs in")
	}
}

// TestSpentTokenSwept: a replica that dies within a spent token's grace
// (its revocation never runs: here a grace longer than the test) leaves
// it to the next start of any replica, whose sweep revokes the token's
// user once the grace is over, and marks its record so that no later
// sweep revokes it again.
func TestSpentTokenSwept(t *testing.T) {
	cfg := identity.DefaultConfig()
	cfg.SpentTokenGrace = time.Hour
	f := start(t, "embedded", cfg)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	creds := []byte(token(t, f, "a", "u1", time.Hour))
	if _, _, err := bootstrap(ctx, f, creds, "a"); err != nil {
		t.Fatal(err)
	}
	if err := refused(f, creds)(); err == nil {
		t.Fatal("the spent token's user was revoked within its grace")
	}
	g := f.serve(t, identity.DefaultConfig(), nil)
	poll.Eventually(t, 30*time.Second, refused(f, creds))
	// The start's sweep marks the token's record revoked once the
	// revocation is pushed: the refusal can be seen a moment before.
	js, err := jetstream.New(f.cloud)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, identity.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, func() error {
		keys, err := kv.ListKeysFiltered(ctx, "token.>")
		if err != nil {
			return err
		}
		for k := range keys.Keys() {
			var rec struct{ Revoked bool }
			if e, err := kv.Get(ctx, k); err != nil || json.Unmarshal(e.Value(), &rec) != nil || !rec.Revoked {
				return fmt.Errorf("%s not marked revoked (%v)", k, err)
			}
		}
		return nil
	})
	if n, err := g.ids.SweepSpent(ctx); n != 0 || err != nil {
		t.Errorf("a second sweep revoked %d (%v), want none", n, err)
	}
}

// TestConcurrentRevocations: two atoll-cloud replicas (two identity
// services) that revoke different keys at the same moment both hold in the
// end, though each pushes the whole account JWT.
func TestConcurrentRevocations(t *testing.T) {
	f := start(t, "cluster", identity.DefaultConfig())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	log := natstest.Logger(t, slog.LevelWarn)
	sys, err := identity.DialSystem(ctx, f.client, f.issuer, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.Close)
	cfg := identity.DefaultConfig()
	cfg.Replicas = 3
	other, err := identity.NewService(cfg, f.issuer, f.cloud, sys, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Stop() })
	revokers := []*identity.Revoker{f.ids.Revoker(), other.Revoker()}
	var keys []string
	for range 8 {
		kp, _ := nkeys.CreateUser()
		pub, _ := kp.PublicKey()
		keys = append(keys, pub)
	}
	errs := make(chan error, len(keys))
	for i, k := range keys {
		go func() { errs <- revokers[i%2].Revoke(ctx, k) }()
	}
	for range keys {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	poll.Eventually(t, 20*time.Second, func() error {
		for _, k := range keys {
			revoked, err := revokers[0].Revoked(ctx, k, time.Now().Add(-time.Minute))
			if err != nil {
				return err
			}
			if !revoked {
				return fmt.Errorf("revocation of %s lost", k)
			}
		}
		return nil
	})
}

// TestReplicaFollowsAfterItsStart: a replica keeps following the
// registry once the context it was started with is over (an app's start
// deadline): it learns a node another replica enrolled, and pushes to the
// hub a revocation another replica recorded but did not push (it died
// between the two).
func TestReplicaFollowsAfterItsStart(t *testing.T) {
	f := start(t, "embedded", identity.DefaultConfig())
	log := natstest.Logger(t, slog.LevelWarn)
	sys, err := identity.DialSystem(t.Context(), f.client, f.issuer, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.Close)
	other, err := identity.NewService(identity.DefaultConfig(), f.issuer, f.cloud, sys, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	startCtx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	err = other.Start(startCtx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Stop() })

	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	if _, err := f.IssueEdge("a", "u1", pub); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, func() error {
		if key, ok := other.NodeKey("a"); !ok || key != pub {
			return fmt.Errorf("the other replica knows a's key as %q", key)
		}
		return nil
	})

	js, err := jetstream.NewWithDomain(f.cloud, f.issuer.Domain())
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), identity.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	lost, _ := nkeys.CreateUser()
	lostPub, _ := lost.PublicKey()
	list, _ := json.Marshal(jwt.RevocationList{lostPub: time.Now().Unix()})
	if _, err := kv.Put(t.Context(), "revocations", list); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 15*time.Second, func() error {
		revoked, err := other.Revoker().Revoked(t.Context(), lostPub, time.Now().Add(-time.Minute))
		if err != nil || !revoked {
			return fmt.Errorf("the recorded revocation is not at the hub (%v)", err)
		}
		return nil
	})
}

// TestRenewUnknownNode: the registry does not know a node whose
// credentials the hub accepts (it was lost). Its renewal records its key
// again once the topology assigns it (not before: a node the cloud does
// not assign is refused as unknown), and a revoked key stays refused.
func TestRenewUnknownNode(t *testing.T) {
	f := start(t, "embedded", identity.DefaultConfig())
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	js, err := jetstream.NewWithDomain(f.cloud, "hub")
	if err != nil {
		t.Fatal(err)
	}
	if err := eventbus.EnsureStreams(ctx, js, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	unrecorded := func(node string) (*natsnode.Node, *nats.Conn) {
		t.Helper()
		kp, _ := nkeys.CreateUser()
		seed, _ := kp.Seed()
		pub, _ := kp.PublicKey()
		userJWT, err := f.issuer.Edge(node, "u1", pub, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		n := natstest.Edge(t, f, node, natstest.EdgeOptions{Seed: string(seed), UserJWT: userJWT})
		linked(t, true, n, 20*time.Second)
		agent, err := n.Connect("agent")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(agent.Close)
		return n, agent
	}
	assign := func(node string) {
		t.Helper()
		subj, _ := events.AssignmentSubject(node)
		if _, err := events.PublishDurable(ctx, js, subj, &atollv1.NodeAssignment{Node: node, Unit: "u1"}, ""); err != nil {
			t.Fatal(err)
		}
	}

	n, agent := unrecorded("lost")
	if _, err := enroll.Renew(ctx, agent, "lost", n.PublicKey()); err == nil || !strings.Contains(err.Error(), "no credentials issued to node") {
		t.Fatalf("renewal of an unassigned unknown node: %v, want it refused as unknown", err)
	}
	assign("lost")
	fresh, err := enroll.Renew(ctx, agent, "lost", n.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	if c, err := jwt.DecodeUserClaims(fresh); err != nil || c.Subject != n.PublicKey() {
		t.Fatalf("renewed credentials for %v (%v), want the node's key", c, err)
	}
	if key, ok := f.ids.NodeKey("lost"); !ok || key != n.PublicKey() {
		t.Fatalf("registry key %q (%v), want %s", key, ok, n.PublicKey())
	}

	r, _ := unrecorded("revoked")
	assign("revoked")
	if err := f.ids.Revoker().Revoke(ctx, r.PublicKey()); err != nil {
		t.Fatal(err)
	}
	// The revocation closes the node's link: ask as the cloud's service
	// connection, which may publish on any node's subjects.
	if _, err := enroll.Renew(ctx, f.cloud, "revoked", r.PublicKey()); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("renewal of a revoked key: %v, want it refused as revoked", err)
	}
	if _, ok := f.ids.NodeKey("revoked"); ok {
		t.Fatal("a revoked key is in the registry")
	}
}

// memoryDurable keeps the registry's durable part in memory.
type memoryDurable struct {
	mu   sync.Mutex
	snap identity.Snapshot
}

func (m *memoryDurable) Load(context.Context) (identity.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.snap, nil
}

func (m *memoryDurable) Save(_ context.Context, s identity.Snapshot) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.snap = s
	return nil
}

func (m *memoryDurable) get() identity.Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.snap
}

// TestRegistryOutlivesTheStore: the embedded hub restarts on a new store
// with the same identity keys (a new volume, the keys from their Secret).
// The revocations and the records of the revoked and suspended nodes,
// kept outside the hub, are put back before the service answers: the
// revoked node cannot link to the new hub, its bootstrap token's user
// stays spent, and the suspended node links again once resumed; a node
// in good standing links with its credentials (its key recorded again at
// its next renewal: TestRenewUnknownNode).
func TestRegistryOutlivesTheStore(t *testing.T) {
	ids := t.TempDir()
	withIdentity := func(c *hub.Config) { c.IdentityDir = ids }
	first := natstest.Hub(t, withIdentity)
	keep := &memoryDurable{}
	f := fabric{issuer: first.Issuer(), leafURLs: first.LeafURLs(), client: first.ClientConfig()}.serve(t, identity.DefaultConfig(), keep)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	creds := map[string]natstest.EdgeOptions{}
	for _, node := range []string{"revoked", "suspended", "good"} {
		kp, _ := nkeys.CreateUser()
		seed, _ := kp.Seed()
		pub, _ := kp.PublicKey()
		userJWT, err := f.ids.IssueEdge(ctx, node, "u1", pub)
		if err != nil {
			t.Fatal(err)
		}
		creds[node] = natstest.EdgeOptions{Seed: string(seed), UserJWT: userJWT}
	}
	if _, err := f.ids.Revoke(ctx, "revoked"); err != nil {
		t.Fatal(err)
	}
	f.ids.Suspend("suspended")
	poll.Eventually(t, 10*time.Second, func() error {
		snap := keep.get()
		if len(snap.Records) != 2 || len(snap.Revocations) != 2 {
			return fmt.Errorf("kept %d records and %d revocations, want 2 and 2", len(snap.Records), len(snap.Revocations))
		}
		return nil
	})
	if err := f.ids.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := first.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	second := natstest.Hub(t, withIdentity)
	g := fabric{issuer: second.Issuer(), leafURLs: second.LeafURLs(), client: second.ClientConfig()}.serve(t, identity.DefaultConfig(), keep)
	if r, ok := g.ids.Record("revoked"); !ok || !r.Revoked {
		t.Fatalf("the revoked node's record: %+v (%v)", r, ok)
	}
	if r, ok := g.ids.Record("suspended"); !ok || !r.Suspended {
		t.Fatalf("the suspended node's record: %+v (%v)", r, ok)
	}
	good := natstest.Edge(t, g, "good", creds["good"])
	revoked := natstest.Edge(t, g, "revoked", creds["revoked"])
	suspended := natstest.Edge(t, g, "suspended", creds["suspended"])
	linked(t, true, good, 20*time.Second)
	staysOff(t, revoked, 3*time.Second)
	staysOff(t, suspended, time.Second)
	g.ids.Resume("suspended")
	linked(t, true, suspended, 20*time.Second)
	staysOff(t, revoked, time.Second)
}
