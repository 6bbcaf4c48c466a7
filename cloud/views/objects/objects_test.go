package objects

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/objectview"
	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// fixture is a real apiserver, a real hub, and n publishers (replicas),
// each on its own manager.
type fixture struct {
	cluster *kubetest.Cluster
	hub     *hub.Hub
	views   jetstream.Stream
	pubs    []*Publisher
	readers []*countingReader // each publisher's
}

// countingReader counts the Node lists a publisher makes.
type countingReader struct {
	client.Reader
	nodeLists atomic.Int64
}

func (r *countingReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if _, ok := list.(*corev1.NodeList); ok {
		r.nodeLists.Add(1)
	}
	return r.Reader.List(ctx, list, opts...)
}

// start starts a cluster, a hub and replicas publishers.
func start(t *testing.T, replicas int) *fixture {
	t.Helper()
	cluster := kubetest.Start(t)
	h := natstest.Hub(t)
	log := natstest.Logger(t, slog.LevelWarn)
	ctx := t.Context()
	f := &fixture{cluster: cluster, hub: h}
	for i := range replicas {
		nc, err := h.Connect(fmt.Sprint("cloud-", i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.NewWithDomain(nc, h.Domain())
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if err := eventbus.EnsureStreams(ctx, js, events.DefaultStreamOptions()); err != nil {
				t.Fatal(err)
			}
			if f.views, err = js.Stream(ctx, events.StreamViews); err != nil {
				t.Fatal(err)
			}
		}
		mcfg := manager.DefaultConfig()
		mcfg.LeaderElect = false
		m, err := manager.New(mcfg, cluster.RESTConfig(), log)
		if err != nil {
			t.Fatal(err)
		}
		cfg := DefaultConfig()
		cfg.Debounce = 0
		reader := &countingReader{Reader: m.GetClient()}
		f.readers = append(f.readers, reader)
		p, err := New(cfg, reader, hublink.Of(nc, js), log.With("replica", i), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.SetupWithManager(m); err != nil {
			t.Fatal(err)
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if err := m.Start(sctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		t.Cleanup(func() { _ = m.Stop(context.Background()) })
		runCtx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = p.Run(runCtx) }()
		t.Cleanup(func() { stop(); <-done })
		f.pubs = append(f.pubs, p)
	}
	return f
}

// view returns the last view stored on subj (nil: none).
func (f *fixture) view(ctx context.Context, subj string) (*atollv1.ObjectView, uint64, error) {
	raw, err := f.views.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	var v atollv1.ObjectView
	if err := proto.Unmarshal(raw.Data, &v); err != nil {
		return nil, 0, err
	}
	return &v, raw.Sequence, nil
}

// object returns the object of the last view stored on subj (an error
// when there is none, or a tombstone).
func (f *fixture) object(ctx context.Context, subj string) (objectview.Object, error) {
	v, _, err := f.view(ctx, subj)
	if err != nil {
		return nil, err
	}
	if v == nil || v.GetDeleted() {
		return nil, fmt.Errorf("%s: no object stored", subj)
	}
	return objectview.Decode(v)
}

func (f *fixture) lastSeq(t *testing.T) uint64 {
	t.Helper()
	info, err := f.views.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

func node(name, unit, ip string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{wellknown.LabelUnit: unit, "zone": "z-" + unit}},
	}
}

// TestObjectViews: two replicas publish every Service, EndpointSlice and
// Endpoints once in the shared space, a slice with its endpoints' nodes'
// values of its Service's topology keys, and each unit's Nodes in full
// in its own space (and nowhere else); each change is stored once
// whatever the number of replicas; a resync stores nothing; a Node's
// topology label change republishes its slices, another label does not,
// and nor does a heartbeat; a Service's keys decide its slices' topology;
// a deletion leaves one tombstone; a Node moving unit leaves a tombstone
// in the old unit and is in full in the new.
func TestObjectViews(t *testing.T) {
	f := start(t, 2)
	ctx := t.Context()
	kc := f.cluster.Client()
	for _, n := range []*corev1.Node{node("n1", "u1", "10.0.0.1"), node("n2", "u2", "10.0.0.2")} {
		created, err := kc.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.9"}}
		if _, err := kc.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", Annotations: map[string]string{wellknown.TopologyKeysAnnotation: "zone"}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}
	if _, err := kc.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.1.0.1"}, NodeName: ptr.To("n1")}},
		Ports:       []discoveryv1.EndpointPort{{Port: ptr.To[int32](80)}},
	}
	if _, err := kc.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	subjects := map[string]func(*atollv1.ObjectView) error{}
	subjects["atoll.view._all.services.default.web"] = nil
	subjects["atoll.view._all.endpointslices.default.web-1"] = func(v *atollv1.ObjectView) error {
		o, err := objectview.Decode(v)
		if err != nil {
			return err
		}
		if got := o.(*discoveryv1.EndpointSlice).Endpoints; len(got) != 1 || got[0].Addresses[0] != "10.1.0.1" {
			return fmt.Errorf("endpoints %v", got)
		}
		return wantTopology(o, `{"n1":{"zone":"z-u1"}}`)
	}
	// n1 in full for u1 (its status), nowhere else.
	subjects["atoll.view.u1.nodes._.n1"] = func(v *atollv1.ObjectView) error {
		o, err := objectview.Decode(v)
		if err != nil {
			return err
		}
		if n := o.(*corev1.Node); len(n.Status.Addresses) == 0 || n.Labels["zone"] != "z-u1" {
			return fmt.Errorf("own node without its status or labels: %+v", n)
		}
		return nil
	}
	poll.Eventually(t, 30*time.Second, func() error {
		for subj, check := range subjects {
			v, _, err := f.view(ctx, subj)
			if err != nil {
				return err
			}
			if v == nil {
				return fmt.Errorf("%s: nothing stored", subj)
			}
			if check != nil {
				if err := check(v); err != nil {
					return fmt.Errorf("%s: %w", subj, err)
				}
			}
		}
		return nil
	})

	// Settled: the stream stops moving.
	settle := func() uint64 {
		var last uint64
		stable := 0
		poll.Eventually(t, 20*time.Second, func() error {
			now := f.lastSeq(t)
			if now != last {
				last, stable = now, 0
				return errors.New("stream moving")
			}
			if stable++; stable < 10 {
				return errors.New("watching")
			}
			return nil
		})
		return last
	}
	base := settle()
	// Nothing of the shared kinds, and no other unit's Node, in a unit's
	// space; no Node in the shared space.
	for _, subj := range []string{"atoll.view.u1.services.default.web", "atoll.view.u2.endpointslices.default.web-1", "atoll.view.u2.nodes._.n1", "atoll.view.u1.nodes._.n2", "atoll.view._all.nodes._.n1", "atoll.view._all.nodes._.n2"} {
		if v, _, err := f.view(ctx, subj); err != nil || v != nil {
			t.Errorf("%s: %v, %v: want nothing", subj, v, err)
		}
	}

	// A resync on both replicas stores nothing.
	passes := func() float64 {
		var n float64
		for _, p := range f.pubs {
			n += testutil.ToFloat64(p.metrics.passes)
		}
		return n
	}
	// fanout is the sum of the fan-out histograms: views stored.
	fanout := func() float64 {
		var n float64
		for _, p := range f.pubs {
			var m dto.Metric
			if err := p.metrics.fanout.Write(&m); err != nil {
				t.Fatal(err)
			}
			n += m.GetHistogram().GetSampleSum()
		}
		return n
	}
	fanBefore := fanout()
	before := passes()
	for _, p := range f.pubs {
		p.Resync()
	}
	poll.Eventually(t, 20*time.Second, func() error {
		if passes() < before+2 {
			return errors.New("resync passes not done")
		}
		return nil
	})
	if got := f.lastSeq(t); got != base {
		t.Fatalf("a resync stored %d messages", got-base)
	}
	if got := fanout(); got != fanBefore {
		t.Fatalf("the fan-out histogram counts %v views stored by a resync that stored none", got-fanBefore)
	}

	// One change: one message, whatever the replicas and units.
	slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.1.0.2"}, NodeName: ptr.To("n2")})
	if _, err := kc.DiscoveryV1().EndpointSlices("default").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sliceTopology := func(want string) {
		t.Helper()
		poll.Eventually(t, 20*time.Second, func() error {
			o, err := f.object(ctx, "atoll.view._all.endpointslices.default.web-1")
			if err != nil {
				return err
			}
			if n := len(o.(*discoveryv1.EndpointSlice).Endpoints); n != 2 {
				return fmt.Errorf("%d endpoints", n)
			}
			return wantTopology(o, want)
		})
	}
	sliceTopology(`{"n1":{"zone":"z-u1"},"n2":{"zone":"z-u2"}}`)
	if got := settle(); got != base+1 {
		t.Fatalf("one slice change stored %d messages, want 1", got-base)
	}
	if got := fanout() - fanBefore; got != 1 {
		t.Fatalf("the fan-out histogram counts %v views stored for a change stored once", got)
	}
	base++

	// n2's zone changes: its unit's view and the slice's topology.
	relabel := func(name, k, v string) {
		t.Helper()
		n, err := kc.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Labels[k] = v
		if _, err := kc.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	relabel("n2", "zone", "z-9")
	sliceTopology(`{"n1":{"zone":"z-u1"},"n2":{"zone":"z-9"}}`)
	if got := settle(); got != base+2 {
		t.Fatalf("a topology label change stored %d messages, want 2 (the Node's, the slice's)", got-base)
	}
	base += 2
	// Another label: only the Node's own view.
	relabel("n2", "other", "x")
	if got := settle(); got != base+1 {
		t.Fatalf("another label's change stored %d messages, want 1 (the Node's)", got-base)
	}
	base++
	// The Service's keys go: its view and the slice's, without topology.
	svc, err := kc.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Annotations = nil
	if _, err := kc.CoreV1().Services("default").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sliceTopology("")
	if got := settle(); got != base+2 {
		t.Fatalf("a change of the Service's keys stored %d messages, want 2 (the Service's, the slice's)", got-base)
	}

	// A node heartbeat alone changes no view.
	n1, err := kc.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n1.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now()}}
	if n1, err = kc.CoreV1().Nodes().UpdateStatus(ctx, n1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	base = settle() // the condition itself is news to u1's full view
	n1.Status.Conditions[0].LastHeartbeatTime = metav1.NewTime(time.Now().Add(time.Minute))
	if _, err = kc.CoreV1().Nodes().UpdateStatus(ctx, n1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := settle(); got != base {
		t.Fatalf("a heartbeat stored %d messages", got-base)
	}

	// Deletion: one tombstone.
	if err := kc.DiscoveryV1().EndpointSlices("default").Delete(ctx, "web-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 20*time.Second, func() error {
		v, _, err := f.view(ctx, "atoll.view._all.endpointslices.default.web-1")
		if err != nil {
			return err
		}
		if !v.GetDeleted() || v.GetUid() == "" {
			return fmt.Errorf("no tombstone with the uid: %v", v)
		}
		return nil
	})
	if got := settle(); got != base+1 {
		t.Fatalf("a deletion stored %d messages, want 1", got-base)
	}
	base++

	// n1 moves to u2: a tombstone in u1, in full in u2: two messages.
	if n1, err = kc.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	n1.Labels[wellknown.LabelUnit] = "u2"
	if _, err := kc.CoreV1().Nodes().Update(ctx, n1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 20*time.Second, func() error {
		old, _, err := f.view(ctx, "atoll.view.u1.nodes._.n1")
		if err != nil {
			return err
		}
		if !old.GetDeleted() {
			return errors.New("no tombstone in u1")
		}
		v, _, err := f.view(ctx, "atoll.view.u2.nodes._.n1")
		if err != nil || v == nil {
			return fmt.Errorf("not in u2: %v", err)
		}
		if o, err := objectview.Decode(v); err != nil || len(o.(*corev1.Node).Status.Addresses) == 0 {
			return fmt.Errorf("not in full in u2: %v", err)
		}
		return nil
	})
	if got := settle(); got != base+2 {
		t.Fatalf("a move stored %d messages, want 2", got-base)
	}
}

// wantTopology checks the topology o's view carries ("": none).
func wantTopology(o objectview.Object, want string) error {
	got, ok := o.GetAnnotations()[wellknown.EndpointTopologyAnnotation]
	if got != want || ok != (want != "") {
		return fmt.Errorf("topology %q (present: %v), want %q", got, ok, want)
	}
	return nil
}

// TestTombstoneForObjectDeletedWhileDown: a view on the stream whose object
// no longer exists (deleted while no publisher ran) gets its tombstone at
// the first pass.
func TestTombstoneForObjectDeletedWhileDown(t *testing.T) {
	f := start(t, 1)
	ctx := t.Context()
	kc := f.cluster.Client()
	if _, err := kc.CoreV1().Nodes().Create(ctx, node("n1", "u1", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 20*time.Second, func() error {
		v, _, err := f.view(ctx, "atoll.view.u1.nodes._.n1")
		if err != nil || v == nil {
			return fmt.Errorf("n1 not published: %v", err)
		}
		return nil
	})
	// A Service view as a former publisher left it.
	old, err := objectview.Encode(objectview.KindServices, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "gone", Namespace: "default", UID: "u-gone"}})
	if err != nil {
		t.Fatal(err)
	}
	nc := f.pubs[0].bus.Conn()
	js := f.pubs[0].bus.JetStream()
	if _, err := events.PublishDurable(ctx, js, "atoll.view._all.services.default.gone", old, "old"); err != nil {
		t.Fatal(err)
	}
	_ = nc
	f.pubs[0].Resync()
	poll.Eventually(t, 20*time.Second, func() error {
		v, _, err := f.view(ctx, "atoll.view._all.services.default.gone")
		if err != nil {
			return err
		}
		if !v.GetDeleted() {
			return errors.New("no tombstone")
		}
		return nil
	})
}

// TestBrokenViewRepaired: views that no edge can serve stored over live
// objects' subjects (bytes that do not decode, a slice whose topology does
// not decode, a Node's subject holding another kind, and a Node's view in
// the space of a unit it is not in) are replaced at once by both
// replicas, one message each (the right view, or a tombstone where the
// Node is not). test/integration/objectviews has an edge proxy started
// afterwards serve them.
func TestBrokenViewRepaired(t *testing.T) {
	f := start(t, 2)
	ctx := t.Context()
	kc := f.cluster.Client()
	if _, err := kc.CoreV1().Nodes().Create(ctx, node("n1", "u1", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", Annotations: map[string]string{wellknown.TopologyKeysAnnotation: "zone"}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.1.0.1"}, NodeName: ptr.To("n1")}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const (
		svcSubj   = "atoll.view._all.services.default.web"
		sliceSubj = "atoll.view._all.endpointslices.default.web-1"
		nodeSubj  = "atoll.view.u1.nodes._.n1"
		farSubj   = "atoll.view.u2.nodes._.n1"
	)
	kindOf := map[string]string{svcSubj: objectview.KindServices, sliceSubj: objectview.KindEndpointSlices,
		nodeSubj: objectview.KindNodes, farSubj: objectview.KindNodes}
	poll.Eventually(t, 30*time.Second, func() error {
		for _, subj := range []string{svcSubj, sliceSubj, nodeSubj} {
			if _, err := f.object(ctx, subj); err != nil {
				return err
			}
		}
		return nil
	})

	encode := func(v *atollv1.ObjectView) []byte {
		b, err := proto.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	badTopology, err := objectview.Encode(objectview.KindEndpointSlices, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{
		Name: "web-1", Namespace: "default", Annotations: map[string]string{wellknown.EndpointTopologyAnnotation: `{"n1":`}}})
	if err != nil {
		t.Fatal(err)
	}
	otherKind, err := objectview.Encode(objectview.KindServices, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	if err != nil {
		t.Fatal(err)
	}
	garbage := map[string][]byte{
		svcSubj:   []byte("\xff\x00 not a view"),
		sliceSubj: encode(badTopology),
		nodeSubj:  encode(otherKind),
		farSubj:   []byte("garbage"),
	}
	for subj, data := range garbage {
		if err := servable(kindOf[subj], data); err == nil {
			t.Fatalf("the garbage for %s is servable", subj)
		}
	}
	js := f.pubs[0].bus.JetStream()
	before := f.lastSeq(t)
	stored := time.Now()
	for subj, data := range garbage {
		if _, err := js.Publish(ctx, subj, data); err != nil {
			t.Fatal(err)
		}
	}
	poll.Eventually(t, 20*time.Second, func() error {
		for subj := range garbage {
			raw, err := f.views.GetLastMsgForSubject(ctx, subj)
			if err != nil {
				return fmt.Errorf("%s: %w", subj, err)
			}
			if err := servable(kindOf[subj], raw.Data); err != nil {
				return fmt.Errorf("%s: %w", subj, err)
			}
			var v atollv1.ObjectView
			_ = proto.Unmarshal(raw.Data, &v)
			if v.GetDeleted() != (subj == farSubj) {
				return fmt.Errorf("%s: deleted %v", subj, v.GetDeleted())
			}
		}
		return nil
	})
	t.Logf("repaired %v after the garbage was stored", time.Since(stored))
	if n := f.lastSeq(t) - before; n != uint64(2*len(garbage)) {
		t.Errorf("%d messages stored for %d broken views, want the garbage and one repair each", n, len(garbage))
	}
	repaired := 0.0
	for _, p := range f.pubs {
		for _, kind := range objectview.Kinds {
			repaired += testutil.ToFloat64(p.metrics.repaired.WithLabelValues(kind))
		}
	}
	if repaired < float64(len(garbage)) {
		t.Errorf("repairs counted: %v, want at least %d", repaired, len(garbage))
	}
}
