package proxy

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/atoll-edge/atoll/internal/objectview"
	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// TestSpaces: the unit's space gives the Nodes (in full), the shared
// space everything else; a view in the wrong space (a Node in the shared
// space, a shared kind in the unit's space) only advances its space's
// cursor; each space keeps its own cursor, on disk too.
func TestSpaces(t *testing.T) {
	s := NewStore("a1", 100, nil)
	_, _, ch, stop, err := s.Watch(objectview.KindNodes, match{}, s.Rev(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	apply := func(sp Space, v *atollv1.ObjectView, seq uint64) {
		t.Helper()
		if err := s.Apply(sp, v, seq); err != nil {
			t.Fatal(err)
		}
	}
	full := testNode("a1", map[string]string{zone: "A"})
	full.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}}
	apply(SharedSpace, view(t, objectview.KindNodes, testNode("b1", map[string]string{zone: "B"})), 1)
	apply(UnitSpace, view(t, objectview.KindNodes, full), 2)
	apply(SharedSpace, view(t, objectview.KindNodes, testNode("a1", map[string]string{zone: "B"})), 3)
	if n, ok := s.Get(objectview.KindNodes, "", "a1"); !ok || len(n.(*corev1.Node).Status.Addresses) == 0 || n.GetLabels()[zone] != "A" {
		t.Fatalf("a1 served as %v, want the unit's full Node", n)
	}
	if _, ok := s.Get(objectview.KindNodes, "", "b1"); ok {
		t.Fatal("a Node of the shared space is served")
	}
	if got := eventNames(collect(ch)); fmt.Sprint(got) != fmt.Sprint([]string{string(watch.Added) + " a1"}) {
		t.Fatalf("events %v, want one ADDED of a1", got)
	}
	if s.SeqOf(UnitSpace) != 2 || s.SeqOf(SharedSpace) != 3 || s.Seq() != 3 {
		t.Fatalf("cursors unit %d shared %d max %d", s.SeqOf(UnitSpace), s.SeqOf(SharedSpace), s.Seq())
	}
	feed(t, s, testService("web", "", false))
	// Kept on disk with both cursors and both layers.
	dir := t.TempDir()
	save(t, s, dir)
	l, st := loaded(t, dir)
	if l.SeqOf(UnitSpace) != 2 || l.SeqOf(SharedSpace) != 4 || len(st.GetRaw()) != 1 || len(st.GetSharedRaw()) != 1 || st.GetLayout() != StateLayout {
		t.Fatalf("loaded: unit %d shared %d, raw %d shared %d, layout %d", l.SeqOf(UnitSpace), l.SeqOf(SharedSpace), len(st.GetRaw()), len(st.GetSharedRaw()), st.GetLayout())
	}
	if n, _ := l.Get(objectview.KindNodes, "", "a1"); n == nil || n.GetLabels()[zone] != "A" {
		t.Fatalf("loaded a1 served as %v", n)
	}
	// The unit's Node goes.
	apply(UnitSpace, &atollv1.ObjectView{Kind: objectview.KindNodes, Name: "a1", Deleted: true}, 5)
	if n, ok := s.Get(objectview.KindNodes, "", "a1"); ok {
		t.Fatalf("a1 served as %v after its tombstone", n)
	}
	// A new unit: its space is read from its start (a reload, as the
	// follower does it), the old unit's Nodes served until that read
	// ends; the shared space stays.
	apply(UnitSpace, view(t, objectview.KindNodes, full), 6)
	collect(ch)
	s.Reset("u2")
	if _, ok := s.Get(objectview.KindNodes, "", "a1"); !ok {
		t.Fatal("right after a new unit the old unit's a1 is not served")
	}
	if _, ok := s.Get(objectview.KindServices, "default", "web"); !ok {
		t.Fatal("after a new unit the shared space's Service is not served")
	}
	if s.SeqOf(UnitSpace) != 0 || s.SeqOf(SharedSpace) != 4 || !s.Holds(UnitSpace) {
		t.Fatalf("after a new unit: cursors unit %d shared %d, holds %v", s.SeqOf(UnitSpace), s.SeqOf(SharedSpace), s.Holds(UnitSpace))
	}
	s.BeginReload(UnitSpace)
	apply(UnitSpace, view(t, objectview.KindNodes, testNode("c1", map[string]string{zone: "C"})), 7)
	if gone := s.EndReload(UnitSpace, 1); gone != 1 {
		t.Fatalf("the new unit's read deleted %d objects, want 1 (a1)", gone)
	}
	if got := eventNames(collect(ch)); fmt.Sprint(got) != fmt.Sprint([]string{string(watch.Added) + " c1", string(watch.Deleted) + " a1"}) {
		t.Fatalf("events %v, want c1 ADDED, then a1 DELETED", got)
	}
	// Views of the shared kinds in the unit's space (the old layout) only
	// advance its cursor.
	apply(UnitSpace, view(t, objectview.KindServices, testService("api", "", false)), 8)
	if _, ok := s.Get(objectview.KindServices, "default", "api"); ok || s.SeqOf(UnitSpace) != 8 {
		t.Fatalf("a Service in the unit's space was served (or its cursor not advanced: %d)", s.SeqOf(UnitSpace))
	}
}

