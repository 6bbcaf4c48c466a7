package members

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// hubFixture is a real embedded hub with the catalog's streams and a
// declared-source topology service bound to it.
type hubFixture struct {
	js    jetstream.JetStream
	views jetstream.Stream
	svc   *Service
}

func newHubFixture(t *testing.T, mutate ...func(*Config)) *hubFixture {
	t.Helper()
	h := natstest.Hub(t)
	nc, err := h.Connect("members-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := eventbus.EnsureStreams(ctx, js, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	views, err := js.Stream(ctx, events.StreamViews)
	if err != nil {
		t.Fatal(err)
	}
	return &hubFixture{js: js, views: views, svc: newDeclared(t, hublink.Of(nc, js), mutate...)}
}

func newDeclared(t *testing.T, link *hublink.Link, mutate ...func(*Config)) *Service {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Source = SourceDeclared
	cfg.Debounce = 0
	for _, m := range mutate {
		m(&cfg)
	}
	s, err := New(cfg, link, nil, natstest.Logger(t, slog.LevelInfo), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.open(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func report(node, unit, ip, route string, labels map[string]string) *atollv1.TopologyUpdate {
	return &atollv1.TopologyUpdate{Node: node, Unit: unit, RouteUrl: route, Labels: labels,
		Addresses: []*atollv1.NodeAddress{{Type: "InternalIP", Address: ip}}}
}

// storedView is the unit view the stream holds for unit (nil: none).
func (f *hubFixture) storedView(t *testing.T, unit string) *atollv1.UnitView {
	t.Helper()
	subj, _ := events.UnitViewSubject(unit)
	raw, err := f.views.GetLastMsgForSubject(context.Background(), subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	v := &atollv1.UnitView{}
	if err := proto.Unmarshal(raw.Data, v); err != nil {
		t.Fatal(err)
	}
	return v
}

func (f *hubFixture) storedAssignment(t *testing.T, node string) *atollv1.NodeAssignment {
	t.Helper()
	subj, _ := events.AssignmentSubject(node)
	raw, err := f.views.GetLastMsgForSubject(context.Background(), subj)
	if err != nil {
		t.Fatal(err)
	}
	a := &atollv1.NodeAssignment{}
	if err := proto.Unmarshal(raw.Data, a); err != nil {
		t.Fatal(err)
	}
	return a
}

func (f *hubFixture) hasAssignment(t *testing.T, node string) bool {
	t.Helper()
	subj, _ := events.AssignmentSubject(node)
	_, err := f.views.GetLastMsgForSubject(context.Background(), subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

func (f *hubFixture) lastSeq(t *testing.T) uint64 {
	t.Helper()
	info, err := f.views.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

func memberNames(v *atollv1.UnitView) string {
	var names []string
	for _, m := range v.GetMembers() {
		names = append(names, m.GetName()+"="+m.GetRouteUrl())
	}
	return strings.Join(names, ",")
}

// TestBadInputStallsNoView: a malformed route URL, an oversized route URL,
// a bad address and a unit whose view is too large cost only themselves:
// every other view and every assignment is published, the bad inputs are
// counted by reason, and the error names the unit.
func TestBadInputStallsNoView(t *testing.T) {
	f := newHubFixture(t, func(c *Config) { c.MaxViewBytes = 4096 })
	s := f.svc
	huge := map[string]string{"blob": strings.Repeat("x", 8000)}
	s.observe(report("a", "u1", "10.0.0.1", "nats-route://10.0.0.1:6222 ", nil), time.Now()) // trailing space
	s.observe(report("b", "u1", "10.0.0.2", "nats-route://10.0.0.2:6222", nil), time.Now())
	s.observe(report("c", "u2", "not-an-ip", "nats-route://"+strings.Repeat("h", 2000)+":6222", nil), time.Now())
	s.observe(report("d", "u2", "10.0.0.4", "http://10.0.0.4:6222", nil), time.Now())
	s.observe(report("e", "u3", "10.0.0.5", "nats-route://10.0.0.5:6222", huge), time.Now())
	s.observe(report("f", "u4", "10.0.0.6", "nats-route://10.0.0.6:6222", nil), time.Now())

	err := s.publish(context.Background())
	if err == nil || !strings.Contains(err.Error(), "unit u3") {
		t.Fatalf("publish error = %v, want one naming unit u3", err)
	}
	if got, want := memberNames(f.storedView(t, "u1")), "a=,b=nats-route://10.0.0.2:6222"; got != want {
		t.Errorf("u1 members = %s, want %s", got, want)
	}
	u2 := f.storedView(t, "u2")
	if got, want := memberNames(u2), "c=,d="; got != want {
		t.Errorf("u2 members = %s, want %s", got, want)
	}
	if ip := u2.GetMembers()[0].GetInternalIp(); ip != "" {
		t.Errorf("u2 member c kept bad address %q", ip)
	}
	if v := f.storedView(t, "u3"); v != nil {
		t.Errorf("oversized view of u3 was published: %d bytes", proto.Size(v))
	}
	if got, want := memberNames(f.storedView(t, "u4")), "f=nats-route://10.0.0.6:6222"; got != want {
		t.Errorf("u4 members = %s, want %s", got, want)
	}
	for _, n := range []string{"a", "b", "c", "d", "e", "f"} {
		if !f.hasAssignment(t, n) {
			t.Errorf("no assignment published for %s", n)
		}
	}
	for reason, want := range map[string]float64{reasonRouteURL: 3, reasonInternalIP: 1, reasonTooLarge: 1} {
		if got := counter(t, s.metrics.rejected.WithLabelValues(reason)); got != want {
			t.Errorf("rejected{reason=%s} = %v, want %v", reason, got, want)
		}
	}
	if errors.Is(err, errRetry) {
		t.Errorf("publish error %v asks for a retry; rejected inputs wait for a change", err)
	}
	// A second pass logs and counts the same bad inputs no more.
	_ = s.publish(context.Background())
	for reason, want := range map[string]float64{reasonRouteURL: 3, reasonTooLarge: 1} {
		if got := counter(t, s.metrics.rejected.WithLabelValues(reason)); got != want {
			t.Errorf("rejected{reason=%s} = %v after a second pass, want %v", reason, got, want)
		}
	}
	// The fixed report is published.
	s.observe(report("a", "u1", "10.0.0.1", "nats-route://10.0.0.1:6222", nil), time.Now())
	_ = s.publish(context.Background())
	if got, want := memberNames(f.storedView(t, "u1")), "a=nats-route://10.0.0.1:6222,b=nats-route://10.0.0.2:6222"; got != want {
		t.Errorf("u1 members after the fix = %s, want %s", got, want)
	}
}

// TestViewReturnsToEarlierContent: a view that goes A → B → A within the
// stream's duplicate window ends as A in the stream. With a content-only
// message id the second A is dropped as a duplicate and B stays.
func TestViewReturnsToEarlierContent(t *testing.T) {
	f := newHubFixture(t)
	s := f.svc
	ctx := context.Background()
	labels := func(v string) map[string]string { return map[string]string{"zone": v} }
	s.observe(report("a", "u1", "10.0.0.1", "nats-route://10.0.0.1:6222", labels("A")), time.Now())
	s.observe(report("b", "u1", "10.0.0.2", "nats-route://10.0.0.2:6222", nil), time.Now())
	for i, zone := range []string{"A", "B", "A", "B", "A"} {
		s.observe(report("a", "u1", "10.0.0.1", "nats-route://10.0.0.1:6222", labels(zone)), time.Now())
		if err := s.publish(ctx); err != nil {
			t.Fatal(err)
		}
		v := f.storedView(t, "u1")
		if got := v.GetMembers()[0].GetLabels()["zone"]; got != zone {
			t.Fatalf("step %d: stored view has zone %q, want %q", i, got, zone)
		}
	}
	// A node leaving its unit and coming back: its assignment and the
	// unit's view go A → B → A and end as A.
	for i, unit := range []string{"u2", "u1", "u2", "u1"} {
		s.observe(report("a", unit, "10.0.0.1", "nats-route://10.0.0.1:6222", labels("A")), time.Now())
		if err := s.publish(ctx); err != nil {
			t.Fatal(err)
		}
		if got := f.storedAssignment(t, "a").GetUnit(); got != unit {
			t.Fatalf("move %d: stored assignment of a names unit %q, want %q", i, got, unit)
		}
		wantU1 := "b=nats-route://10.0.0.2:6222"
		if unit == "u1" {
			wantU1 = "a=nats-route://10.0.0.1:6222," + wantU1
		}
		if got := memberNames(f.storedView(t, "u1")); got != wantU1 {
			t.Fatalf("move %d: stored view of u1 = %s, want %s", i, got, wantU1)
		}
	}

	// A second replica that computes the same view publishes nothing.
	before := f.lastSeq(t)
	other := newDeclared(t, s.bus)
	other.observe(report("a", "u1", "10.0.0.1", "nats-route://10.0.0.1:6222", labels("A")), time.Now())
	other.observe(report("b", "u1", "10.0.0.2", "nats-route://10.0.0.2:6222", nil), time.Now())
	if err := other.publish(ctx); err != nil {
		t.Fatal(err)
	}
	if after := f.lastSeq(t); after != before {
		t.Errorf("a second replica with the same views added %d messages", after-before)
	}
}

// TestResyncRepairsLostViews: views purged from the stream (or lost with a
// hub's store) are republished by the next resync of a running service;
// resyncs of a steady topology publish nothing.
func TestResyncRepairsLostViews(t *testing.T) {
	f := newHubFixture(t, func(c *Config) { c.Resync = 200 * time.Millisecond })
	s := f.svc
	for i := range 4 {
		n := fmt.Sprintf("n%d", i)
		s.observe(report(n, fmt.Sprintf("u%d", i%2), fmt.Sprintf("10.0.0.%d", i+1), fmt.Sprintf("nats-route://10.0.0.%d:6222", i+1), nil), time.Now())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})

	poll.Eventually(t, 10*time.Second, func() error {
		for _, u := range []string{"u0", "u1"} {
			if len(f.storedView(t, u).GetMembers()) != 2 {
				return fmt.Errorf("view of %s not complete", u)
			}
		}
		for i := range 4 {
			if !f.hasAssignment(t, fmt.Sprintf("n%d", i)) {
				return fmt.Errorf("no assignment for n%d", i)
			}
		}
		return nil
	})

	// Steady state: many resyncs, no new message.
	seq := f.lastSeq(t)
	resyncs := counter(t, s.metrics.published)
	waitResyncs(t, s, 5)
	if got := f.lastSeq(t); got != seq {
		t.Fatalf("resyncs of a steady topology added %d messages to %s", got-seq, events.StreamViews)
	}
	if got := counter(t, s.metrics.published); got != resyncs {
		t.Fatalf("resyncs published %v views", got-resyncs)
	}

	// Purge one unit view and one assignment: the next resync puts them back.
	u1, _ := events.UnitViewSubject("u1")
	a2, _ := events.AssignmentSubject("n2")
	for _, subj := range []string{u1, a2} {
		if err := f.views.Purge(context.Background(), jetstream.WithPurgeSubject(subj)); err != nil {
			t.Fatal(err)
		}
	}
	if f.storedView(t, "u1") != nil || f.hasAssignment(t, "n2") {
		t.Fatal("purge left the views in place")
	}
	poll.Eventually(t, 10*time.Second, func() error {
		if len(f.storedView(t, "u1").GetMembers()) != 2 {
			return errors.New("view of u1 not repaired")
		}
		if !f.hasAssignment(t, "n2") {
			return errors.New("assignment of n2 not repaired")
		}
		// Counted once the hub acknowledged the repair, which a reader
		// of the stream may see before the publisher does.
		if got := counter(t, s.metrics.repaired); got != 2 {
			return fmt.Errorf("views_repaired_total = %v, want 2", got)
		}
		return nil
	})
}

// waitResyncs waits until the service has run n more resync passes.
func waitResyncs(t *testing.T, s *Service, n int) {
	t.Helper()
	for range n {
		s.mu.Lock()
		s.resync = true
		s.mu.Unlock()
		s.poke()
		poll.Eventually(t, 10*time.Second, func() error {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.resync {
				return errors.New("resync pending")
			}
			return nil
		})
	}
}

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestReconnectResyncs: after the hub link reconnects, views the stream
// lost are republished without waiting for the periodic resync.
func TestReconnectResyncs(t *testing.T) {
	f := newHubFixture(t, func(c *Config) { c.Resync = time.Hour })
	s := f.svc
	s.observe(report("n0", "u0", "10.0.0.1", "nats-route://10.0.0.1:6222", nil), time.Now())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	poll.Eventually(t, 10*time.Second, func() error {
		if f.storedView(t, "u0") == nil {
			return errors.New("no view yet")
		}
		return nil
	})
	u0, _ := events.UnitViewSubject("u0")
	if err := f.views.Purge(context.Background(), jetstream.WithPurgeSubject(u0)); err != nil {
		t.Fatal(err)
	}
	if err := s.bus.Conn().ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, func() error {
		if f.storedView(t, "u0") == nil {
			return errors.New("view of u0 not repaired")
		}
		return nil
	})
}

// TestStaleReplicaRereads: two replicas publish the same unit; one of them
// changes the view while the other still believes its own last value is
// stored. The stale replica's next publish expects the wrong last
// sequence, is refused, reads the stream again and stores its view; no
// publish ever replaces a value it did not read.
func TestStaleReplicaRereads(t *testing.T) {
	f := newHubFixture(t)
	s1 := f.svc
	s2 := newDeclared(t, s1.bus)
	ctx := context.Background()
	zone := func(s *Service, z string) {
		t.Helper()
		s.observe(report("a", "u1", "10.0.0.1", "nats-route://10.0.0.1:6222", map[string]string{"zone": z}), time.Now())
		s.observe(report("b", "u1", "10.0.0.2", "nats-route://10.0.0.2:6222", nil), time.Now())
		if err := s.publish(ctx); err != nil {
			t.Fatal(err)
		}
		if got := f.storedView(t, "u1").GetMembers()[0].GetLabels()["zone"]; got != z {
			t.Fatalf("stored zone %q after a publish of %q", got, z)
		}
	}
	zone(s1, "A")
	zone(s2, "A") // nothing to publish: s2 reads A from the stream
	zone(s2, "B") // s1 still believes A is stored
	conflicts := counter(t, s1.metrics.conflicts)
	zone(s1, "C")
	if got := counter(t, s1.metrics.conflicts) - conflicts; got != 1 {
		t.Fatalf("conflicts grew by %v, want 1 (the stale publish refused)", got)
	}
	zone(s2, "A") // and back to content stored before: stored again
}

// TestDuplicateOfPurgedCopy: a subject purged and given the content it
// held before, within the duplicate window: the id matches the first
// copy, the hub acknowledges a duplicate and stores nothing; the service
// notices and publishes it under a fresh id.
func TestDuplicateOfPurgedCopy(t *testing.T) {
	f := newHubFixture(t)
	s := f.svc
	ctx := context.Background()
	s.observe(report("a", "u1", "10.0.0.1", "nats-route://10.0.0.1:6222", nil), time.Now())
	if err := s.publish(ctx); err != nil {
		t.Fatal(err)
	}
	u1, _ := events.UnitViewSubject("u1")
	if err := f.views.Purge(ctx, jetstream.WithPurgeSubject(u1)); err != nil {
		t.Fatal(err)
	}
	s.requestResync()
	if err := s.publish(ctx); err != nil {
		t.Fatal(err)
	}
	if f.storedView(t, "u1") == nil {
		t.Fatal("the view purged and published again under its first id is not stored")
	}
	if got := counter(t, s.metrics.duplicates); got != 1 {
		t.Fatalf("duplicates = %v, want 1", got)
	}
}

// TestViewsBehind: the service names the views an agent reports holding
// older than the ones it published, once the report is later than the
// grace after the publication.
func TestViewsBehind(t *testing.T) {
	f := newHubFixture(t)
	s := f.svc
	ctx := context.Background()
	base := report("a", "u1", "10.0.0.1", "nats-route://10.0.0.1:6222", nil)
	s.observe(base, time.Now())
	if err := s.publish(ctx); err != nil {
		t.Fatal(err)
	}
	a, v := f.storedAssignment(t, "a").GetFingerprint(), f.storedView(t, "u1").GetFingerprint()
	later := time.Now().Add(2 * reportGrace)
	tests := []struct {
		name         string
		assign, view string
		seen         time.Time
		want         string
	}{
		{"no fingerprints (no views held yet)", "", "", later, BehindUnknown},
		{"current", a, v, later, ""},
		{"old unit view", a, "old", later, BehindUnitView},
		{"no unit view yet", a, "", later, BehindUnitView},
		{"both old", "old", "old", later, BehindAssignment + ", " + BehindUnitView},
		{"reported right after the publication", a, "old", time.Now(), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := proto.Clone(base).(*atollv1.TopologyUpdate)
			r.AssignmentFingerprint, r.UnitViewFingerprint = tt.assign, tt.view
			s.observe(r, tt.seen)
			if got := s.ViewsBehind("a"); got != tt.want {
				t.Fatalf("ViewsBehind = %q, want %q", got, tt.want)
			}
		})
	}
	if got := s.ViewsBehind("nobody"); got != BehindUnknown {
		t.Fatalf("ViewsBehind of a node that never reported = %q, want %q", got, BehindUnknown)
	}

	// The gauge counts a, reporting an old unit view, and b, which
	// reports no fingerprints.
	r := proto.Clone(base).(*atollv1.TopologyUpdate)
	r.AssignmentFingerprint, r.UnitViewFingerprint = a, "old"
	s.observe(r, later)
	s.observe(report("b", "u1", "10.0.0.2", "nats-route://10.0.0.2:6222", nil), later)
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.AgentsBehind())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	if want := map[string]float64{"assignment": 0, "unit_view": 1, "unknown": 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("atoll_members_agents_behind = %v, want %v", got, want)
	}
}

// TestProbeRefusals: the service tells the refusals of a node's probe
// credentials its agent's last report carries, and none once a report
// carries none.
func TestProbeRefusals(t *testing.T) {
	s := newHubFixture(t).svc
	refused := &atollv1.ProbeRefusal{Plugin: "kubelet-healthz", Peer: "b", Status: "401 Unauthorized"}
	r := report("a", "u1", "10.0.0.1", "nats-route://10.0.0.1:6222", nil)
	r.ProbeRefusals = []*atollv1.ProbeRefusal{refused}
	s.observe(r, time.Now())
	got := s.ProbeRefusals("a")
	if len(got) != 1 || !proto.Equal(got[0], refused) {
		t.Fatalf("ProbeRefusals = %v, want %v", got, refused)
	}
	got[0].Peer = "changed"
	if again := s.ProbeRefusals("a"); !proto.Equal(again[0], refused) {
		t.Fatalf("a caller's change reached the report: %v", again)
	}
	s.observe(report("a", "u1", "10.0.0.1", "nats-route://10.0.0.1:6222", nil), time.Now())
	if got := s.ProbeRefusals("a"); got != nil {
		t.Fatalf("ProbeRefusals after a report without refusals = %v, want none", got)
	}
	if got := s.ProbeRefusals("nobody"); got != nil {
		t.Fatalf("ProbeRefusals of a node that never reported = %v, want none", got)
	}
}
