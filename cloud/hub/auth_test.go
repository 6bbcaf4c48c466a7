package hub_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/internal/testenv/natstest"
)

// TestEdgeKeyIsLeafOnly: a node's key opens leaf connections only; used by
// a plain client it is refused.
func TestEdgeKeyIsLeafOnly(t *testing.T) {
	h := natstest.Hub(t)
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	if err := h.Identities().AddEdge("n1", pub); err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(h.ClientURL(), nats.Nkey(pub, kp.Sign), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Fatal("edge key connected as a client")
	}
}

func TestEnrollmentRejectsBadInput(t *testing.T) {
	h := natstest.Hub(t)
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	tests := []struct {
		node, key, want string
	}{
		{"a b", pub, "node"},
		{"", pub, "node"},
		{"n1", string(seed), "not an nkey user public key"},
		{"n1", "UNOTAKEY", "not an nkey user public key"},
	}
	for _, tt := range tests {
		if err := h.Identities().AddEdge(tt.node, tt.key); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("AddEdge(%q, %q) = %v, want %q", tt.node, tt.key, err, tt.want)
		}
	}
	if err := h.Identities().AddEdge("n1", pub); err != nil {
		t.Fatal(err)
	}
	if err := h.Identities().AddEdge("n2", pub); err == nil || !strings.Contains(err.Error(), "already belongs") {
		t.Errorf("a key enrolled twice: %v", err)
	}
}
