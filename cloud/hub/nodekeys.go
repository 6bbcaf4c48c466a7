package hub

// NodeKey returns the nkey public key node is enrolled with as an edge
// (cloud/topology publishes it in the node's unit view, for peers to
// verify the node's signed reports). A suspended node keeps its key.
func (r *Identities) NodeKey(node string) (string, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	pub, ok := r.keyOf[node]
	return pub, ok
}

// NotifyKeys has f called after every enrollment, re-keying or removal of
// an edge key; f must not block.
func (r *Identities) NotifyKeys(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onKeys = append(r.onKeys, f)
}

// keysChanged calls the NotifyKeys functions; callers do not hold mu.
func (r *Identities) keysChanged() {
	r.mu.RLock()
	fs := r.onKeys
	r.mu.RUnlock()
	for _, f := range fs {
		f()
	}
}
