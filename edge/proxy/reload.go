package proxy

import (
	"slices"

	"github.com/atoll-edge/atoll/internal/objectview"
)

// A hub whose VIEWS stream was rebuilt (deleted and created again, or
// restored without its latest messages) numbers its messages anew: the
// sequence the store got to says nothing about it. The follower notices
// (the stream's creation time is not the one the state recorded, or the
// stream ends before the store's sequence) and reloads the unit's views
// in full: BeginReload, every view of the stream applied as usual (equal
// content emits nothing), EndReload once the last one is in, which deletes
// the objects the new stream no longer has. Until then the state keeps
// the old creation time, so a restart in the middle reloads again.

// StreamCreated is the creation time (Unix nanoseconds) of the VIEWS
// stream the store's sequence is of, 0 when unknown.
func (s *Store) StreamCreated() int64 { s.mu.RLock(); defer s.mu.RUnlock(); return s.streamCreated }

// SetStreamCreated records the creation time of the stream being read.
func (s *Store) SetStreamCreated(created int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.streamCreated != created {
		s.streamCreated = created
		s.notify()
	}
}

// Reloading tells whether a reload is under way.
func (s *Store) Reloading() bool { s.mu.RLock(); defer s.mu.RUnlock(); return s.reloading != nil }

// BeginReload starts reading the stream again from its start: the
// sequence goes back to 0 and the views applied from now on are noted.
func (s *Store) BeginReload() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq = 0
	s.reloading = map[objectKey]struct{}{}
	s.notify()
}

// EndReload ends a reload of the stream created at created: the raw
// objects no view was applied for since BeginReload are deleted (their
// watchers see them go). It returns how many.
func (s *Store) EndReload(created int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reloading == nil {
		return 0
	}
	gone := 0
	for _, kind := range objectview.Kinds {
		for _, k := range slices.Sorted(mapKeys(s.raw[kind])) {
			if _, seen := s.reloading[objectKey{kind, k}]; !seen {
				delete(s.rawViews[kind], k)
				s.apply(kind, k, nil)
				gone++
			}
		}
	}
	s.reloading, s.streamCreated = nil, created
	s.notify()
	return gone
}
