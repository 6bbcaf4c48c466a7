package tunnel

import (
	"maps"
	"sync"
)

// nodeSessions counts the sessions a replica relays, by node.
type nodeSessions struct {
	mu sync.Mutex
	n  map[string]int
}

func (s *nodeSessions) add(node string, d int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == nil {
		s.n = map[string]int{}
	}
	if s.n[node] += d; s.n[node] <= 0 {
		delete(s.n, node)
	}
}

func (s *nodeSessions) snapshot() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.n)
}

// SessionsByNode is the count of live sessions this replica relays (CONNECT
// and port forwards), by node; nodes without one are left out. It is what
// `atoll status` sums over the replicas.
func (s *Server) SessionsByNode() map[string]int {
	out := s.byNode.snapshot()
	if out == nil {
		out = map[string]int{}
	}
	return out
}
