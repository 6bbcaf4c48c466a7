package health

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

func TestUnitSizes(t *testing.T) {
	u := newUnitSizes("atoll.io/unit")
	h := u.handler()
	node := func(name, unit string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if unit != "" {
			n.Labels = map[string]string{"atoll.io/unit": unit}
		}
		return n
	}
	want := func(step string, sizes map[string]int) {
		t.Helper()
		for unit, n := range sizes {
			if got := u.of(unit); got != n {
				t.Errorf("%s: unit %s has %d members, want %d", step, unit, got, n)
			}
		}
	}
	h.OnAdd(node("a", "u1"), true)
	h.OnAdd(node("b", "u1"), true)
	h.OnAdd(node("c", ""), true)
	want("added", map[string]int{"u1": 2, "": 0})
	h.OnUpdate(node("a", "u1"), node("a", "u1")) // a status update
	want("updated in place", map[string]int{"u1": 2})
	h.OnUpdate(node("b", "u1"), node("b", "u2"))
	want("moved", map[string]int{"u1": 1, "u2": 1})
	if got := u.unitOfNode("b"); got != "u2" {
		t.Errorf("moved: b is in %q, want u2", got)
	}
	if got := u.unitOfNode("nobody"); got != "" {
		t.Errorf("an unknown node is in %q, want none", got)
	}
	h.OnUpdate(node("c", ""), node("c", "u2"))
	want("labelled", map[string]int{"u2": 2})
	h.OnUpdate(node("a", "u1"), node("a", ""))
	want("unlabelled", map[string]int{"u1": 0, "u2": 2})
	if got := u.unitOfNode("a"); got != "" {
		t.Errorf("unlabelled: a is in %q, want none", got)
	}
	h.OnDelete(node("b", "u2"))
	// A deletion the informer missed arrives as a tombstone, with the
	// object as last seen.
	h.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "c", Obj: node("c", "u2")})
	want("deleted", map[string]int{"u2": 0})
	h.OnDelete(node("gone", "u3")) // never seen: nothing to undo
	want("unknown deleted", map[string]int{"u3": 0})
	if len(u.size) != 0 || len(u.unitOf) != 0 {
		t.Errorf("empty units and deleted nodes are still kept: %v %v", u.size, u.unitOf)
	}
}
