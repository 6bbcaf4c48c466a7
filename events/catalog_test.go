package events_test

import (
	"errors"
	"flag"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/atoll-edge/atoll/docs"
	"github.com/atoll-edge/atoll/events"
)

var update = flag.Bool("update", false, "rewrite the generated blocks of docs/reference (go tool task docs:gen)")

// TestSubjectCatalogDoc: the catalog block of docs/reference/subjects.md
// is what the table renders. `go tool task docs:gen` rewrites it.
func TestSubjectCatalogDoc(t *testing.T) {
	const path = "../docs/reference/subjects.md"
	stale, err := docs.SyncBlock(path, events.CatalogBegin, events.CatalogEnd, events.CatalogMarkdown(), *update)
	if err != nil {
		t.Fatal(err)
	}
	if stale {
		t.Fatalf("%s: the subject catalog differs from events/catalog.go; run `go tool task docs:gen` and commit", path)
	}
}

// TestCatalogStreams: every stream subject is the wildcard of exactly one
// family stored in that stream, every stream family is covered by exactly
// one subject of its own stream and none of another, families off the
// streams are covered by none, and the configs carry these subjects.
func TestCatalogStreams(t *testing.T) {
	defs := events.StreamDefs()
	configs := events.Streams(events.DefaultStreamOptions())
	if len(configs) != len(defs) {
		t.Fatalf("%d configs for %d definitions", len(configs), len(defs))
	}
	for i, d := range defs {
		if configs[i].Name != d.Name || !slices.Equal(configs[i].Subjects, events.StreamSubjects(d.Name)) {
			t.Errorf("config %s has subjects %v, want %v", configs[i].Name, configs[i].Subjects, events.StreamSubjects(d.Name))
		}
		if len(configs[i].Subjects) == 0 {
			t.Errorf("stream %s stores no family", d.Name)
		}
		for _, s := range configs[i].Subjects {
			var of []string
			for _, f := range events.Catalog() {
				if f.Stream == d.Name && f.Wildcard() == s {
					of = append(of, f.Name)
				}
			}
			if len(of) != 1 {
				t.Errorf("stream %s subject %s is the wildcard of %v, want exactly one family", d.Name, s, of)
			}
		}
	}
	for _, f := range events.Catalog() {
		covered := map[string]int{}
		for _, c := range configs {
			for _, s := range c.Subjects {
				if events.SubjectMatches(s, f.Wildcard()) {
					covered[c.Name]++
				}
			}
		}
		switch f.Transport {
		case events.TransportStream:
			if len(covered) != 1 || covered[f.Stream] != 1 {
				t.Errorf("family %s (stream %s) is covered by %v", f.Name, f.Stream, covered)
			}
		default:
			if f.Stream != "" || len(covered) != 0 {
				t.Errorf("%s family %s is stored: stream %q, covered by %v", f.Transport, f.Name, f.Stream, covered)
			}
		}
	}
}

