package natsnode

import (
	"fmt"

	"github.com/nats-io/nkeys"
)

// Sign signs input with the node's identity key (its nkey seed), for what
// the node's unit peers verify against the key the cloud publishes for it
// (events.SignMsg); Node is an events.Signer.
func (n *Node) Sign(input []byte) ([]byte, error) {
	kp, err := nkeys.FromSeed([]byte(n.seed))
	if err != nil {
		return nil, fmt.Errorf("natsnode: seed: %w", err)
	}
	defer kp.Wipe()
	return kp.Sign(input)
}

// PublicKey is the node's identity key, the nkey user public key ("U...")
// the hub enrolls it with.
func (n *Node) PublicKey() string {
	kp, err := nkeys.FromSeed([]byte(n.seed))
	if err != nil {
		return "" // New validated the seed
	}
	defer kp.Wipe()
	pub, _ := kp.PublicKey()
	return pub
}