// TestTopologyFromViews: the filter reads the other nodes' labels from
// the topology the endpoints' views carry, not from any Node; the served
// object is without it; a change of a far node's topology that changes
// no choice emits nothing; a view without one (from a cloud before)
// falls back to the Nodes the store holds; a topology that does not
// decode is refused with an error naming the object.
func TestTopologyFromViews(t *testing.T) {
	s := NewStore("a1", 100, nil)
	feed(t, s, testNode("a1", map[string]string{zone: "A"}), testService("web", zone, false))
	_, _, ch, stop, err := s.Watch(objectview.KindEndpointSlices, match{}, s.Rev(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	withTopo := func(sl objectview.Object, topo string) *atollv1.ObjectView {
		sl.SetAnnotations(map[string]string{wellknown.EndpointTopologyAnnotation: topo})
		return view(t, objectview.KindEndpointSlices, sl)
	}
	apply := func(v *atollv1.ObjectView) error { return s.Apply(SharedSpace, v, s.Seq()+1) }
	// a2 and b1 are Nodes this store never holds.
	if err := apply(withTopo(testSlice("web-1", "web", "a2", "b1"), `{"a2":{"zone":"A"},"b1":{"zone":"B"}}`)); err != nil {
		t.Fatal(err)
	}
	if got := servedNodes(t, s, "web-1"); fmt.Sprint(got) != "[a2]" {
		t.Fatalf("web-1 serves %v, want [a2]", got)
	}
	o, _ := s.Get(objectview.KindEndpointSlices, "default", "web-1")
	if _, ok := o.GetAnnotations()[wellknown.EndpointTopologyAnnotation]; ok {
		t.Fatal("the served slice carries the view's topology")
	}
	collect(ch)
	// b1 moves to zone C: the choice is the same, nothing is emitted.
	if err := apply(withTopo(testSlice("web-1", "web", "a2", "b1"), `{"a2":{"zone":"A"},"b1":{"zone":"C"}}`)); err != nil {
		t.Fatal(err)
	}
	if evs := collect(ch); len(evs) != 0 {
		t.Fatalf("a far node's change emitted %v", eventNames(evs))
	}
	// a2 moves to B: a2 no longer near.
	if err := apply(withTopo(testSlice("web-1", "web", "a2", "b1"), `{"a2":{"zone":"B"},"b1":{"zone":"C"}}`)); err != nil {
		t.Fatal(err)
	}
	if got := servedNodes(t, s, "web-1"); len(got) != 0 {
		t.Fatalf("web-1 serves %v, want none", got)
	}
	// A view without topology: the Nodes the store holds decide.
	if err := apply(view(t, objectview.KindEndpointSlices, testSlice("web-1", "web", "a1", "b1"))); err != nil {
		t.Fatal(err)
	}
	if got := servedNodes(t, s, "web-1"); fmt.Sprint(got) != "[a1]" {
		t.Fatalf("web-1 without topology serves %v, want [a1]", got)
	}
	// A topology that does not decode.
	err = apply(withTopo(testSlice("web-1", "web", "b1"), `{"b1":`))
	if err == nil || !strings.Contains(err.Error(), wellknown.EndpointTopologyAnnotation) || !strings.Contains(err.Error(), "web-1") {
		t.Fatalf("a broken topology: %v", err)
	}
	if got := servedNodes(t, s, "web-1"); fmt.Sprint(got) != "[a1]" {
		t.Fatalf("after a broken view web-1 serves %v, want [a1] as before", got)
	}
}

// TestStateOfAnotherLayout: a kept state of another layout than this
// proxy writes is not read, and the error names both layouts; the proxy
// then reads its views from the hub again.
func TestStateOfAnotherLayout(t *testing.T) {
	s := NewStore("a1", 100, nil)
	feed(t, s, testNode("a1", map[string]string{zone: "A"}))
	for _, layout := range []uint32{0, StateLayout + 1} {
		st := snapshotOf(t, s)
		st.Layout = layout
		err := NewStore("a1", 100, nil).Restore(st)
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("layout %d, not %d", layout, StateLayout)) {
			t.Fatalf("a state of layout %d: %v", layout, err)
		}
	}
}
