package fabric_test

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestLeafInterestIsolated: an edge server's subscriptions do not grow
// with the hub's other leafs (were every edge server's loop-detection
// subscription to reach every other leaf, the hub would keep a copy per
// leaf: memory in leafs²), while a hub client still reaches every edge.
func TestLeafInterestIsolated(t *testing.T) {
	h := natstest.Hub(t)
	leafIsolation(t, h, func() (int, error) {
		lz, err := h.Server().Leafz(nil)
		if err != nil {
			return 0, err
		}
		return lz.NumLeafs, nil
	}, func() (*nats.Conn, error) { return h.Connect("cloud") }, natstest.EdgeOptions{})
}

// TestLeafInterestIsolatedByTheEdge: the same on a hub whose operator
// did not set isolate_leafnode_interest (the external-nats overlay's
// server with it taken out): atoll-edge's server asks for isolation
// itself.
func TestLeafInterestIsolatedByTheEdge(t *testing.T) {
	keys, trust, err := identity.Setup(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	issuer := identity.NewIssuer(keys, hublink.DefaultDomain)
	srv, leafTLS := externalHub(t, trust, func(o *server.Options) { o.LeafNode.IsolateLeafnodeInterest = false })
	varz, err := srv.Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	h := externalHubServers{issuer: issuer, leafURL: "nats-leaf://" + net.JoinHostPort("127.0.0.1", fmt.Sprint(varz.LeafNode.Port))}
	cloudKey, _ := nkeys.CreateUser()
	cloudPub, _ := cloudKey.PublicKey()
	cloudJWT, err := issuer.Service("atoll-cloud", cloudPub)
	if err != nil {
		t.Fatal(err)
	}
	leafIsolation(t, h, func() (int, error) { return srv.NumLeafNodes(), nil }, func() (*nats.Conn, error) {
		return nats.Connect(srv.ClientURL(), nats.UserJWT(func() (string, error) { return cloudJWT, nil }, cloudKey.Sign))
	}, natstest.EdgeOptions{HubCAFile: leafTLS.CAFile, HubServerName: "localhost"})
}

// externalHubServers issues edges' credentials for one external hub.
type externalHubServers struct {
	issuer  *identity.Issuer
	leafURL string
}

func (h externalHubServers) IssueEdge(node, unit, pub string) (string, error) {
	return h.issuer.Edge(node, unit, pub, 0)
}

func (h externalHubServers) LeafURLs() []string { return []string{h.leafURL} }

// leafIsolation starts an edge, then 8 more, each in a unit of its own,
// and checks that the first edge's server holds no more subscriptions
// than before while a hub client (cloud) reaches every edge.
func leafIsolation(t *testing.T, h natstest.HubServers, leafs func() (int, error), cloud func() (*nats.Conn, error), o natstest.EdgeOptions) {
	t.Helper()
	linked := func(n int) func() error {
		return func() error {
			got, err := leafs()
			if err != nil {
				return err
			}
			if got != n {
				return fmt.Errorf("%d leafs, want %d", got, n)
			}
			return nil
		}
	}
	edge := func(i int) *natsnode.Node {
		o := o
		o.Unit = fmt.Sprintf("u%d", i)
		return natstest.Edge(t, h, fmt.Sprintf("e%d", i), o)
	}
	first := edge(0)
	poll.Eventually(t, 20*time.Second, linked(1))
	before := first.Server().NumSubscriptions()

	edges := []*natsnode.Node{first}
	const more = 8
	for i := 1; i <= more; i++ {
		edges = append(edges, edge(i))
	}
	poll.Eventually(t, 20*time.Second, linked(1+more))

	// Every edge hears the hub: a hub client's message to each node's
	// inbox arrives (so the interest of each leaf reached the hub).
	nc, err := cloud()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	for _, e := range edges {
		listener, err := e.Connect("listener")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(listener.Close)
		subj := identity.InboxPrefix(e.Name()) + ".isolate"
		sub, err := listener.SubscribeSync(subj)
		if err != nil {
			t.Fatal(err)
		}
		poll.Eventually(t, 10*time.Second, func() error {
			if err := nc.Publish(subj, []byte("hello")); err != nil {
				return err
			}
			if _, err := sub.NextMsg(200 * time.Millisecond); err != nil {
				return fmt.Errorf("%s from a hub client: %w", subj, err)
			}
			return nil
		})
	}
	// The listeners' subscriptions are the edges' own; the first edge's
	// count is compared without its listener's.
	if got := first.Server().NumSubscriptions() - 1; got > before {
		t.Fatalf("the first edge server holds %d subscriptions after %d more leafs joined the hub, %d before: other leafs' interest reaches it", got, more, before)
	}
}
