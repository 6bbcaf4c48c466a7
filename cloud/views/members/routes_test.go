package members

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/test/poll"
)

const routeURL = "nats-route://10.0.0.1:6222"

// passwords returns each node's assigned route password as stored.
func (f *hubFixture) passwords(t *testing.T, nodes ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, n := range nodes {
		a := f.storedAssignment(t, n)
		if a.GetRoutePassword() != "" && a.GetRouteUser() != routeUser(a.GetUnit()) {
			t.Fatalf("assignment of %s: route user %q, want %q", n, a.GetRouteUser(), routeUser(a.GetUnit()))
		}
		out[n] = a.GetRoutePassword()
	}
	return out
}

// TestRoutePasswordRotatesWhenAMemberLeaves: the unit's members share one
// password, no other unit has it and no view carries it; a member joining
// keeps it, a member leaving rotates it for those who remain (the departed
// node's assignment carries none), and a unit that empties and fills again
// never hands out a password a former member knew.
func TestRoutePasswordRotatesWhenAMemberLeaves(t *testing.T) {
	f := newHubFixture(t)
	s := f.svc
	ctx := context.Background()
	observe := func(node, unit string) {
		s.observe(report(node, unit, "10.0.0.1", routeURL, nil), time.Now())
		if err := s.publish(ctx); err != nil {
			t.Fatal(err)
		}
	}
	observe("a", "u1")
	observe("b", "u1")
	observe("c", "u1")
	observe("x", "u2")
	observe("lone", "")
	p := f.passwords(t, "a", "b", "c", "x", "lone")
	p1 := p["a"]
	if len(p1) < 32 || p["b"] != p1 || p["c"] != p1 {
		t.Fatalf("u1 members' passwords = %v, want one shared password", p)
	}
	if p["x"] == "" || p["x"] == p1 {
		t.Fatalf("u2's password %q, want its own", p["x"])
	}
	if p["lone"] != "" || f.storedAssignment(t, "lone").GetRouteUser() != "" {
		t.Fatal("a node in no unit got route credentials")
	}
	// No view carries a password.
	for _, unit := range []string{"u1", "u2"} {
		subj, _ := events.UnitViewSubject(unit)
		raw, err := f.views.GetLastMsgForSubject(ctx, subj)
		if err != nil {
			t.Fatal(err)
		}
		for _, pw := range []string{p1, p["x"]} {
			if bytes.Contains(raw.Data, []byte(pw)) {
				t.Fatalf("view of %s carries a route password", unit)
			}
		}
	}

	// d joins: same password.
	observe("d", "u1")
	if got := f.passwords(t, "d")["d"]; got != p1 {
		t.Fatalf("joining member's password changed the unit's: %q, want %q", got, p1)
	}
	if n := counter(t, s.metrics.rotations); n != 0 {
		t.Fatalf("rotations after a join = %v", n)
	}

	// c leaves: a, b and d get a new password; c gets none.
	observe("c", "")
	p = f.passwords(t, "a", "b", "c", "d", "x")
	p2 := p["a"]
	if p2 == p1 || p["b"] != p2 || p["d"] != p2 {
		t.Fatalf("after c left: %v, want a new password shared by a, b, d (old %q)", p, p1)
	}
	if p["c"] != "" {
		t.Fatal("the departed node still gets route credentials")
	}
	if p["x"] == p2 {
		t.Fatal("u2 shares u1's password")
	}
	if n := counter(t, s.metrics.rotations); n != 1 {
		t.Fatalf("rotations after one departure = %v, want 1", n)
	}
	// The stored entry lists who holds the password.
	e, err := s.kv.Get(ctx, "u1")
	if err != nil {
		t.Fatal(err)
	}
	var rs routeSecret
	if err := json.Unmarshal(e.Value(), &rs); err != nil || fmt.Sprint(rs.Members) != "[a b d]" || rs.Password != p2 {
		t.Fatalf("stored entry %s (%v), want members [a b d] and the new password", e.Value(), err)
	}

	// Everyone leaves u1, then e joins it: e never gets a password that
	// a, b, c or d knew.
	for _, n := range []string{"a", "b", "d"} {
		observe(n, "")
	}
	observe("e", "u1")
	if got := f.passwords(t, "e")["e"]; got == p1 || got == p2 || got == "" {
		t.Fatalf("e joined an emptied unit and got %q (old %q, %q)", got, p1, p2)
	}
}

// TestRoutePasswordReplicasAgree: two replicas see a member leave; they
// agree on one new password (compare-and-set on the bucket), each learns
// the other's writes through its watch, and their assignments end equal.
func TestRoutePasswordReplicasAgree(t *testing.T) {
	f := newHubFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r1, r2 := f.svc, newDeclared(t, f.svc.bus)
	for _, r := range []*Service{r1, r2} {
		go r.watchSecrets(ctx)
		for _, n := range []string{"a", "b", "c"} {
			r.observe(report(n, "u1", "10.0.0.1", routeURL, nil), time.Now())
		}
	}
	for _, r := range []*Service{r1, r2} {
		if err := r.publish(ctx); err != nil {
			t.Fatal(err)
		}
	}
	p1 := f.passwords(t, "a")["a"]
	for _, r := range []*Service{r2, r1} { // r2 first: r1's cache is the stale one
		r.observe(report("c", "", "10.0.0.1", "", nil), time.Now())
		if err := r.publish(ctx); err != nil {
			t.Fatal(err)
		}
	}
	p := f.passwords(t, "a", "b")
	if p["a"] == p1 || p["a"] != p["b"] {
		t.Fatalf("after c left: %v (old %q)", p, p1)
	}
	if n := counter(t, r1.metrics.rotations) + counter(t, r2.metrics.rotations); n != 1 {
		t.Fatalf("the replicas rotated %v times for one departure, want 1", n)
	}
	// A later write by one replica reaches the other's cache.
	poll.Eventually(t, 5*time.Second, func() error {
		for i, r := range []*Service{r1, r2} {
			r.mu.Lock()
			got := r.secrets["u1"].Password
			r.mu.Unlock()
			if got != p["a"] {
				return fmt.Errorf("replica %d caches %q, want %q", i+1, got, p["a"])
			}
		}
		return nil
	})
}