// TestCatalogExamples: each family's example subject parses back to its
// values, maps to its family and message type, and its identity check
// accepts a payload that agrees and refuses one that does not.
func TestCatalogExamples(t *testing.T) {
	names := map[string]bool{}
	for _, f := range events.Catalog() {
		t.Run(f.Name, func(t *testing.T) {
			if names[f.Name] {
				t.Fatalf("two families named %s", f.Name)
			}
			names[f.Name] = true
			if f.MsgID == "" || f.Producer == "" || f.Consumer == "" || f.Message == nil {
				t.Fatalf("incomplete descriptor: %+v", f)
			}
			if (f.Transport == events.TransportRequest) != (f.Reply != nil && f.Endpoint != "" && f.Service != "") {
				t.Fatalf("request/reply needs a reply, a service and an endpoint: %+v", f)
			}
			subj, err := f.ExampleSubject()
			if err != nil {
				t.Fatal(err)
			}
			got, err := f.Parse(subj)
			if err != nil || !slices.Equal(got, f.Example) && len(f.Example)+len(got) > 0 {
				t.Fatalf("Parse(%q) = %q, %v; want %q", subj, got, err, f.Example)
			}
			if of, err := events.FamilyOf(subj); err != nil || of != f {
				t.Fatalf("FamilyOf(%q) = %v, %v", subj, of, err)
			}
			if typ, err := events.TypeForSubject(subj); err != nil || typ != events.TypeName(f.Message) {
				t.Fatalf("TypeForSubject(%q) = %q, %v", subj, typ, err)
			}
			if !events.SubjectMatches(f.Wildcard(), subj) {
				t.Fatalf("wildcard %s does not match %s", f.Wildcard(), subj)
			}

			// A payload whose identity fields agree passes; each field
			// changed alone is refused.
			m := f.Message.ProtoReflect().New()
			fields := m.Descriptor().Fields()
			for i, name := range f.Names() {
				if field, ok := f.Identity[name]; ok {
					m.Set(fields.ByName(protoreflect.Name(field)), protoreflect.ValueOfString(f.Example[i]))
				}
			}
			if err := events.CheckIdentity(subj, m.Interface()); err != nil {
				t.Fatalf("identity of a matching payload: %v", err)
			}
			for _, field := range f.Identity {
				liar := proto.Clone(m.Interface()).ProtoReflect()
				liar.Set(fields.ByName(protoreflect.Name(field)), protoreflect.ValueOfString("someone-else"))
				if err := events.CheckIdentity(subj, liar.Interface()); !errors.Is(err, events.ErrIdentity) {
					t.Errorf("payload with another %s: %v, want ErrIdentity", field, err)
				}
			}
		})
	}
}

// TestWildcardConstants: the wildcard constants services filter on cover
// the families they name.
func TestWildcardConstants(t *testing.T) {
	tests := []struct {
		filter string
		family *events.Family
	}{
		{events.ProbeSubjects, events.ProbeFamily},
		{events.BallotSubjects, events.BallotFamily},
		{events.HealthSubjects, events.ProbeFamily},
		{events.HealthSubjects, events.BallotFamily},
		{events.TopoSubjects, events.TopologyFamily},
		{events.ViewSubjects, events.ObjectViewFamily},
		{events.ViewSubjects, events.AssignmentFamily},
		{events.ViewRepublishSubjects, events.RepublishedObjectViewFamily},
		{events.ViewRepublishSubjects, events.RepublishedAssignmentFamily},
		{events.TunnelSubjects, events.TunnelFamily},
		{events.TunnelSubjects, events.TunnelRelayFamily},
		{events.TunnelSubjects, events.APIServerDialFamily},
		{events.UnitRelaySubjects, events.UnitRelayFamily},
	}
	for _, tt := range tests {
		if !events.SubjectMatches(tt.filter, tt.family.Wildcard()) {
			t.Errorf("%s does not cover %s (%s)", tt.filter, tt.family.Name, tt.family.Wildcard())
		}
	}
	for _, f := range events.Catalog() {
		if !events.SubjectMatches(events.AllSubjects, f.Wildcard()) {
			t.Errorf("%s does not cover %s", events.AllSubjects, f.Name)
		}
	}
	if events.SubjectMatches(events.BallotSubjects, events.ProbeFamily.Wildcard()) {
		t.Error("the ballot filter covers probe reports")
	}
}

func TestSubjectMatches(t *testing.T) {
	tests := []struct {
		filter, p string
		want      bool
	}{
		{"a.*.c", "a.b.c", true},
		{"a.*.c", "a.*.c", true},
		{"a.b.c", "a.*.c", false},
		{"a.>", "a.b.c", true},
		{"a.>", "a", false},
		{"a.*", "a.>", false},
		{"a.*.*.*.*", "a._.x._.*", true},
		{"a.*", "a.b.c", false},
	}
	for _, tt := range tests {
		if got := events.SubjectMatches(tt.filter, tt.p); got != tt.want {
			t.Errorf("SubjectMatches(%q, %q) = %v", tt.filter, tt.p, got)
		}
	}
}
