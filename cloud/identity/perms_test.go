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

// TestEdgePermissionsTunnelRelay: a node may relay tunnel sessions only in
// its own namespace (it hears atoll.tunnel.<itself>.relay.*.*.in and
// answers on .out), may not answer for the node it relays directly, and
// may neither send nor hear the unit legs over its leaf link.
func TestEdgePermissionsTunnelRelay(t *testing.T) {
	p, err := EdgePermissions("b", "u1", "hub")
	if err != nil {
		t.Fatal(err)
	}
	matches := func(list []string, subject string) bool {
		return slices.ContainsFunc(list, func(f string) bool { return events.SubjectMatches(f, subject) })
	}
	subj := func(s string, err error) string {
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	relayOut := subj(events.TunnelRelaySubject("b", "a", "s1", events.ToCloud))
	relayIn := subj(events.TunnelRelaySubject("b", "a", "s1", events.ToEdge))
	if !matches(p.Pub.Allow, relayOut) || !matches(p.Sub.Allow, relayIn) {
		t.Errorf("b may not relay in its own namespace: pub %v sub %v", p.Pub.Allow, p.Sub.Allow)
	}
	for _, s := range []string{
		subj(events.TunnelRelaySubject("c", "a", "s1", events.ToCloud)), // another peer's namespace
		subj(events.TunnelRelaySubject("b", "a", "s1", events.ToEdge)),  // the cloud's direction
		subj(events.TunnelSubject("a", "s1", events.ToCloud)),           // the relayed node's own subject
		subj(events.UnitRelaySubject("u1", "b", "a", "s1", events.ToCloud)),
		subj(events.UnitRelaySubject("u1", "b", "a", "s1", events.ToEdge)),
	} {
		if matches(p.Pub.Allow, s) {
			t.Errorf("b may publish %s", s)
		}
	}
	for _, s := range []string{
		subj(events.TunnelRelaySubject("c", "a", "s1", events.ToEdge)),
		subj(events.TunnelRelaySubject("b", "a", "s1", events.ToCloud)),
		subj(events.TunnelSubject("a", "s1", events.ToEdge)),
		subj(events.UnitRelaySubject("u1", "b", "a", "s1", events.ToEdge)),
		subj(events.UnitRelaySubject("u1", "c", "b", "s1", events.ToEdge)),
	} {
		if matches(p.Sub.Allow, s) {
			t.Errorf("b may hear %s", s)
		}
	}
}
