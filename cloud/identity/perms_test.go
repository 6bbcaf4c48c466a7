package identity

import (
	"slices"
	"strings"
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
	for _, s := range []string{"atoll.health.ballot.u1.b", "atoll.health.ballot.u2.a", "atoll.health.probe.u1.a"} {
		if matches(p.Pub.Allow, s) {
			t.Errorf("a may publish %s", s)
		}
	}
	for _, s := range []string{"atoll.health.ballot.u1.b", "atoll.health.probe.u1.b"} {
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

// TestEdgePermissionsViews: an edge may hear, create filtered consumers
// on and direct-get its unit's views and the shared views, and none of
// another unit's: not its Nodes in full either. An edge in no unit gets
// neither.
func TestEdgePermissionsViews(t *testing.T) {
	p, err := EdgePermissions("a", "u1", "hub")
	if err != nil {
		t.Fatal(err)
	}
	matches := func(list []string, subject string) bool {
		return slices.ContainsFunc(list, func(f string) bool { return events.SubjectMatches(f, subject) })
	}
	api := "$JS.hub.API."
	create := func(filter string) string { return api + "CONSUMER.CREATE." + events.StreamViews + ".c1." + filter }
	get := func(subj string) string { return api + "DIRECT.GET." + events.StreamViews + "." + subj }
	for _, f := range []string{"atoll.view.u1.>", events.SharedSpaceSubjects()} {
		if !matches(p.Sub.Allow, strings.TrimSuffix(f, ">")+"nodes._.x") || !matches(p.Pub.Allow, create(f)) {
			t.Errorf("a may not read %s: pub %v sub %v", f, p.Pub.Allow, p.Sub.Allow)
		}
	}
	for _, s := range []string{"atoll.view.u1.nodes._.a", "atoll.view._all.services.default.web", "atoll.view._all.nodes._.c"} {
		if !matches(p.Pub.Allow, get(s)) {
			t.Errorf("a may not direct-get %s", s)
		}
	}
	for _, f := range []string{"atoll.view.u2.>", "atoll.view.u2.nodes.>", "atoll.view.u2.nodes._.c", "atoll.view.*.nodes._.c", "atoll.view.>"} {
		if matches(p.Pub.Allow, create(f)) {
			t.Errorf("a may create a consumer on %s", f)
		}
	}
	for _, s := range []string{"atoll.view.u2.nodes._.c", "atoll.view.u2.services.default.web"} {
		if matches(p.Pub.Allow, get(s)) || matches(p.Sub.Allow, s) {
			t.Errorf("a may read %s", s)
		}
	}
	// The republished views (edge/viewfeed): its own spaces and its
	// assignment, not another unit's, another node's or everything.
	for _, s := range []string{"atoll.viewpub.u1.nodes._.a", "atoll.viewpub.u1.unit._.u1", "atoll.viewpub._all.services.default.web", "atoll.viewpub._.assignment._.a"} {
		if !matches(p.Sub.Allow, s) {
			t.Errorf("a may not hear the republished %s: sub %v", s, p.Sub.Allow)
		}
	}
	for _, s := range []string{"atoll.viewpub.u2.nodes._.c", "atoll.viewpub.u2.>", "atoll.viewpub._.assignment._.b", "atoll.viewpub.>", "atoll.viewpub.*.nodes._.c"} {
		if matches(p.Sub.Allow, s) {
			t.Errorf("a may hear the republished %s", s)
		}
	}
	none, err := EdgePermissions("a", "", "hub")
	if err != nil {
		t.Fatal(err)
	}
	if matches(none.Pub.Allow, create(events.SharedSpaceSubjects())) || matches(none.Sub.Allow, "atoll.viewpub._all.services.default.web") {
		t.Errorf("a node in no unit may read the shared views")
	}
	if !matches(none.Sub.Allow, "atoll.viewpub._.assignment._.a") {
		t.Errorf("a node in no unit may not hear its republished assignment")
	}
}
