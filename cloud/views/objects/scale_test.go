package objects

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/poll"
)

// streamCounts are the messages of the VIEWS stream by space: "_all" or
// a unit.
func streamCounts(t *testing.T, f *fixture) (map[string]int, uint64) {
	t.Helper()
	info, err := f.views.Info(t.Context(), jetstream.WithSubjectFilter(events.ViewSubjects))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for subj, n := range info.State.Subjects {
		k, err := events.ParseViewSubject(subj)
		if err != nil {
			t.Fatalf("%s: %v", subj, err)
		}
		out[k.Unit] += int(n)
	}
	return out, info.State.Msgs
}

// settled waits for the stream to stop moving and returns its last
// sequence.
func settled(t *testing.T, f *fixture) uint64 {
	t.Helper()
	var last uint64
	stable := 0
	poll.Eventually(t, 30*time.Second, func() error {
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

// sharedObjects counts the Services, EndpointSlices and Endpoints of the
// cluster (the apiserver keeps the kubernetes Service's own).
func sharedObjects(t *testing.T, cluster *kubetest.Cluster) int {
	t.Helper()
	ctx := t.Context()
	kc := cluster.Client()
	svcs, err := kc.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	slices, err := kc.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eps, err := kc.CoreV1().Endpoints("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return len(svcs.Items) + len(slices.Items) + len(eps.Items)
}

// TestViewsStoredOnce: with U units, N nodes and S Services (with their
// slices and Endpoints), the VIEWS stream holds S + slices + Endpoints in
// the shared space and N full Nodes in the units' spaces, not ×U; a
// change of one Service stores one message.
func TestViewsStoredOnce(t *testing.T) {
	const units, perUnit, services = 4, 3, 5
	f := start(t, 1)
	ctx := t.Context()
	kc := f.cluster.Client()
	for u := range units {
		for i := range perUnit {
			if _, err := kc.CoreV1().Nodes().Create(ctx, node(fmt.Sprintf("n-%d-%d", u, i), fmt.Sprint("u", u), ""), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range services {
		name := fmt.Sprint("svc-", i)
		if _, err := kc.CoreV1().Services("default").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := kc.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{fmt.Sprintf("10.1.0.%d", i+1)}, NodeName: ptr.To("n-0-0")}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	const nodes = units * perUnit
	var shared int
	poll.Eventually(t, 60*time.Second, func() error {
		shared = sharedObjects(t, f.cluster)
		got, total := streamCounts(t, f)
		want := map[string]int{events.SharedSpace: shared}
		for u := range units {
			want[fmt.Sprint("u", u)] = perUnit
		}
		if fmt.Sprint(got) != fmt.Sprint(want) || total != uint64(shared+nodes) {
			return fmt.Errorf("stream holds %v (%d messages), want %v (%d)", got, total, want, shared+nodes)
		}
		return nil
	})
	t.Logf("%d units, %d nodes, %d shared objects: %d messages", units, nodes, shared, shared+nodes)

	// One Service change: one message.
	base := settled(t, f)
	svc, err := kc.CoreV1().Services("default").Get(ctx, "svc-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Annotations = map[string]string{"team": "a"}
	if _, err := kc.CoreV1().Services("default").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 20*time.Second, func() error {
		o, err := f.object(ctx, "atoll.view._all.services.default.svc-0")
		if err != nil {
			return err
		}
		if o.GetAnnotations()["team"] != "a" {
			return errors.New("change not stored")
		}
		return nil
	})
	if got := settled(t, f); got != base+1 {
		t.Fatalf("one Service change stored %d messages, want 1", got-base)
	}
}

// TestPassReadsDirtyNodesOnly: after the first pass, a pass for one
// Node's change reads that Node, not every Node (a pass must cost its
// changes, not the cluster); a Node that joins a new unit still starts a
// full pass, and the resync lists them all again.
func TestPassReadsDirtyNodesOnly(t *testing.T) {
	f := start(t, 1)
	ctx := t.Context()
	kc := f.cluster.Client()
	for i := range 4 {
		if _, err := kc.CoreV1().Nodes().Create(ctx, node(fmt.Sprint("n-", i), "u1", ""), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	settled(t, f)
	lists := f.readers[0].nodeLists.Load()

	// A label that is not the unit's: the Node's views change, no list.
	n, err := kc.CoreV1().Nodes().Get(ctx, "n-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels["rack"] = "r1"
	if _, err := kc.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 20*time.Second, func() error {
		o, err := f.object(ctx, "atoll.view.u1.nodes._.n-0")
		if err != nil {
			return err
		}
		if o.GetLabels()["rack"] != "r1" {
			return errors.New("change not stored")
		}
		return nil
	})
	if got := f.readers[0].nodeLists.Load(); got != lists {
		t.Fatalf("a pass for one Node's change listed every Node %d times", got-lists)
	}

	// A move into a unit that did not exist: a tombstone in u1, the Node
	// in full in u2, and every view compared (a full pass).
	if n, err = kc.CoreV1().Nodes().Get(ctx, "n-1", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	n.Labels[wellknown.LabelUnit] = "u2"
	if _, err := kc.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 20*time.Second, func() error {
		old, _, err := f.view(ctx, "atoll.view.u1.nodes._.n-1")
		if err != nil || old == nil || !old.GetDeleted() {
			return fmt.Errorf("no tombstone in u1: %v", err)
		}
		v, _, err := f.view(ctx, "atoll.view.u2.nodes._.n-1")
		if err != nil || v == nil || v.GetDeleted() {
			return fmt.Errorf("not in u2: %v", err)
		}
		return nil
	})
	if got := testutil.ToFloat64(f.pubs[0].metrics.units); got != 2 {
		t.Errorf("%v units counted, want 2", got)
	}

	// The resync lists them all.
	lists = f.readers[0].nodeLists.Load()
	f.pubs[0].Resync()
	poll.Eventually(t, 20*time.Second, func() error {
		if f.readers[0].nodeLists.Load() == lists {
			return errors.New("no list after a resync")
		}
		return nil
	})
}
