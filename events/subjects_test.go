package events

import (
	"errors"
	"testing"
)

func TestValidToken(t *testing.T) {
	tests := []struct {
		name  string
		token string
		want  error
	}{
		{"plain", "edge-node-1", nil},
		{"underscore", "_", nil},
		{"empty", "", ErrEmptyToken},
		{"dot", "a.b", ErrInvalidToken},
		{"star", "a*", ErrInvalidToken},
		{"gt", ">", ErrInvalidToken},
		{"space", "a b", ErrInvalidToken},
		{"tab", "a\tb", ErrInvalidToken},
		{"newline", "a\n", ErrInvalidToken},
		{"nbsp", "a\u00a0b", ErrInvalidToken},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidToken(tt.token)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("ValidToken(%q) = %v, want %v", tt.token, err, tt.want)
			}
		})
	}
}

func TestSubjectRoundTrip(t *testing.T) {
	probe, err := ProbeSubject("u1", "n1")
	if err != nil || probe != "atoll.health.probe.u1.n1" {
		t.Fatalf("ProbeSubject = %q, %v", probe, err)
	}
	if u, c, err := ParseProbeSubject(probe); err != nil || u != "u1" || c != "n1" {
		t.Fatalf("ParseProbeSubject = %q %q %v", u, c, err)
	}
	ballot, _ := BallotSubject("u1", "n1")
	if u, v, err := ParseBallotSubject(ballot); err != nil || ballot != "atoll.health.ballot.u1.n1" || u != "u1" || v != "n1" {
		t.Fatalf("ballot %q → %q %q %v", ballot, u, v, err)
	}
	topo, _ := TopologySubject("n1")
	if n, err := ParseTopologySubject(topo); err != nil || topo != "atoll.topo.node.n1" || n != "n1" {
		t.Fatalf("topology %q → %q %v", topo, n, err)
	}
	view, _ := ViewSubject("u1", "endpointslices", "default", "web-abc")
	if k, err := ParseViewSubject(view); err != nil || k != (ViewKey{"u1", "endpointslices", "default", "web-abc"}) {
		t.Fatalf("view %q → %+v %v", view, k, err)
	}
	tun, _ := TunnelSubject("n1", "s1", ToEdge)
	if n, s, d, err := ParseTunnelSubject(tun); err != nil || tun != "atoll.tunnel.n1.s1.in" || n != "n1" || s != "s1" || d != ToEdge {
		t.Fatalf("tunnel %q → %q %q %q %v", tun, n, s, d, err)
	}
	rel, _ := TunnelRelaySubject("n2", "n1", "s1", ToCloud)
	if p, n, s, d, err := ParseTunnelRelaySubject(rel); err != nil || rel != "atoll.tunnel.n2.relay.n1.s1.out" || p != "n2" || n != "n1" || s != "s1" || d != ToCloud {
		t.Fatalf("tunnel relay %q → %q %q %q %q %v", rel, p, n, s, d, err)
	}
	ul, _ := UnitRelaySubject("u1", "n2", "n1", "s1", ToEdge)
	if u, p, n, s, d, err := ParseUnitRelaySubject(ul); err != nil || ul != "atoll.relay.u1.n2.n1.s1.in" || u != "u1" || p != "n2" || n != "n1" || s != "s1" || d != ToEdge {
		t.Fatalf("unit relay %q → %q %q %q %q %q %v", ul, u, p, n, s, d, err)
	}
}

// TestDottedNames: node names are DNS subdomains; their dots travel as '~'
// and come back as dots.
func TestDottedNames(t *testing.T) {
	subj, err := BallotSubject("site.eu-1", "ip-10-0-1-2.ec2.internal")
	if err != nil {
		t.Fatal(err)
	}
	if subj != "atoll.health.ballot.site~eu-1.ip-10-0-1-2~ec2~internal" {
		t.Fatalf("subject = %q", subj)
	}
	unit, voter, err := ParseBallotSubject(subj)
	if err != nil || unit != "site.eu-1" || voter != "ip-10-0-1-2.ec2.internal" {
		t.Fatalf("parse = %q %q %v", unit, voter, err)
	}
	all, _ := ProbeUnitSubjects("site.eu-1")
	if all != "atoll.health.probe.site~eu-1.*" {
		t.Fatalf("unit subjects = %q", all)
	}
}

func TestSubjectBuildersReject(t *testing.T) {
	tests := []struct {
		name string
		err  func() error
	}{
		{"probe empty unit", func() error { _, err := ProbeSubject("", "n"); return err }},
		{"probe checker with the escape", func() error { _, err := ProbeSubject("u", "n~x"); return err }},
		{"ballot wildcard unit", func() error { _, err := BallotSubject("*", "v"); return err }},
		{"ballot gt voter", func() error { _, err := BallotSubject("u", ">"); return err }},
		{"topology space", func() error { _, err := TopologySubject("a b"); return err }},
		{"view empty name", func() error { _, err := ViewSubject("u", "services", "ns", ""); return err }},
		{"tunnel bad dir", func() error { _, err := TunnelSubject("n", "s", "sideways"); return err }},
		{"tunnel relay wildcard node", func() error { _, err := TunnelRelaySubject("p", "*", "s", ToEdge); return err }},
		{"unit relay bad dir", func() error { _, err := UnitRelaySubject("u", "p", "n", "s", "up"); return err }},
		{"unit subjects wildcard", func() error { _, err := ProbeUnitSubjects("*"); return err }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.err(); err == nil {
				t.Fatal("accepted an invalid token")
			}
		})
	}
}

