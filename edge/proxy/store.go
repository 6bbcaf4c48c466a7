package proxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/atoll-edge/atoll/internal/objectview"
	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// entry is one object as the proxy serves it.
type entry struct {
	obj     objectview.Object   // served (filtered); its last state when deleted
	fp      string              // digest of obj without its resource version
	rv      uint64              // revision of the last change
	created uint64              // revision it was (last) created at
	deleted bool                // a tombstone
	view    *atollv1.ObjectView // obj encoded, for the state on disk (nil: encode when saving)
}

// Event is one change of a served object.
type Event struct {
	Type watch.EventType
	Kind string
	Obj  objectview.Object // new state; last state for Deleted
	Old  objectview.Object // state before (nil for Added)
	RV   uint64
}

// Space is where a view comes from: the unit's own view space
// (atoll.view.<unit>.>: its Nodes in full) or the space shared by all
// units (atoll.view._all.>: Services, EndpointSlices and Endpoints, the
// last two with their endpoints' topology). Each is read by its own
// consumer from its own cursor.
type Space int

const (
	UnitSpace Space = iota
	SharedSpace
)

// Spaces are both spaces, in order.
var Spaces = []Space{UnitSpace, SharedSpace}

func (sp Space) String() string {
	if sp == UnitSpace {
		return "unit"
	}
	return "shared"
}

// cursor is how far the store read one space of the VIEWS stream.
type cursor struct {
	seq     uint64 // last stream sequence applied
	created int64  // creation time of the stream seq is of (Unix ns; 0: unknown)
	// A reload of the space from the stream's start (reload.go): the
	// objects seen so far, nil when none is under way.
	reloading map[objectKey]struct{}
}

// layer is the raw objects received from one space, and their views as
// received (for the state on disk).
type layer struct {
	objs  map[string]map[string]objectview.Object
	views map[string]map[string]*atollv1.ObjectView
}

func newLayer() layer {
	l := layer{objs: map[string]map[string]objectview.Object{}, views: map[string]map[string]*atollv1.ObjectView{}}
	for _, k := range objectview.Kinds {
		l.objs[k], l.views[k] = map[string]objectview.Object{}, map[string]*atollv1.ObjectView{}
	}
	return l
}

// Store holds the views of one unit as the host serves them: the raw
// objects the cloud published (the union of both spaces) and, derived
// from them by the topology filter (the host's Node's labels against the
// topology the endpoints' views carry), the served ones, each with the
// revision of its last change.
// Revisions are the proxy's own, one counter over all kinds, so they are
// monotonic whatever the order the views arrive in. Deleted objects stay
// as tombstones (up to MaxTombstones), so a watch can resume from any
// revision at or after the oldest tombstone dropped, from the state alone.
type Store struct {
	host          string
	maxTombstones int
	metrics       *metrics

	mu         sync.RWMutex
	unit       string
	rev        uint64
	compacted  uint64                                  // resuming from below this is answered 410 Gone
	cur        [2]cursor                               // by Space
	layers     [2]layer                                // by Space
	raw        map[string]map[string]objectview.Object // the union of the layers
	served     map[string]map[string]*entry
	bySvc      map[string]map[string]struct{} // namespace/service → keys of its raw slices
	hostLast   map[string]string              // the labels of the host's Node last held
	tombstones int
	watchers   map[*watcher]struct{}
	changed    chan struct{} // closed and replaced at every change (persistence)

	generation uint64 // of the last snapshot taken

	// What changed since the last save, and the files (state.go).
	dirty disk
	saver saver
}

// objectKey names one object of a kind.
type objectKey struct{ kind, key string }

// NewStore returns an empty store serving host's view.
func NewStore(host string, maxTombstones int, m *metrics) *Store {
	if m == nil {
		m = newMetrics(nil)
	}
	s := &Store{host: host, maxTombstones: maxTombstones, metrics: m,
		raw:    map[string]map[string]objectview.Object{},
		served: map[string]map[string]*entry{}, bySvc: map[string]map[string]struct{}{},
		layers:   [2]layer{newLayer(), newLayer()},
		watchers: map[*watcher]struct{}{}, changed: make(chan struct{})}
	s.dirty.reset()
	s.dirty.full = true // no snapshot on disk yet
	for _, k := range objectview.Kinds {
		s.raw[k] = map[string]objectview.Object{}
		s.served[k] = map[string]*entry{}
	}
	return s
}

