package membership

// Assigned returns the unit of the node's assignment ("" for none) and
// whether the node has an assignment at all (from the cloud, or kept
// from before a restart).
func (m *Membership) Assigned() (unit string, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.assignment == nil {
		return "", false
	}
	return m.assignment.GetUnit(), true
}

// ListedKey returns the identity key the node's unit view lists for it
// ("" when the cloud knows none) and whether the view lists the node at
// all (false without an assignment or the unit's view).
func (m *Membership) ListedKey() (key string, listed bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, mem := range m.viewLocked().Members {
		if mem.GetName() == m.node.Name() {
			return mem.GetNodeKey(), true
		}
	}
	return "", false
}
