package proxy

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/atoll-edge/atoll/internal/objectview"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// TestSpacesUnion: a Node of the unit's space (in full) is served over
// the shared space's stripped one of the same name, whatever arrives
// first; a change of the stripped one under it emits nothing; when the
// unit's goes (a tombstone, or a new unit) the stripped one is served
// again; each space keeps its own cursor, on disk too.
func TestSpacesUnion(t *testing.T) {
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
	apply(SharedSpace, view(t, objectview.KindNodes, testNode("a1", map[string]string{zone: "A"})), 1)
	apply(UnitSpace, view(t, objectview.KindNodes, full), 2)
	apply(SharedSpace, view(t, objectview.KindNodes, testNode("a1", map[string]string{zone: "B"})), 3)
	n, ok := s.Get(objectview.KindNodes, "", "a1")
	if !ok || len(n.(*corev1.Node).Status.Addresses) == 0 || n.GetLabels()[zone] != "A" {
		t.Fatalf("a1 served as %v, want the unit's full Node", n)
	}
	if got := eventNames(collect(ch)); len(got) != 2 || got[0] != string(watch.Added)+" a1" || got[1] != string(watch.Modified)+" a1" {
		t.Fatalf("events %v, want ADDED then one MODIFIED (stripped → full)", got)
	}
	if s.SeqOf(UnitSpace) != 2 || s.SeqOf(SharedSpace) != 3 || s.Seq() != 3 {
		t.Fatalf("cursors unit %d shared %d max %d", s.SeqOf(UnitSpace), s.SeqOf(SharedSpace), s.Seq())
	}
	// Kept on disk with both cursors and both layers.
	dir := t.TempDir()
	save(t, s, dir)
	l, st := loaded(t, dir)
	if l.SeqOf(UnitSpace) != 2 || l.SeqOf(SharedSpace) != 3 || len(st.GetRaw()) != 1 || len(st.GetSharedRaw()) != 1 || st.GetLayout() != StateLayout {
		t.Fatalf("loaded: unit %d shared %d, raw %d shared %d, layout %d", l.SeqOf(UnitSpace), l.SeqOf(SharedSpace), len(st.GetRaw()), len(st.GetSharedRaw()), st.GetLayout())
	}
	if n, _ := l.Get(objectview.KindNodes, "", "a1"); n == nil || n.GetLabels()[zone] != "A" {
		t.Fatalf("loaded a1 served as %v", n)
	}
	// The unit's Node goes: the stripped one is served again.
	apply(UnitSpace, &atollv1.ObjectView{Kind: objectview.KindNodes, Name: "a1", Deleted: true}, 4)
	if n, ok := s.Get(objectview.KindNodes, "", "a1"); !ok || n.GetLabels()[zone] != "B" || len(n.(*corev1.Node).Status.Addresses) != 0 {
		t.Fatalf("a1 served as %v, want the shared stripped Node", n)
	}
	// A new unit: its space is read from its start; the shared one stays.
	apply(UnitSpace, view(t, objectview.KindNodes, full), 5)
	s.Reset("u2")
	if n, ok := s.Get(objectview.KindNodes, "", "a1"); !ok || n.GetLabels()[zone] != "B" {
		t.Fatalf("after a new unit a1 served as %v, want the shared stripped Node", n)
	}
	if s.SeqOf(UnitSpace) != 0 || s.SeqOf(SharedSpace) != 3 {
		t.Fatalf("after a new unit: cursors unit %d shared %d", s.SeqOf(UnitSpace), s.SeqOf(SharedSpace))
	}
	// Views of the shared kinds in the unit's space (the old layout) only
	// advance its cursor.
	apply(UnitSpace, view(t, objectview.KindServices, testService("web", "", false)), 6)
	if _, ok := s.Get(objectview.KindServices, "default", "web"); ok || s.SeqOf(UnitSpace) != 6 {
		t.Fatalf("a Service in the unit's space was served (or its cursor not advanced: %d)", s.SeqOf(UnitSpace))
	}
}
