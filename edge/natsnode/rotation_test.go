package natsnode_test

import (
	"errors"
	"testing"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestRotatedRouteCredentials: when a unit's members get new route
// credentials (the cloud rotates them when c leaves), they route to each
// other again and keep exchanging messages, while c, still holding the old
// password and still listing them as peers, is refused: it loses its
// routes and cannot open new ones.
func TestRotatedRouteCredentials(t *testing.T) {
	h := natstest.Hub(t)
	unit := natstest.Unit(t, h, "u1", natstest.EdgeOptions{}, "a", "b", "c")
	a, b, c := unit[0], unit[1], unit[2]
	waitLinks(t, true, unit)
	old := natstest.MeshOf("u1", a, b, c)
	if err := natstest.RouteConnect(t, a, "u1", old.User, old.Password); err != nil {
		t.Fatalf("before the rotation a refuses the unit's credentials: %v", err)
	}

	rotated := natstest.MeshOf("u1", a, b)
	rotated.Password = "rotated-" + old.Password
	for _, n := range []*natsnode.Node{a, b} {
		if err := n.SetMesh(rotated); err != nil {
			t.Fatal(err)
		}
	}
	// c keeps the old password and its old peers, and keeps trying.
	waitLinks(t, true, []*natsnode.Node{a, b}, []*natsnode.Node{c})
	for _, n := range []*natsnode.Node{a, b} {
		if err := natstest.RouteConnect(t, n, "u1", old.User, old.Password); !errors.Is(err, natstest.ErrRouteRefused) {
			t.Fatalf("%s with the old password: %v, want refused", n.Name(), err)
		}
		if err := natstest.RouteConnect(t, n, "u1", rotated.User, rotated.Password); err != nil {
			t.Fatalf("%s with the new password: %v", n.Name(), err)
		}
		if got := n.Status().RouteRotations; got != 1 {
			t.Errorf("%s counted %d rotations, want 1", n.Name(), got)
		}
	}
	if got := c.Mesh().Password; got != old.Password {
		t.Fatalf("c's password changed: the test lost its intruder")
	}

	// a and b still exchange messages over their routes.
	ncA, ncB := connect(t, a), connect(t, b)
	subj, _ := probe("u1", "a", 0)
	atB := subscribe(t, ncB, subj)
	var seq uint64
	poll.Eventually(t, settle, func() error {
		seq++
		publish(t, ncA, "u1", "a", seq)
		if atB.n.Load() == 0 {
			return errors.New("b received none of a's reports")
		}
		return nil
	})
}
