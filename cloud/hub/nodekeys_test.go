package hub_test

import (
	"sync/atomic"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/cloud/topology"
)

// The registry is the embedded hub's source of node keys for unit views.
var _ topology.NodeKeys = (*hub.Identities)(nil)

// TestNodeKeys: the registry tells each enrolled edge's key, and calls its
// watchers on every enrollment, re-keying and removal.
func TestNodeKeys(t *testing.T) {
	ids := hub.NewIdentities(nil)
	var changes atomic.Int32
	ids.NotifyKeys(func() { changes.Add(1) })
	user := func() string {
		kp, _ := nkeys.CreateUser()
		pub, _ := kp.PublicKey()
		return pub
	}
	k1, k2 := user(), user()
	if _, ok := ids.NodeKey("n1"); ok {
		t.Fatal("a key for a node never enrolled")
	}
	if err := ids.AddEdge("n1", k1); err != nil {
		t.Fatal(err)
	}
	if got, ok := ids.NodeKey("n1"); !ok || got != k1 || changes.Load() != 1 {
		t.Fatalf("after enrollment: %q %v, %d changes", got, ok, changes.Load())
	}
	if err := ids.AddEdge("n1", k2); err != nil {
		t.Fatal(err)
	}
	if got, _ := ids.NodeKey("n1"); got != k2 || changes.Load() != 2 {
		t.Fatalf("after re-keying: %q, %d changes", got, changes.Load())
	}
	ids.Suspend("n1") // a suspended node keeps its key
	if got, _ := ids.NodeKey("n1"); got != k2 {
		t.Fatalf("suspended node's key: %q", got)
	}
	ids.RemoveEdge("n1")
	if _, ok := ids.NodeKey("n1"); ok || changes.Load() != 3 {
		t.Fatalf("after removal: known %v, %d changes", ok, changes.Load())
	}
}
