package units

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// TestIndex: the index follows a Node informer's events: nodes added,
// moved, labelled and unlabelled, deleted (also as a tombstone); a node
// the rule excludes is in no unit, whatever its unit label.
func TestIndex(t *testing.T) {
	u := NewIndex(DefaultRule())
	h := u.Handler()
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
			if got := u.Size(unit); got != n {
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
	if got := u.UnitOf("b"); got != "u2" {
		t.Errorf("moved: b is in %q, want u2", got)
	}
	if got := u.UnitOf("nobody"); got != "" {
		t.Errorf("an unknown node is in %q, want none", got)
	}
	h.OnUpdate(node("c", ""), node("c", "u2"))
	want("labelled", map[string]int{"u2": 2})
	h.OnUpdate(node("a", "u1"), node("a", ""))
	want("unlabelled", map[string]int{"u1": 0, "u2": 2})
	if got := u.UnitOf("a"); got != "" {
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
	cp := node("cp", "u1")
	cp.Labels["node-role.kubernetes.io/control-plane"] = ""
	h.OnAdd(cp, true)
	want("excluded", map[string]int{"u1": 0})
}

// TestRule: the unit of a Node, from its labels.
func TestRule(t *testing.T) {
	r := DefaultRule()
	tests := []struct {
		name   string
		labels map[string]string
		want   string
		bad    bool // the value names no unit
	}{
		{"member", map[string]string{"atoll.io/unit": "site-a"}, "site-a", false},
		{"no label", map[string]string{"other": "x"}, "", false},
		{"empty value", map[string]string{"atoll.io/unit": ""}, "", false},
		{"control plane", map[string]string{"atoll.io/unit": "site-a", "node-role.kubernetes.io/control-plane": ""}, "", false},
		{"master", map[string]string{"atoll.io/unit": "site-a", "node-role.kubernetes.io/master": "true"}, "", false},
		{"cloud node", map[string]string{"atoll.io/unit": "site-a", "atoll.io/cloud": "true"}, "", false},
		{"the shared space's name", map[string]string{"atoll.io/unit": "_all"}, "", true},
		{"the hub's cluster name", map[string]string{"atoll.io/unit": "atoll-hub"}, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := r.Check(tt.labels)
			if got != tt.want || (err != nil) != tt.bad {
				t.Fatalf("Check = %q, %v; want %q, bad %v", got, err, tt.want, tt.bad)
			}
			if got := r.UnitOf(tt.labels); got != tt.want {
				t.Fatalf("UnitOf = %q, want %q", got, tt.want)
			}
		})
	}
	for _, bad := range []Rule{{}, {Label: "a", Exclude: []string{""}}, {Label: "a", Exclude: []string{"a"}}} {
		if bad.Validate() == nil {
			t.Errorf("%+v validates", bad)
		}
	}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
}