// TestRoutePasswordUndecodableIsReplaced: a bucket entry that does not
// decode (here a bare password, with no member list) is replaced at once,
// since nobody can tell who holds it.
func TestRoutePasswordUndecodableIsReplaced(t *testing.T) {
	f := newHubFixture(t)
	s := f.svc
	ctx := context.Background()
	if _, err := s.kv.Create(ctx, "u1", []byte("0123456789abcdef")); err != nil {
		t.Fatal(err)
	}
	s.observe(report("a", "u1", "10.0.0.1", routeURL, nil), time.Now())
	if err := s.publish(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.passwords(t, "a")["a"]; got == "0123456789abcdef" || got == "" {
		t.Fatalf("password %q, want a new one", got)
	}
	if n := counter(t, s.metrics.rotations); n != 1 {
		t.Fatalf("rotations = %v, want 1", n)
	}
}

// staticKeys is a NodeKeys over a fixed map.
type staticKeys struct {
	keys   map[string]string
	notify []func()
}

func (k *staticKeys) NodeKey(node string) (string, bool) { pub, ok := k.keys[node]; return pub, ok }
func (k *staticKeys) NotifyKeys(f func())                { k.notify = append(k.notify, f) }

// TestViewsCarryNodeKeys: each member's identity key is in its unit view;
// a member with no known key (or a malformed one, counted) is published
// without; a key change pokes the service.
func TestViewsCarryNodeKeys(t *testing.T) {
	f := newHubFixture(t)
	s := f.svc
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	keys := &staticKeys{keys: map[string]string{"a": pub, "b": "not-a-key"}}
	s.SetNodeKeys(keys)
	for _, n := range []string{"a", "b", "c"} {
		s.observe(report(n, "u1", "10.0.0.1", routeURL, nil), time.Now())
	}
	<-s.changed // drain the observe pokes
	if err := s.publish(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, m := range f.storedView(t, "u1").GetMembers() {
		got[m.GetName()] = m.GetNodeKey()
	}
	if got["a"] != pub || got["b"] != "" || got["c"] != "" {
		t.Fatalf("node keys in the view = %v, want a's key only", got)
	}
	if n := counter(t, s.metrics.rejected.WithLabelValues(reasonNodeKey)); n != 1 {
		t.Fatalf("rejected node keys = %v, want 1", n)
	}
	if len(keys.notify) != 1 {
		t.Fatalf("%d key watchers registered, want 1", len(keys.notify))
	}
	keys.notify[0]()
	select {
	case <-s.changed:
	default:
		t.Fatal("a key change did not poke the service")
	}
}

// TestRoutePasswordSurvivesRestartMidRotation: a replica rotates the
// password in the bucket and dies before publishing any assignment; a
// fresh replica hands out that password (no second rotation), and the
// departed node is not among those who hold it.
func TestRoutePasswordSurvivesRestartMidRotation(t *testing.T) {
	f := newHubFixture(t)
	ctx := context.Background()
	first := f.svc
	for _, n := range []string{"a", "b", "c"} {
		first.observe(report(n, "u1", "10.0.0.1", routeURL, nil), time.Now())
	}
	if err := first.publish(ctx); err != nil {
		t.Fatal(err)
	}
	p1 := f.passwords(t, "a")["a"]
	// c leaves; the first replica rotates, then stops before publishing.
	p2, err := first.secret(ctx, "u1", []string{"a", "b"})
	if err != nil || p2 == p1 {
		t.Fatalf("rotation: %q, %v (old %q)", p2, err, p1)
	}
	if got := f.passwords(t, "a")["a"]; got != p1 {
		t.Fatal("the assignment changed before any publication")
	}

	second := newDeclared(t, first.bus)
	second.observe(report("a", "u1", "10.0.0.1", routeURL, nil), time.Now())
	second.observe(report("b", "u1", "10.0.0.1", routeURL, nil), time.Now())
	second.observe(report("c", "", "10.0.0.1", "", nil), time.Now())
	if err := second.publish(ctx); err != nil {
		t.Fatal(err)
	}
	p := f.passwords(t, "a", "b", "c")
	if p["a"] != p2 || p["b"] != p2 || p["c"] != "" {
		t.Fatalf("after the restart: %v, want a and b on %q, c on none", p, p2)
	}
	if n := counter(t, second.metrics.rotations); n != 0 {
		t.Fatalf("the fresh replica rotated %v times", n)
	}
}
