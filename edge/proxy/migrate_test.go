package proxy

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/objectview"
	"github.com/atoll-edge/atoll/internal/testenv/natstest"
	"github.com/atoll-edge/atoll/internal/testenv/poll"
)

// purgeUnit purges the views of kinds from unit's space, as the cloud
// does when it moves a stream to the shared space.
func (r *restartableHub) purgeUnit(t *testing.T, unit string, kinds ...string) {
	t.Helper()
	r.mu.Lock()
	h := r.h
	r.mu.Unlock()
	nc, err := h.Connect("cloud")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.NewWithDomain(nc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, events.StreamViews)
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range kinds {
		if err := st.Purge(ctx, jetstream.WithPurgeSubject("atoll.view."+unit+"."+kind+".>")); err != nil {
			t.Fatal(err)
		}
	}
}

// writeOldState writes to dir the state, of the layout before the shared
// space, of a proxy of a1 in u1 that read objs at sequences 1….
func writeOldState(t *testing.T, dir string, objs []objectview.Object) {
	t.Helper()
	s := NewStore("a1", 100, nil)
	feed(t, s, objs...)
	st := snapshotOf(t, s)
	st.Raw, st.SharedRaw = append(st.Raw, st.SharedRaw...), nil
	st.Unit, st.Layout, st.Seq, st.SharedSeq = "u1", 0, uint64(len(objs)), 0
	st.Generation = 1
	b, err := proto.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, StateFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// proxyOn runs a proxy of a1 in u1 with its state in dir, through an
// edge server of rh.
func proxyOn(t *testing.T, rh *restartableHub, dir string) *Proxy {
	t.Helper()
	edge := natstest.Unit(t, rh, "u1", natstest.EdgeOptions{}, "a1")[0]
	nc, err := edge.Connect("proxy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, hub.Default().Domain)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	p, _ := runProxy(t, nil, addr, dir, edge, hublink.Of(nc, js), nil)
	return p
}

// TestMigrateWaitsForSharedViews: an old state whose hub holds no shared
// views yet (the cloud not upgraded) keeps serving what it kept, and its
// unit space's cursor follows; once the cloud moves the stream to the
// shared space, the migration ends.
func TestMigrateWaitsForSharedViews(t *testing.T) {
	rh := newRestartableHub(t)
	a1 := testNode("a1", map[string]string{zone: "A"})
	web, slice, gone := testService("web", zone, false), testSlice("web-1", "web", "a1"), testService("gone", "", false)
	old := []objectview.Object{a1, web, slice, gone}
	rh.publishTo(t, "u1", old...)
	dir := t.TempDir()
	writeOldState(t, dir, old)
	ps := proxyOn(t, rh, dir).Store()
	// The old cloud changes a1: the unit's cursor follows.
	a1New := testNode("a1", map[string]string{zone: "A", "new": "1"})
	rh.publishTo(t, "u1", a1New)
	poll.Eventually(t, 30*time.Second, func() error {
		if n, ok := ps.Get(objectview.KindNodes, "", "a1"); !ok || n.GetLabels()["new"] != "1" {
			return fmt.Errorf("a1's change not served: %v", n)
		}
		return nil
	})
	for _, o := range old {
		if _, ok := ps.Get(kindOf(o), o.GetNamespace(), o.GetName()); !ok {
			t.Fatalf("%s %s no longer served while the hub has no shared views", kindOf(o), o.GetName())
		}
	}
	if !ps.Migrating() {
		t.Fatal("the migration ended without shared views")
	}
	// The cloud moves to the shared space.
	rh.purgeUnit(t, "u1", objectview.KindServices, objectview.KindEndpointSlices, objectview.KindEndpoints, objectview.KindNodes)
	rh.publish(t, "u1", a1New, web, slice)
	poll.Eventually(t, 60*time.Second, func() error {
		if ps.Migrating() {
			return fmt.Errorf("migration not ended")
		}
		if _, ok := ps.Get(objectview.KindServices, "default", "gone"); ok {
			return fmt.Errorf("gone still served")
		}
		return nil
	})
	// The migration may end at the first shared view, before web-1's.
	poll.Eventually(t, 10*time.Second, func() error {
		if _, ok := ps.Get(objectview.KindEndpointSlices, "default", "web-1"); !ok {
			return fmt.Errorf("web-1 not served after the migration")
		}
		return nil
	})
}

// TestMigrateOldState: a proxy state of the layout before the shared
// space (one sequence over atoll.view.<unit>.>, every view in it, other
// units' Nodes stripped) loads and serves as it was, with the hub down;
// its sequence becomes the unit space's cursor and the shared space is
// read from its start. Once the hub holds the new layout (the cloud
// purged the unit's space and publishes the shared one) the proxy reads
// the shared space, and then drops what the stream no longer has: a
// Service deleted meanwhile, and the other unit's Node kept from the unit's
// space (b1's labels now travel in web-1's view, which serves the same:
// nothing for it). Watchers see exactly those changes, nothing for the
// rest.
func TestMigrateOldState(t *testing.T) {
	rh := newRestartableHub(t)
	a1 := testNode("a1", map[string]string{zone: "A"})
	a1.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}}
	b1 := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b1", Labels: map[string]string{zone: "B"}}}
	web, slice, gone := testService("web", zone, false), testSlice("web-1", "web", "a1", "b1"), testService("gone", "", false)
	old := []objectview.Object{a1, b1, web, slice, gone}
	// The old layout on the hub, and a state that read all of it.
	rh.publishTo(t, "u1", old...)
	dir := t.TempDir()
	writeOldState(t, dir, old)

	// Loaded with the hub unreachable: served as it was.
	s, _ := loaded(t, dir)
	if !s.Migrating() || s.SeqOf(UnitSpace) != uint64(len(old)) || s.SeqOf(SharedSpace) != 0 || !s.Reloading(SharedSpace) {
		t.Fatalf("loaded: migrating %v, unit seq %d, shared seq %d, reloading %v", s.Migrating(), s.SeqOf(UnitSpace), s.SeqOf(SharedSpace), s.Reloading(SharedSpace))
	}
	for _, o := range old {
		if _, ok := s.Get(kindOf(o), o.GetNamespace(), o.GetName()); !ok {
			t.Fatalf("%s %s not served after the load", kindOf(o), o.GetName())
		}
	}
	if got := servedNodes(t, s, "web-1"); fmt.Sprint(got) != "[a1]" {
		t.Fatalf("web-1 serves %v, want [a1]", got)
	}
	// A save writes the new layout, and it loads the same.
	save(t, s, dir)
	if s2, st := loaded(t, dir); st.GetLayout() != StateLayout || !s2.Migrating() || s2.SeqOf(UnitSpace) != uint64(len(old)) {
		t.Fatalf("saved: layout %d, migrating %v, unit seq %d", st.GetLayout(), s2.Migrating(), s2.SeqOf(UnitSpace))
	}

	// The cloud moves the stream to the shared space: b1 got a label
	// meanwhile, "gone" was deleted.
	rh.purgeUnit(t, "u1", objectview.KindServices, objectview.KindEndpointSlices, objectview.KindEndpoints, objectview.KindNodes)
	b1New := testNode("b1", map[string]string{zone: "B", "extra": "x"})
	rh.publish(t, "u1", a1)
	rh.publish(t, "u9", b1New)
	rh.publish(t, "u1", web, slice)

	ps := proxyOn(t, rh, dir).Store()
	var chans []<-chan Event
	for _, kind := range objectview.Kinds {
		_, _, ch, stop, err := ps.Watch(kind, match{}, s.Rev(), false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		chans = append(chans, ch)
	}
	var events []Event
	poll.Eventually(t, 60*time.Second, func() error {
		for _, ch := range chans {
			events = append(events, collect(ch)...)
		}
		if ps.Migrating() || ps.Reloading(SharedSpace) {
			return fmt.Errorf("migration not ended")
		}
		return nil
	})
	for _, ch := range chans {
		events = append(events, collect(ch)...)
	}
	got := eventNames(events)
	want := []string{string(watch.Deleted) + " b1", string(watch.Deleted) + " gone"}
	if len(got) != 2 || !(fmt.Sprint(got) == fmt.Sprint(want) || fmt.Sprint(got) == fmt.Sprint([]string{want[1], want[0]})) {
		t.Fatalf("events %v, want only %v", got, want)
	}
	if n, ok := ps.Get(objectview.KindNodes, "", "b1"); ok {
		t.Fatalf("b1 of another unit served as %v", n)
	}
	if got := servedNodes(t, ps, "web-1"); fmt.Sprint(got) != "[a1]" {
		t.Fatalf("web-1 serves %v, want [a1]", got)
	}
	if n, ok := ps.Get(objectview.KindNodes, "", "a1"); !ok || len(n.(*corev1.Node).Status.Addresses) == 0 {
		t.Fatalf("a1 served as %v, want its unit's full Node", n)
	}
	// Each space has its own feed: the unit's may catch up a moment
	// after the shared one ended the migration.
	poll.Eventually(t, 10*time.Second, func() error {
		if ps.SeqOf(SharedSpace) == 0 || ps.SeqOf(UnitSpace) <= uint64(len(old)) {
			return fmt.Errorf("cursors: unit %d, shared %d", ps.SeqOf(UnitSpace), ps.SeqOf(SharedSpace))
		}
		return nil
	})
}