func TestSubjectParsersReject(t *testing.T) {
	tests := []struct {
		subject string
		parse   func(string) error
	}{
		{"atoll.health.probe.u1", func(s string) error { _, _, err := ParseProbeSubject(s); return err }},
		{"atoll.health.probe.u1.n1.x", func(s string) error { _, _, err := ParseProbeSubject(s); return err }},
		{"atoll.health.probe.u1.", func(s string) error { _, _, err := ParseProbeSubject(s); return err }},
		{"atoll.health.probe.*.n1", func(s string) error { _, _, err := ParseProbeSubject(s); return err }},
		{"atoll.health.ballot.u1", func(s string) error { _, _, err := ParseBallotSubject(s); return err }},
		{"atoll.health.probe.u1.n1", func(s string) error { _, _, err := ParseBallotSubject(s); return err }},
		{"atoll.topo.node.>", func(s string) error { _, err := ParseTopologySubject(s); return err }},
		{"atoll.view.u1.services.ns", func(s string) error { _, err := ParseViewSubject(s); return err }},
		{"atoll.tunnel.n1.s1.up", func(s string) error { _, _, _, err := ParseTunnelSubject(s); return err }},
		{"atoll.tunnel.n2.relay.n1.s1", func(s string) error { _, _, _, _, err := ParseTunnelRelaySubject(s); return err }},
		{"atoll.tunnel.n2.other.n1.s1.in", func(s string) error { _, _, _, _, err := ParseTunnelRelaySubject(s); return err }},
		{"atoll.relay.u1.n2.n1.s1.sideways", func(s string) error { _, _, _, _, _, err := ParseUnitRelaySubject(s); return err }},
		{"other.topo.node.n1", func(s string) error { _, err := ParseTopologySubject(s); return err }},
	}
	for _, tt := range tests {
		t.Run(tt.subject, func(t *testing.T) {
			if err := tt.parse(tt.subject); err == nil {
				t.Fatalf("accepted %q", tt.subject)
			}
		})
	}
}

func TestTypeForSubject(t *testing.T) {
	tests := map[string]string{
		"atoll.health.probe.u.n":          "atoll.v1.ProbeReport",
		"atoll.health.ballot.u.v":         "atoll.v1.Ballot",
		"atoll.topo.node.n":               "atoll.v1.TopologyUpdate",
		"atoll.tunnel.n.s.out":            "atoll.v1.TunnelFrame",
		"atoll.tunnel.p.relay.n.s.out":    "atoll.v1.TunnelFrame",
		"atoll.relay.u.p.n.s.in":          "atoll.v1.TunnelFrame",
		"atoll.view.u.unit._.u":           "atoll.v1.UnitView",
		"atoll.view.u.hosts._.u":          "atoll.v1.HostRecords",
		"atoll.view._.assignment._.n":     "atoll.v1.NodeAssignment",
		"atoll.view.u.services.default.x": "atoll.v1.ObjectView",
		"atoll.cloud.status":              "atoll.v1.StatusRequest",
	}
	for subject, want := range tests {
		if got, err := TypeForSubject(subject); err != nil || got != want {
			t.Errorf("TypeForSubject(%q) = %q, %v; want %q", subject, got, err, want)
		}
	}
	if _, err := TypeForSubject("atoll.health.other"); !errors.Is(err, ErrWrongSubject) {
		t.Errorf("unknown subject: %v", err)
	}
}

func TestValidUnit(t *testing.T) {
	for _, u := range []string{"site-a", "eu.west.1"} {
		if err := ValidUnit(u); err != nil {
			t.Errorf("ValidUnit(%q) = %v", u, err)
		}
	}
	for _, u := range []string{"", NoUnit, SharedSpace, HubCluster, "a*b", "a b"} {
		if err := ValidUnit(u); !errors.Is(err, ErrInvalidToken) && !errors.Is(err, ErrEmptyToken) {
			t.Errorf("ValidUnit(%q) = %v, want an invalid-token error", u, err)
		}
	}
}

