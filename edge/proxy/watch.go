package proxy

import (
	"cmp"
	"errors"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/atoll-edge/atoll/internal/objectview"
)

// ErrGone answers a resume from a revision the store no longer holds
// the changes after (too old) or never had (newer than its own).
var ErrGone = errors.New("proxy: too old resource version")

// match selects objects: namespace ("" for all), label and field
// selectors.
type match struct {
	namespace string
	labels    labels.Selector
	fields    fields.Selector
	fieldSet  func(objectview.Object) fields.Set
}

func (m match) matches(o objectview.Object) bool {
	if o == nil {
		return false
	}
	if m.namespace != "" && o.GetNamespace() != m.namespace {
		return false
	}
	if m.labels != nil && !m.labels.Matches(labels.Set(o.GetLabels())) {
		return false
	}
	if m.fields != nil && !m.fields.Empty() && !m.fields.Matches(m.fieldSet(o)) {
		return false
	}
	return true
}

// watcher is one watch: the events of one kind matching m.
type watcher struct {
	kind   string
	m      match
	ch     chan Event
	once   sync.Once
	closed bool // under Store.mu
}

// watchBuffer bounds the events queued for one watcher; a watcher that
// falls further behind is closed (its client resumes from its last
// revision).
const watchBuffer = 4096

// emit hands ev to every watcher of its kind, as its selection sees it:
// an object entering the selection is Added, one leaving it Deleted.
// Call with mu held.
func (s *Store) emit(ev Event) {
	s.metrics.changes.WithLabelValues(ev.Kind).Inc()
	for w := range s.watchers {
		if w.kind != ev.Kind {
			continue
		}
		out, ok := w.view(ev)
		if !ok {
			continue
		}
		select {
		case w.ch <- out:
			s.metrics.eventsSent.Inc()
		default:
			s.dropWatcher(w)
		}
	}
}

// view is ev as w's selection sees it.
func (w *watcher) view(ev Event) (Event, bool) {
	now, before := w.m.matches(ev.Obj), w.m.matches(ev.Old)
	switch ev.Type {
	case watch.Deleted:
		return ev, before || now
	case watch.Added:
		return ev, now
	}
	switch {
	case now && before:
		return ev, true
	case now:
		ev.Type = watch.Added
		return ev, true
	case before:
		ev.Type = watch.Deleted
		return ev, true
	}
	return ev, false
}

// dropWatcher closes w. Call with mu held.
func (s *Store) dropWatcher(w *watcher) {
	if w.closed {
		return
	}
	w.closed = true
	delete(s.watchers, w)
	close(w.ch)
	s.metrics.watchers.Dec()
}

// Watch starts a watch of kind matching m. With initial, the backlog is
// every matching object as Added (a watch from "" or "0", or a watch list);
// otherwise it is every change after from, from the state (tombstones for
// deletions), or ErrGone when from is older than the oldest tombstone
// dropped or newer than the store. It returns the backlog, the revision
// it brings the watcher to, the channel of later events, and a stop func.
func (s *Store) Watch(kind string, m match, from uint64, initial bool) ([]Event, uint64, <-chan Event, func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !initial && (from < s.compacted || from > s.rev) {
		s.metrics.gone.Inc()
		return nil, 0, nil, nil, ErrGone
	}
	var backlog []Event
	for _, e := range s.served[kind] {
		switch {
		case initial:
			if !e.deleted && m.matches(e.obj) {
				backlog = append(backlog, Event{Type: watch.Added, Kind: kind, Obj: e.obj, RV: e.rv})
			}
		case e.rv <= from:
		case e.deleted:
			if e.created <= from && m.matches(e.obj) {
				backlog = append(backlog, Event{Type: watch.Deleted, Kind: kind, Obj: e.obj, RV: e.rv})
			}
		case !m.matches(e.obj):
		case e.created > from:
			backlog = append(backlog, Event{Type: watch.Added, Kind: kind, Obj: e.obj, RV: e.rv})
		default:
			backlog = append(backlog, Event{Type: watch.Modified, Kind: kind, Obj: e.obj, RV: e.rv})
		}
	}
	slices.SortFunc(backlog, func(a, b Event) int { return cmp.Compare(a.RV, b.RV) })
	w := &watcher{kind: kind, m: m, ch: make(chan Event, watchBuffer)}
	s.watchers[w] = struct{}{}
	s.metrics.watchers.Inc()
	stop := func() {
		w.once.Do(func() {
			s.mu.Lock()
			s.dropWatcher(w)
			s.mu.Unlock()
		})
	}
	return backlog, s.rev, w.ch, stop, nil
}