func objKey(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}

// Seq is the highest stream sequence applied, of either space.
func (s *Store) Seq() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return max(s.cur[UnitSpace].seq, s.cur[SharedSpace].seq)
}

// SeqOf is the last stream sequence applied of space sp.
func (s *Store) SeqOf(sp Space) uint64 { s.mu.RLock(); defer s.mu.RUnlock(); return s.cur[sp].seq }

// Rev is the current revision.
func (s *Store) Rev() uint64 { s.mu.RLock(); defer s.mu.RUnlock(); return s.rev }

// Changed returns a channel closed at the next change.
func (s *Store) Changed() <-chan struct{} { s.mu.RLock(); defer s.mu.RUnlock(); return s.changed }

// Apply applies one view of space sp at stream sequence seq, which moves
// the space's cursor (0: it stays; the proxy moves it with Advance to what
// its feed verified). A view of another kind (unit views, host records),
// and a view in the wrong space (in the unit's space anything but a Node,
// in the shared space a Node), only advances the space's cursor. A slice or Endpoints whose topology does not decode is
// refused with the error.
func (s *Store) Apply(sp Space, v *atollv1.ObjectView, seq uint64) error {
	kind := v.GetKind()
	_, known := objectview.Kind(kind)
	known = known && (sp == SharedSpace) != (kind == objectview.KindNodes)
	var obj objectview.Object
	if known && !v.GetDeleted() {
		var err error
		if obj, err = objectview.Decode(v); err != nil {
			return err
		}
		if kind == objectview.KindEndpointSlices || kind == objectview.KindEndpoints {
			if _, err := objectview.DecodeEndpointTopology(obj); err != nil {
				return err
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := &s.cur[sp]
	if seq > c.seq {
		c.seq = seq
	}
	if !known {
		s.notify()
		return nil
	}
	k := objKey(v.GetNamespace(), v.GetName())
	if c.reloading != nil {
		c.reloading[objectKey{kind, k}] = struct{}{}
	}
	if obj == nil {
		v = nil
	}
	s.put(sp, kind, k, obj, v)
	s.notify()
	return nil
}

// Admit refuses a view of space sp that a unit peer relayed (the cloud
// signed it, but a peer may replay one) when it would take the store
// back: stamped before the view held of the same object (same uid; the
// cloud stamps each view when it stores it, and views carry no resource
// version), or of an object the store holds as deleted. The cloud's
// replicas stamp with their own clocks: a view stored right after another
// by a replica whose clock is behind is refused too, and the feed then
// takes the hub's copies itself (nothing is lost).
func (s *Store) Admit(sp Space, v *atollv1.ObjectView) error {
	kind, k := v.GetKind(), objKey(v.GetNamespace(), v.GetName())
	s.mu.RLock()
	defer s.mu.RUnlock()
	if held := s.layers[sp].views[kind][k]; held != nil {
		if held.GetUid() == v.GetUid() && v.GetTime().AsTime().Before(held.GetTime().AsTime()) {
			return fmt.Errorf("%s %s: stamped %s, before the view held (%s)", kind, k,
				v.GetTime().AsTime().Format(time.RFC3339Nano), held.GetTime().AsTime().Format(time.RFC3339Nano))
		}
		return nil
	}
	if e := s.served[kind][k]; e != nil && e.deleted && !v.GetDeleted() && string(e.obj.GetUID()) == v.GetUid() {
		return fmt.Errorf("%s %s: the object (uid %s) was deleted", kind, k, v.GetUid())
	}
	return nil
}

// put sets the raw object of kind at k in the layer of space sp (nil:
// deleted) with its view as received, and applies the union's object if
// that changed. Call with mu held.
func (s *Store) put(sp Space, kind, k string, obj objectview.Object, v *atollv1.ObjectView) {
	l := s.layers[sp]
	if obj == nil {
		if _, ok := l.objs[kind][k]; !ok {
			return
		}
		delete(l.objs[kind], k)
		delete(l.views[kind], k)
	} else {
		l.objs[kind][k], l.views[kind][k] = obj, v
	}
	s.dirty.raw[rawKey{sp, objectKey{kind, k}}] = struct{}{}
	if eff := s.union(kind, k); eff != s.raw[kind][k] {
		s.apply(kind, k, eff)
	}
}

// union is the raw object of kind at k: the unit's space's (its Nodes in
// full), else the shared space's; nil when neither has one. Call with mu
// held.
func (s *Store) union(kind, k string) objectview.Object {
	if o, ok := s.layers[UnitSpace].objs[kind][k]; ok {
		return o
	}
	if o, ok := s.layers[SharedSpace].objs[kind][k]; ok {
		return o
	}
	return nil
}

// apply sets the raw object of kind at k (nil: deleted) and recomputes
// what it affects. Call with mu held.
func (s *Store) apply(kind, k string, obj objectview.Object) {
	old := s.raw[kind][k]
	if obj == nil {
		delete(s.raw[kind], k)
	} else {
		s.raw[kind][k] = obj
	}
	if kind == objectview.KindEndpointSlices {
		s.indexSlice(k, old, obj)
	}
	if kind == objectview.KindNodes && k == s.host && obj != nil {
		s.hostLast = obj.GetLabels()
	}
	switch kind {
	case objectview.KindServices:
		s.recompute(kind, k)
		ns, name := splitKey(k)
		for _, sk := range s.slicesOf(ns, name) {
			s.recompute(objectview.KindEndpointSlices, sk)
		}
		s.recompute(objectview.KindEndpoints, k)
	case objectview.KindEndpointSlices:
		svcs := map[string]bool{}
		for _, o := range []objectview.Object{old, obj} {
			if o != nil {
				svcs[o.GetLabels()[discoveryv1.LabelServiceName]] = true
			}
		}
		ns, _ := splitKey(k)
		s.recompute(kind, k)
		for svc := range svcs {
			for _, sk := range s.slicesOf(ns, svc) {
				s.recompute(kind, sk)
			}
		}
	case objectview.KindEndpoints:
		s.recompute(kind, k)
	case objectview.KindNodes:
		s.recompute(kind, k)
		// The host's labels decide the topology filter (and the unit's
		// Nodes' labels that of views from a cloud before the views
		// carried their topology): recompute every slice and Endpoints
		// (only real changes are emitted). The store holds its unit's
		// Nodes only.
		for _, sk := range slices.Sorted(mapKeys(s.raw[objectview.KindEndpointSlices])) {
			s.recompute(objectview.KindEndpointSlices, sk)
		}
		for _, ek := range slices.Sorted(mapKeys(s.raw[objectview.KindEndpoints])) {
			s.recompute(objectview.KindEndpoints, ek)
		}
	}
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func splitKey(k string) (ns, name string) {
	if i := bytes.IndexByte([]byte(k), '/'); i >= 0 {
		return k[:i], k[i+1:]
	}
	return "", k
}

// slicesOf are the keys of the raw slices of Service ns/svc.
func (s *Store) slicesOf(ns, svc string) []string {
	return slices.Sorted(mapKeys(s.bySvc[objKey(ns, svc)]))
}

// indexSlice moves the raw slice at k from old's Service to obj's in
// bySvc (either nil).
func (s *Store) indexSlice(k string, old, obj objectview.Object) {
	if old != nil {
		svc := objKey(old.GetNamespace(), old.GetLabels()[discoveryv1.LabelServiceName])
		delete(s.bySvc[svc], k)
		if len(s.bySvc[svc]) == 0 {
			delete(s.bySvc, svc)
		}
	}
	if obj != nil {
		svc := objKey(obj.GetNamespace(), obj.GetLabels()[discoveryv1.LabelServiceName])
		if s.bySvc[svc] == nil {
			s.bySvc[svc] = map[string]struct{}{}
		}
		s.bySvc[svc][k] = struct{}{}
	}
}

// hostLabels are the labels of the host's Node (its unit's space). A
// host whose Node left the space (it moved to another unit, whose space
// the proxy reads next) keeps its last labels: serving nothing in
// between would be a lie.
func (s *Store) hostLabels() map[string]string {
	if n, ok := s.raw[objectview.KindNodes][s.host]; ok {
		return n.GetLabels()
	}
	return s.hostLast
}

// servedOf derives the served object of kind at k from the raw objects
// (nil: none): the topology filter's choice, without the topology the
// view carried (a detail of the views: kube-proxy sees the object as the
// apiserver holds it, and no event when only a far node's labels change).
func (s *Store) servedOf(kind, k string) objectview.Object {
	raw := s.raw[kind][k]
	if raw == nil {
		return nil
	}
	var served objectview.Object
	switch kind {
	case objectview.KindEndpointSlices:
		sl := raw.(*discoveryv1.EndpointSlice)
		svc, _ := s.raw[objectview.KindServices][objKey(sl.Namespace, sl.Labels[discoveryv1.LabelServiceName])].(*corev1.Service)
		keys := objectview.TopologyKeys(svc)
		if keys == nil {
			served = raw
			break
		}
		// Every slice of the Service: the key chosen is the first with
		// an endpoint near the host in any of them.
		topo := objectview.EndpointTopology{}
		var all []*discoveryv1.EndpointSlice
		for _, sk := range s.slicesOf(sl.Namespace, sl.Labels[discoveryv1.LabelServiceName]) {
			maps.Copy(topo, s.topologyOf(s.raw[kind][sk], keys))
			all = append(all, s.raw[kind][sk].(*discoveryv1.EndpointSlice))
		}
		served = Choose(keys, s.hostLabels(), topo, ReadySlices(all...)).FilterSlice(sl)
	case objectview.KindEndpoints:
		ep := raw.(*corev1.Endpoints)
		svc, _ := s.raw[objectview.KindServices][k].(*corev1.Service)
		keys := objectview.TopologyKeys(svc)
		if keys == nil {
			served = raw
			break
		}
		served = Choose(keys, s.hostLabels(), s.topologyOf(ep, keys), ReadyEndpoints(ep)).FilterEndpoints(ep)
	default:
		return raw
	}
	if _, ok := served.GetAnnotations()[wellknown.EndpointTopologyAnnotation]; ok {
		if served == raw {
			served = raw.DeepCopyObject().(objectview.Object)
		}
		a := maps.Clone(served.GetAnnotations())
		delete(a, wellknown.EndpointTopologyAnnotation)
		if len(a) == 0 {
			a = nil
		}
		served.SetAnnotations(a)
	}
	return served
}

// topologyOf is the topology of obj's endpoints under keys. The nodes
// of the host's unit are judged by their Nodes, which the store holds in
// full (the host by its last labels), so that a relabel changes what is
// served once, when the Node's view arrives, whichever of the Node and
// the endpoints' views the cloud publishes first; other nodes by the
// topology the view carries (a view from a cloud before views carried
// it has none: those nodes match no key).
func (s *Store) topologyOf(obj objectview.Object, keys []string) objectview.EndpointTopology {
	t, _ := objectview.DecodeEndpointTopology(obj) // checked by Apply
	if t == nil {
		t = objectview.EndpointTopology{}
	} else {
		t = maps.Clone(t)
	}
	for _, n := range objectview.EndpointNodes(obj) {
		labels := map[string]string(nil)
		if node, ok := s.raw[objectview.KindNodes][n]; ok {
			labels = node.GetLabels()
		} else if n == s.host && s.hostLast != nil {
			labels = s.hostLast
		} else {
			continue
		}
		if v := objectview.NodeTopology(keys, labels); v != nil {
			t[n] = v
		} else {
			delete(t, n)
		}
	}
	return t
}

// recompute derives the served object of kind at k and records and
// emits a change if it differs from what is served.
func (s *Store) recompute(kind, k string) {
	cur := s.served[kind][k]
	obj := s.servedOf(kind, k)
	if obj == nil {
		if cur == nil || cur.deleted {
			return
		}
		s.rev++
		last := withRV(cur.obj, s.rev)
		old := cur.obj
		cur.obj, cur.rv, cur.deleted, cur.view = last, s.rev, true, encoded(kind, last)
		s.dirty.served[objectKey{kind, k}] = struct{}{}
		s.tombstones++
		s.emit(Event{Type: watch.Deleted, Kind: kind, Obj: last, Old: old, RV: s.rev})
		s.prune(kind)
		return
	}
	fp := digest(kind, obj)
	if cur != nil && !cur.deleted && cur.fp == fp {
		return
	}
	s.rev++
	served := withRV(obj, s.rev)
	ev := Event{Type: watch.Modified, Kind: kind, Obj: served, RV: s.rev}
	if cur == nil || cur.deleted {
		ev.Type = watch.Added
		if cur != nil {
			s.tombstones--
		}
		cur = &entry{created: s.rev}
		s.served[kind][k] = cur
	} else {
		ev.Old = cur.obj
	}
	cur.obj, cur.fp, cur.rv, cur.deleted, cur.view = served, fp, s.rev, false, encoded(kind, served)
	s.dirty.served[objectKey{kind, k}] = struct{}{}
	s.emit(ev)
}

// prune drops the oldest tombstones beyond maxTombstones; resuming from
// before the newest dropped is then answered 410 Gone.
func (s *Store) prune(kind string) {
	for s.tombstones > s.maxTombstones {
		var oldestKind, oldestKey string
		var oldest uint64
		for kd, m := range s.served {
			for k, e := range m {
				if e.deleted && (oldest == 0 || e.rv < oldest) {
					oldest, oldestKind, oldestKey = e.rv, kd, k
				}
			}
		}
		if oldest == 0 {
			return
		}
		delete(s.served[oldestKind], oldestKey)
		delete(s.dirty.served, objectKey{oldestKind, oldestKey})
		s.dirty.pruned[objectKey{oldestKind, oldestKey}] = struct{}{}
		s.tombstones--
		if oldest > s.compacted {
			s.compacted = oldest
		}
	}
}

func withRV(obj objectview.Object, rv uint64) objectview.Object {
	c := obj.DeepCopyObject().(objectview.Object)
	c.SetResourceVersion(strconv.FormatUint(rv, 10))
	return c
}

// encoded is obj's view, encoded once when it changes so that saving the
// state does not encode every object again (nil: it failed; saving then
// tries again and reports the error).
func encoded(kind string, obj objectview.Object) *atollv1.ObjectView {
	v, err := objectview.Encode(kind, obj)
	if err != nil {
		return nil
	}
	return v
}

// digest is the fingerprint of obj's content without its resource
// version.
func digest(kind string, obj objectview.Object) string {
	c := obj.DeepCopyObject().(objectview.Object)
	c.SetResourceVersion("")
	v, err := objectview.Encode(kind, c)
	if err != nil {
		return fmt.Sprint("unencodable-", err)
	}
	sum := sha256.Sum256(v.GetObject())
	return hex.EncodeToString(sum[:16])
}

// notify wakes the persistence loop. Call with mu held.
func (s *Store) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// List returns the served live objects of kind matching m, and the
// current revision.
func (s *Store) List(kind string, m match) ([]objectview.Object, uint64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []objectview.Object
	for _, k := range slices.Sorted(mapKeys(s.served[kind])) {
		e := s.served[kind][k]
		if !e.deleted && m.matches(e.obj) {
			out = append(out, e.obj)
		}
	}
	return out, s.rev
}

// Get returns the served object of kind at namespace/name.
func (s *Store) Get(kind, namespace, name string) (objectview.Object, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	e, ok := s.served[kind][objKey(namespace, name)]
	if !ok || e.deleted {
		return nil, false
	}
	return e.obj, true
}
