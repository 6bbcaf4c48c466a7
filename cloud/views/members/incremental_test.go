package members

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// kubeFixture is a Kubernetes-source service on a real hub, over a node
// index the test changes.
type kubeFixture struct {
	*hubFixture
	idx cache.Indexer
}

func newKubeFixture(t testing.TB, nodes []*corev1.Node) *kubeFixture {
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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := eventbus.EnsureStreams(ctx, js, events.StreamOptions{Replicas: 1, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	views, err := js.Stream(ctx, events.StreamViews)
	if err != nil {
		t.Fatal(err)
	}
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, n := range nodes {
		if err := idx.Add(n); err != nil {
			t.Fatal(err)
		}
	}
	cfg := DefaultConfig()
	cfg.Debounce = 0
	s, err := New(cfg, hublink.Of(nc, js), corelisters.NewNodeLister(idx), natstest.Logger(t, slog.LevelWarn), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.open(ctx); err != nil {
		t.Fatal(err)
	}
	return &kubeFixture{hubFixture: &hubFixture{js: js, views: views, svc: s}, idx: idx}
}

func unitNodes(units, size int) []*corev1.Node {
	var out []*corev1.Node
	for u := range units {
		for i := range size {
			out = append(out, kubeNode(fmt.Sprintf("n%d-%d", u, i), map[string]string{wellknown.LabelUnit: fmt.Sprintf("u%d", u)}, fmt.Sprintf("10.%d.%d.%d", u/250, u%250, i+1)))
		}
	}
	return out
}

// TestNodeEventRecomputesItsUnitsOnly: a node moving from unit u0 to u1
// (a Node event) republishes u0's and u1's views and the moved node's
// assignment, with u0's route password rotated (a member left), and
// nothing of u2; a full recompute afterwards finds nothing to publish:
// the incremental pass left the stream exactly as a full one would.
func TestNodeEventRecomputesItsUnitsOnly(t *testing.T) {
	f := newKubeFixture(t, unitNodes(3, 4))
	s := f.svc
	ctx := t.Context()
	if err := s.pass(ctx); err != nil { // the first pass is full
		t.Fatal(err)
	}
	before := map[string]string{}
	for _, n := range []string{"n0-0", "n1-0", "n2-0"} {
		before[n] = f.storedAssignment(t, n).GetRoutePassword()
	}
	u2 := f.storedView(t, "u2")
	seq := f.lastSeq(t)

	moved := kubeNode("n0-3", map[string]string{wellknown.LabelUnit: "u1"}, "10.0.0.4")
	if err := f.idx.Update(moved); err != nil {
		t.Fatal(err)
	}
	s.NodeChanged("n0-3")
	if err := s.pass(ctx); err != nil {
		t.Fatal(err)
	}
	if n := counter(t, s.metrics.incremental); n != 1 {
		t.Fatalf("%v incremental passes, want 1", n)
	}
	if got := memberNames(f.storedView(t, "u0")); got != "n0-0=,n0-1=,n0-2=" {
		t.Errorf("u0 = %s", got)
	}
	if got := memberNames(f.storedView(t, "u1")); got != "n0-3=,n1-0=,n1-1=,n1-2=,n1-3=" {
		t.Errorf("u1 = %s", got)
	}
	if a := f.storedAssignment(t, "n0-3"); a.GetUnit() != "u1" || a.GetRoutePassword() != f.storedAssignment(t, "n1-0").GetRoutePassword() {
		t.Errorf("n0-3 assigned %v", a)
	}
	if f.storedAssignment(t, "n0-0").GetRoutePassword() == before["n0-0"] {
		t.Error("u0's route password not rotated after a member left")
	}
	if f.storedAssignment(t, "n2-0").GetRoutePassword() != before["n2-0"] {
		t.Error("u2's route password changed")
	}
	if !proto.Equal(f.storedView(t, "u2"), u2) {
		t.Error("u2's view republished")
	}
	// u0's view, u1's view, n0-3's and u0's three other assignments
	// (rotated password); u1's members learn the new member from the
	// view, their password is unchanged.
	if n := f.lastSeq(t) - seq; n != 6 {
		t.Errorf("%d views stored for the move, want 6", n)
	}

	seq = f.lastSeq(t)
	s.Changed()
	if err := s.pass(ctx); err != nil {
		t.Fatal(err)
	}
	if n := f.lastSeq(t) - seq; n != 0 {
		t.Errorf("a full recompute after the incremental one stored %d views: they differed", n)
	}

	// The Node is deleted (and its agent never reported): u1 shrinks, and
	// again a full recompute finds the stream as it should be.
	if err := f.idx.Delete(moved); err != nil {
		t.Fatal(err)
	}
	s.NodeChanged("n0-3")
	if err := s.pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := memberNames(f.storedView(t, "u1")); got != "n1-0=,n1-1=,n1-2=,n1-3=" {
		t.Errorf("u1 after the delete = %s", got)
	}
	seq = f.lastSeq(t)
	s.Changed()
	if err := s.pass(ctx); err != nil {
		t.Fatal(err)
	}
	if n := f.lastSeq(t) - seq; n != 0 {
		t.Errorf("a full recompute after the delete stored %d views", n)
	}
}

// TestTopologyReportRecomputesItsUnitOnly: a node's agent reporting a new
// route URL republishes its unit's view alone.
func TestTopologyReportRecomputesItsUnitOnly(t *testing.T) {
	f := newKubeFixture(t, unitNodes(3, 3))
	s := f.svc
	ctx := t.Context()
	if err := s.pass(ctx); err != nil {
		t.Fatal(err)
	}
	seq := f.lastSeq(t)
	s.observe(&atollv1.TopologyUpdate{Node: "n1-1", Unit: "u1", RouteUrl: "nats-route://10.0.1.2:6222"}, time.Now())
	if err := s.pass(ctx); err != nil {
		t.Fatal(err)
	}
	if n := f.lastSeq(t) - seq; n != 1 {
		t.Errorf("%d views stored for one report, want 1 (u1's)", n)
	}
	poll.Eventually(t, time.Second, func() error {
		for _, m := range f.storedView(t, "u1").GetMembers() {
			if m.GetName() == "n1-1" && m.GetRouteUrl() == "nats-route://10.0.1.2:6222" {
				return nil
			}
		}
		return fmt.Errorf("u1 does not carry n1-1's route URL")
	})

	// The same report again (an agent reports every 30 s), with other
	// fingerprints and time: no pass at all.
	passes := testutil.ToFloat64(s.metrics.incremental)
	s.observe(&atollv1.TopologyUpdate{Node: "n1-1", Unit: "u1", RouteUrl: "nats-route://10.0.1.2:6222",
		AssignmentFingerprint: "x", Time: timestamppb.Now()}, time.Now())
	if err := s.pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(s.metrics.incremental) - passes; got != 0 {
		t.Errorf("a repeated report ran %v passes, want 0", got)
	}
	// Another label: a pass.
	s.observe(&atollv1.TopologyUpdate{Node: "n1-1", Unit: "u1", RouteUrl: "nats-route://10.0.1.2:6222",
		Labels: map[string]string{"zone": "b"}}, time.Now())
	if err := s.pass(ctx); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(s.metrics.incremental) - passes; got != 1 {
		t.Errorf("a report with new labels ran %v passes, want 1", got)
	}
}
