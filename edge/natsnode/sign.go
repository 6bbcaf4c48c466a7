package natsnode

import "fmt"

// Sign signs input with the node's identity key (the nkey its leaf link
// authenticates with), for what the node's unit peers verify against the
// key the cloud publishes for it (events.SignMsg); Node is an
// events.Signer. Until the node is enrolled, the key is its bootstrap
// token's, which the cloud publishes for nobody: peers drop what it signs.
func (n *Node) Sign(input []byte) ([]byte, error) {
	n.mu.Lock()
	key := n.key
	n.mu.Unlock()
	sig, err := key.Sign(input)
	if err != nil {
		return nil, fmt.Errorf("natsnode: sign: %w", err)
	}
	return sig, nil
}
