package units

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// Index keeps every Node's unit and every unit's member count, by the
// Rule, from a Node informer's events (Handler), so that reading them is
// O(1): the health service reads the unit of every voter and the size of
// its unit for every vote it tallies. The informer calls the handler
// after its store is updated, so the index trails the cache by one
// handler call at most.
type Index struct {
	rule Rule

	mu     sync.RWMutex
	unitOf map[string]string // node → its unit ("" not kept)
	size   map[string]int    // unit → members
}

// NewIndex returns an empty index of the units of r.
func NewIndex(r Rule) *Index {
	return &Index{rule: r, unitOf: map[string]string{}, size: map[string]int{}}
}

// Rule is the rule the index groups Nodes by.
func (x *Index) Rule() Rule { return x.rule }

// Size is the number of members of unit.
func (x *Index) Size(unit string) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.size[unit]
}

// UnitOf is node's unit, "" when it is in none or unknown.
func (x *Index) UnitOf(node string) string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.unitOf[node]
}

// Set records that node is in unit ("" for none).
func (x *Index) Set(node, unit string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old, had := x.unitOf[node]
	if had && old == unit {
		return
	}
	if had {
		if x.size[old]--; x.size[old] <= 0 {
			delete(x.size, old)
		}
		delete(x.unitOf, node)
	}
	if unit != "" {
		x.unitOf[node] = unit
		x.size[unit]++
	}
}

// Handler keeps the index from a Node informer's events.
func (x *Index) Handler() toolscache.ResourceEventHandler {
	put := func(obj any) {
		if n, ok := obj.(*corev1.Node); ok {
			x.Set(n.Name, x.rule.Of(n))
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
				x.Set(n.Name, "")
			}
		},
	}
}
