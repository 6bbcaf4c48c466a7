package health

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// unitSizes keeps each Node's unit and each unit's member count from the
// Node informer's events, so that a judgement reads them in O(1):
// listing the unit from the cache for every judgement (every entry of
// every ballot, every node at every resync) was a quarter of
// atoll-cloud's CPU at 10,000 nodes, and reading each voter's Node from
// the cache another fifth. The informer calls it after its store is updated, so the
// count trails the cache by one handler call at most.
type unitSizes struct {
	label string

	mu     sync.RWMutex
	unitOf map[string]string // node → its unit ("" not kept)
	size   map[string]int    // unit → members
}

func newUnitSizes(label string) *unitSizes {
	return &unitSizes{label: label, unitOf: map[string]string{}, size: map[string]int{}}
}

// of is the number of Nodes labelled as members of unit.
func (u *unitSizes) of(unit string) int {
	u.mu.RLock()
	defer u.mu.RUnlock()
	return u.size[unit]
}

// unitOfNode is node's unit, "" when it is in none or unknown.
func (u *unitSizes) unitOfNode(node string) string {
	u.mu.RLock()
	defer u.mu.RUnlock()
	return u.unitOf[node]
}

// set records that node is in unit ("" for none).
func (u *unitSizes) set(node, unit string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	old, had := u.unitOf[node]
	if had && old == unit {
		return
	}
	if had {
		if u.size[old]--; u.size[old] <= 0 {
			delete(u.size, old)
		}
		delete(u.unitOf, node)
	}
	if unit != "" {
		u.unitOf[node] = unit
		u.size[unit]++
	}
}

// handler keeps the counts from the Node informer's events.
func (u *unitSizes) handler() toolscache.ResourceEventHandler {
	put := func(obj any) {
		if n, ok := obj.(*corev1.Node); ok {
			u.set(n.Name, n.Labels[u.label])
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    put,
		UpdateFunc: func(_, obj any) { put(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if n, ok := obj.(*corev1.Node); ok {
				u.set(n.Name, "")
			}
		},
	}
}
