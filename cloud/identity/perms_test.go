package identity

import (
	"slices"
	"testing"

	"github.com/atoll-edge/atoll/events"
)

// TestEdgePermissionsHealth: an edge may publish its own ballot only, in
// its own unit; it may neither publish nor hear probe reports or single
// votes over its leaf link (they stay inside the unit), nor hear anyone's
// ballots. The hub's enforcement of these is TestEdgePermissions in
// cloud/hub.
func TestEdgePermissionsHealth(t *testing.T) {
	p, err := EdgePermissions("a", "u1", "hub")
	if err != nil {
		t.Fatal(err)
	}
	matches := func(list []string, subject string) bool {
		return slices.ContainsFunc(list, func(f string) bool { return events.SubjectMatches(f, subject) })
	}
	own, _ := events.BallotSubject("u1", "a")
	if !matches(p.Pub.Allow, own) {
		t.Errorf("a may not publish its ballot %s: %v", own, p.Pub.Allow)
	}
	for _, s := range []string{"atoll.health.ballot.u1.b", "atoll.health.ballot.u2.a", "atoll.health.probe.u1.a", "atoll.health.vote.u1.b.a"} {
		if matches(p.Pub.Allow, s) {
			t.Errorf("a may publish %s", s)
		}
	}
	for _, s := range []string{"atoll.health.ballot.u1.b", "atoll.health.probe.u1.b", "atoll.health.vote.u1.a.b"} {
		if matches(p.Sub.Allow, s) {
			t.Errorf("a may hear %s", s)
		}
	}
}