// TestSharedSpaceSubjects: the shared views are one wildcard apart from
// every unit's, and a shared view parses with the SharedSpace token.
func TestSharedSpaceSubjects(t *testing.T) {
	if got := SharedSpaceSubjects(); got != "atoll.view._all.>" {
		t.Fatalf("SharedSpaceSubjects() = %q", got)
	}
	s, err := ViewSubject(SharedSpace, "services", "default", "web")
	if err != nil {
		t.Fatal(err)
	}
	if !SubjectMatches(SharedSpaceSubjects(), s) {
		t.Errorf("%s does not match %s", s, SharedSpaceSubjects())
	}
	u1, _ := UnitViewSubjects("u1")
	if SubjectMatches(u1, s) {
		t.Errorf("%s matches the unit filter %s", s, u1)
	}
	k, err := ParseViewSubject(s)
	if err != nil || k.Unit != SharedSpace {
		t.Errorf("ParseViewSubject(%s) = %+v, %v", s, k, err)
	}
}

// TestRelayedView: a shared view relayed inside a unit keeps its kind,
// namespace and name, comes back whole, and nothing but a shared view is
// relayed.
func TestRelayedView(t *testing.T) {
	s, err := ViewSubject(SharedSpace, "endpointslices", "default", "web-abc")
	if err != nil {
		t.Fatal(err)
	}
	r, err := RelayedView("u1", s)
	if err != nil || r != "atoll.viewrelay.u1.endpointslices.default.web-abc" {
		t.Fatalf("RelayedView = %q, %v", r, err)
	}
	f, _ := RelayedViewSubjects("u1")
	if !SubjectMatches(f, r) {
		t.Errorf("%s does not match %s", r, f)
	}
	unit, view, err := ParseRelayedView(r)
	if err != nil || unit != "u1" || view != s {
		t.Errorf("ParseRelayedView(%s) = %q, %q, %v", r, unit, view, err)
	}
	u1, _ := ViewSubject("u1", "nodes", ClusterScoped, "n1")
	for _, bad := range []struct{ unit, subject string }{{"u1", u1}, {SharedSpace, s}, {"u1", "atoll.viewpub._all.services.default.web"}} {
		if r, err := RelayedView(bad.unit, bad.subject); err == nil {
			t.Errorf("RelayedView(%q, %q) = %q, want an error", bad.unit, bad.subject, r)
		}
	}
	reset, err := RelayResetSubject("u1", "edge-1")
	if err != nil || reset != "atoll.viewrelay.u1.edge-1.reset" || !SubjectMatches(f, reset) {
		t.Errorf("RelayResetSubject = %q, %v; want one the unit's relayed feeds hear", reset, err)
	}
	for _, bad := range []string{"atoll.viewrelay.u1.services.default", s, "atoll.viewrelay.u1.services.default.web.x", reset} {
		if _, _, err := ParseRelayedView(bad); err == nil {
			t.Errorf("ParseRelayedView(%q) took it", bad)
		}
	}
}

// TestEmptyNameSaysWhichName: a builder given an empty name says which
// name is missing, not "empty subject token", and the error still matches
// ErrEmptyToken.
func TestEmptyNameSaysWhichName(t *testing.T) {
	tests := []struct {
		name  string
		build func() (string, error)
		want  string
	}{
		{"topology node", func() (string, error) { return TopologySubject("") }, "events: node name is empty"},
		{"assignment node", func() (string, error) { return AssignmentSubject("") }, "events: node name is empty"},
		{"ballot voter", func() (string, error) { return BallotSubject("u1", "") }, "events: voter name is empty"},
		{"ballot unit", func() (string, error) { return BallotSubject("", "n2") }, "events: unit name is empty"},
		{"probe checker", func() (string, error) { return ProbeSubject("u1", "") }, "events: checker name is empty"},
		{"probe unit wildcard", func() (string, error) { return ProbeUnitSubjects("") }, "events: unit name is empty"},
		{"view unit wildcard", func() (string, error) { return UnitViewSubjects("") }, "events: unit name is empty"},
		{"view object", func() (string, error) { return ViewSubject("u1", "pods", "default", "") }, "events: object name is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.build()
			if err == nil || err.Error() != tt.want || !errors.Is(err, ErrEmptyToken) {
				t.Fatalf("error %v, want %q matching ErrEmptyToken", err, tt.want)
			}
		})
	}
}

// TestTopologyWildcards: the constants the consumers filter on (package
// variables cannot use the compiled catalog) are the families' wildcards.
func TestTopologyWildcards(t *testing.T) {
	if got, want := NodeTopologySubjects, TopologyFamily.Wildcard(); got != want {
		t.Errorf("NodeTopologySubjects %q, family wildcard %q", got, want)
	}
	if got, want := UnitEventSubjects, UnitEventFamily.Wildcard(); got != want {
		t.Errorf("UnitEventSubjects %q, family wildcard %q", got, want)
	}
	for _, spec := range []ConsumerSpec{TopologyFollower, UnitEventConsumer} {
		if err := spec.Validate(); err != nil || len(spec.FilterSubjects) != 1 || spec.FilterSubjects[0] == "" {
			t.Errorf("%s: filters %q (%v)", spec.Name, spec.FilterSubjects, err)
		}
	}
}
