package proxy

import (
	"slices"

	"github.com/atoll-edge/atoll/internal/objectview"
)

// A hub whose VIEWS stream was rebuilt (deleted and created again, or
// restored without its latest messages) numbers its messages anew: the
// sequence a space's cursor got to says nothing about it. The follower of
// each space notices (the stream's creation time is not the one the
// cursor recorded, or the stream ends before the cursor's sequence) and
// reloads the space in full: BeginReload, every view of the space applied
// as usual (equal content emits nothing), EndReload once the last one is
// in, which deletes the objects of that space the new stream no longer
// has. Until then the cursor keeps the old creation time, so a restart in
// the middle reloads again. A space read from its start while the store
// holds views of it (the unit changed: Reset) is reloaded the same way.

// StreamCreated is the creation time (Unix nanoseconds) of the VIEWS
// stream the cursor of sp is of, 0 when unknown.
func (s *Store) StreamCreated(sp Space) int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cur[sp].created
}

// SetStreamCreated records the creation time of the stream sp is read from.
func (s *Store) SetStreamCreated(sp Space, created int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur[sp].created != created {
		s.cur[sp].created = created
		s.notify()
	}
}

// Holds tells whether the store holds any object of space sp.
func (s *Store) Holds(sp Space) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, objs := range s.layers[sp].objs {
		if len(objs) > 0 {
			return true
		}
	}
	return false
}

// Reloading tells whether a reload of sp is under way.
func (s *Store) Reloading(sp Space) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cur[sp].reloading != nil
}

// BeginReload starts reading sp again from the stream's start: its
// sequence goes back to 0 and the views applied from now on are noted.
func (s *Store) BeginReload(sp Space) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.beginReload(sp)
	s.notify()
}

func (s *Store) beginReload(sp Space) {
	s.cur[sp].seq = 0
	s.cur[sp].reloading = map[objectKey]struct{}{}
}

// EndReload ends a reload of sp from the stream created at created: the
// raw objects of sp no view was applied for since BeginReload are
// deleted (their watchers see them go, unless the other space has them).
// It returns how many.
func (s *Store) EndReload(sp Space, created int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := &s.cur[sp]
	if c.reloading == nil {
		return 0
	}
	gone := 0
	for _, kind := range objectview.Kinds {
		for _, k := range slices.Sorted(mapKeys(s.layers[sp].objs[kind])) {
			if _, seen := c.reloading[objectKey{kind, k}]; !seen {
				s.put(sp, kind, k, nil, nil)
				gone++
			}
		}
	}
	c.reloading, c.created = nil, created
	s.notify()
	return gone
}
