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
