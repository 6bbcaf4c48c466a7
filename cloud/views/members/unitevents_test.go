package members

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// unitEventLog reads every unit event the TOPOLOGY stream holds, in order
// (the stream keeps the last per unit).
func unitEventLog(t *testing.T, js jetstream.JetStream) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, events.StreamTopology)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(events.UnitEventFamily.Wildcard()))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for subj := range info.State.Subjects {
		raw, err := st.GetLastMsgForSubject(ctx, subj)
		if err != nil {
			t.Fatal(err)
		}
		var ev atollv1.UnitEvent
		if err := proto.Unmarshal(raw.Data, &ev); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s %s %v", ev.GetUnit(), ev.GetKind(), ev.GetMembers()))
	}
	slices.Sort(out)
	return out
}

func unitEventCount(t *testing.T, s *Service) float64 {
	t.Helper()
	var m dto.Metric
	if err := s.unitEventState().published.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestUnitEvents: a unit's first member publishes "appeared", a change of
// members "members changed", its last member leaving "gone"; a pass with
// nothing changed publishes nothing, and neither does a second replica (or
// a restarted one) that finds the same members in the stream.
func TestUnitEvents(t *testing.T) {
	f := newHubFixture(t)
	ctx := t.Context()
	s := f.svc
	publish := func(s *Service) {
		t.Helper()
		if err := s.publish(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s.observe(report("a", "u1", "10.0.0.1", "nats-route://10.0.0.1:6222", nil), time.Now())
	s.observe(report("b", "u1", "10.0.0.2", "nats-route://10.0.0.2:6222", nil), time.Now())
	publish(s)
	if got, want := unitEventLog(t, f.js), []string{"u1 UNIT_EVENT_KIND_APPEARED [a b]"}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	publish(s)
	if n := unitEventCount(t, s); n != 1 {
		t.Fatalf("%v events published, want 1 (nothing changed)", n)
	}

	// A second replica on the same stream publishes nothing new.
	other := newDeclared(t, hublink.Of(f.svc.bus.Conn(), f.js))
	other.observe(report("a", "u1", "10.0.0.1", "nats-route://10.0.0.1:6222", nil), time.Now())
	other.observe(report("b", "u1", "10.0.0.2", "nats-route://10.0.0.2:6222", nil), time.Now())
	publish(other)
	if n := unitEventCount(t, other); n != 0 {
		t.Fatalf("the second replica published %v events, want 0", n)
	}

	// b moves to u2: u1's members change, u2 appears.
	s.observe(report("b", "u2", "10.0.0.2", "nats-route://10.0.0.2:6222", nil), time.Now())
	publish(s)
	want := []string{"u1 UNIT_EVENT_KIND_MEMBERS_CHANGED [a]", "u2 UNIT_EVENT_KIND_APPEARED [b]"}
	if got := unitEventLog(t, f.js); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	// The other replica, behind, learns from the stream's refusal and
	// stores nothing twice.
	other.observe(report("b", "u2", "10.0.0.2", "nats-route://10.0.0.2:6222", nil), time.Now())
	publish(other)
	if got := unitEventLog(t, f.js); !slices.Equal(got, want) {
		t.Fatalf("events %v after the second replica, want %v", got, want)
	}

	// b leaves u2 (moves back): u2 is gone.
	s.observe(report("b", "u1", "10.0.0.2", "nats-route://10.0.0.2:6222", nil), time.Now())
	publish(s)
	want = []string{"u1 UNIT_EVENT_KIND_MEMBERS_CHANGED [a b]", "u2 UNIT_EVENT_KIND_GONE []"}
	if got := unitEventLog(t, f.js); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	before := unitEventCount(t, s)
	publish(s)
	if n := unitEventCount(t, s); n != before {
		t.Fatalf("%v events published by a pass with nothing changed", n-before)
	}
}

// TestUnitEventsIncremental: a pass over one dirty node publishes the
// events of the units it touches and leaves every other unit's event
// alone (an incremental pass does not see the other units, so it must not
// read their absence as "gone").
func TestUnitEventsIncremental(t *testing.T) {
	f := newHubFixture(t)
	ctx := t.Context()
	s := f.svc
	s.observe(report("a", "u1", "10.0.0.1", "nats-route://10.0.0.1:6222", nil), time.Now())
	s.observe(report("c", "u2", "10.0.0.3", "nats-route://10.0.0.3:6222", nil), time.Now())
	if err := s.pass(ctx); err != nil { // the first pass is a full one
		t.Fatal(err)
	}
	want := []string{"u1 UNIT_EVENT_KIND_APPEARED [a]", "u2 UNIT_EVENT_KIND_APPEARED [c]"}
	if got := unitEventLog(t, f.js); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	s.observe(report("b", "u1", "10.0.0.2", "nats-route://10.0.0.2:6222", nil), time.Now())
	if err := s.pass(ctx); err != nil {
		t.Fatal(err)
	}
	want = []string{"u1 UNIT_EVENT_KIND_MEMBERS_CHANGED [a b]", "u2 UNIT_EVENT_KIND_APPEARED [c]"}
	if got := unitEventLog(t, f.js); !slices.Equal(got, want) {
		t.Fatalf("events %v after an incremental pass, want %v", got, want)
	}
	// c moves to u3: u2 is gone, u3 appears, u1 untouched.
	s.observe(report("c", "u3", "10.0.0.3", "nats-route://10.0.0.3:6222", nil), time.Now())
	if err := s.pass(ctx); err != nil {
		t.Fatal(err)
	}
	want = []string{"u1 UNIT_EVENT_KIND_MEMBERS_CHANGED [a b]", "u2 UNIT_EVENT_KIND_GONE []", "u3 UNIT_EVENT_KIND_APPEARED [c]"}
	if got := unitEventLog(t, f.js); !slices.Equal(got, want) {
		t.Fatalf("events %v after a move, want %v", got, want)
	}
}
