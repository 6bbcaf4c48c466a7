package fabric_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestLeafInterestIsolated: an edge server's subscriptions do not grow
// with the hub's other leafs (were every edge server's loop-detection
// subscription to reach every other leaf, the hub would keep a copy per
// leaf: memory in leafs²), while a hub client still reaches every edge.
func TestLeafInterestIsolated(t *testing.T) {
	h := natstest.Hub(t)
	first := natstest.Edge(t, h, "e0", natstest.EdgeOptions{Unit: "u0"})
	leafs := func(n int) func() error {
		return func() error {
			lz, err := h.Server().Leafz(nil)
			if err != nil {
				return err
			}
			if lz.NumLeafs != n {
				return fmt.Errorf("%d leafs, want %d", lz.NumLeafs, n)
			}
			return nil
		}
	}
	poll.Eventually(t, 20*time.Second, leafs(1))
	before := first.Server().NumSubscriptions()

	edges := []*natsnode.Node{first}
	const more = 8
	for i := 1; i <= more; i++ {
		edges = append(edges, natstest.Edge(t, h, fmt.Sprintf("e%d", i), natstest.EdgeOptions{Unit: fmt.Sprintf("u%d", i)}))
	}
	poll.Eventually(t, 20*time.Second, leafs(1+more))

	// Every edge hears the hub: a hub client's message to each node's
	// inbox arrives (so the interest of each leaf reached the hub).
	cloud, err := h.Connect("cloud")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cloud.Close)
	for _, e := range edges {
		nc, err := e.Connect("listener")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		subj := identity.InboxPrefix(e.Name()) + ".isolate"
		sub, err := nc.SubscribeSync(subj)
		if err != nil {
			t.Fatal(err)
		}
		poll.Eventually(t, 10*time.Second, func() error {
			if err := cloud.Publish(subj, []byte("hello")); err != nil {
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
