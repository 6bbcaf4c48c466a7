package grid

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// warnings remembers the last InvalidSpec message Evented for each grid,
// so that a grid gets one Warning per problem however many reconciles
// see it: a reconcile that runs before the informer holds the status the
// previous one wrote (a child's or a unit's event queued meanwhile) would
// otherwise find no InvalidSpec condition yet and Event it again.
type warnings struct{ m sync.Map } // grid UID → message

// first reports whether msg is new for grid uid, and remembers it.
func (w *warnings) first(uid types.UID, msg string) bool {
	prev, loaded := w.m.Swap(uid, msg)
	return !loaded || prev.(string) != msg
}

// clear forgets grid uid's message: its spec is valid.
func (w *warnings) clear(uid types.UID) { w.m.Delete(uid) }
