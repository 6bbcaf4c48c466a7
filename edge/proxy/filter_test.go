package proxy

import (
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/atoll-edge/atoll/internal/objectview"
	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

const zone = "zone"

func testNode(name string, labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func testService(name, keys string, headless bool) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10"}}
	if keys != "" {
		s.Annotations = map[string]string{wellknown.TopologyKeysAnnotation: keys}
	}
	if headless {
		s.Spec.ClusterIP = corev1.ClusterIPNone
	}
	return s
}

// testSlice is a slice of svc with one endpoint per node, addressed
// 10.0.0.<i>.
func testSlice(name, svc string, nodes ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, n := range nodes {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{"ip-" + n}, NodeName: ptr.To(n)})
	}
	return s
}

func view(t *testing.T, kind string, obj objectview.Object) *atollv1.ObjectView {
	t.Helper()
	v, err := objectview.Encode(kind, obj)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// feed applies objects to s in order, as the cloud publishes them: Nodes
// in the unit's space, the other kinds in the shared one, a slice or
// Endpoints with the topology of the Nodes and its Service fed before.
func feed(t *testing.T, s *Store, objs ...objectview.Object) {
	t.Helper()
	for _, o := range objs {
		kind := kindOf(o)
		sp := SharedSpace
		if kind == objectview.KindNodes {
			sp = UnitSpace
		}
		s.mu.RLock()
		o = cloudView(o, s.raw[objectview.KindNodes], s.raw[objectview.KindServices])
		s.mu.RUnlock()
		if err := s.Apply(sp, view(t, kind, o), s.Seq()+1); err != nil {
			t.Fatal(err)
		}
	}
}

// cloudView is o as the cloud publishes it (cloud/views/objects): a
// slice or Endpoints carries its endpoints' nodes' values of its
// Service's topology keys, read from nodes (by name) and svcs (by
// namespace/name). Other objects are returned as they are.
func cloudView[N, S objectview.Object](o objectview.Object, nodes map[string]N, svcs map[string]S) objectview.Object {
	svcName := o.GetName()
	switch o.(type) {
	case *discoveryv1.EndpointSlice:
		svcName = o.GetLabels()[discoveryv1.LabelServiceName]
	case *corev1.Endpoints:
	default:
		return o
	}
	svc, ok := svcs[objKey(o.GetNamespace(), svcName)]
	if !ok {
		return o
	}
	keys := objectview.TopologyKeys(any(svc).(*corev1.Service))
	if len(keys) == 0 {
		return o
	}
	topo := objectview.EndpointTopology{}
	for _, n := range objectview.EndpointNodes(o) {
		if node, ok := nodes[n]; ok {
			if v := objectview.NodeTopology(keys, node.GetLabels()); v != nil {
				topo[n] = v
			}
		}
	}
	c := o.DeepCopyObject().(objectview.Object)
	a := maps.Clone(c.GetAnnotations())
	if a == nil {
		a = map[string]string{}
	}
	a[wellknown.EndpointTopologyAnnotation] = topo.Encode()
	c.SetAnnotations(a)
	return c
}

func servedNodes(t *testing.T, s *Store, slice string) []string {
	t.Helper()
	o, ok := s.Get(objectview.KindEndpointSlices, "default", slice)
	if !ok {
		t.Fatalf("slice %s not served", slice)
	}
	var out []string
	for _, ep := range o.(*discoveryv1.EndpointSlice).Endpoints {
		out = append(out, *ep.NodeName)
	}
	slices.Sort(out)
	return out
}

// The reference cases of the filter (application-grid-wrapper): nodes
// a1, a2 in zone A, b1 in zone B, x1 without the key; the host is a1.
func TestFilter(t *testing.T) {
	nodes := []objectview.Object{
		testNode("a1", map[string]string{zone: "A", "region": "R"}),
		testNode("a2", map[string]string{zone: "A", "region": "R"}),
		testNode("b1", map[string]string{zone: "B", "region": "R"}),
		testNode("x1", map[string]string{}),
	}
	tests := []struct {
		name     string
		host     string
		hostNode *corev1.Node // replaces the host's labels when set
		keys     string
		headless bool
		eps      []string
		want     []string
	}{
		{name: "host in A sees only A's endpoints", host: "a1", keys: zone, eps: []string{"a1", "a2", "b1"}, want: []string{"a1", "a2"}},
		{name: "host in B sees only B's", host: "b1", keys: zone, eps: []string{"a1", "a2", "b1"}, want: []string{"b1"}},
		{name: "no keys: unfiltered", host: "a1", eps: []string{"a1", "b1"}, want: []string{"a1", "b1"}},
		{name: "headless passes through", host: "a1", keys: zone, headless: true, eps: []string{"a1", "b1"}, want: []string{"a1", "b1"}},
		{name: "fallback to the next key", host: "a1", keys: zone + ",region", eps: []string{"b1"}, want: []string{"b1"}},
		{name: "first key that yields wins", host: "a1", keys: zone + ",region", eps: []string{"a2", "b1"}, want: []string{"a2"}},
		{name: "star as last key: any endpoint", host: "a1", keys: zone + ",*", eps: []string{"b1", "x1"}, want: []string{"b1", "x1"}},
		{name: "no key yields: none", host: "a1", keys: zone, eps: []string{"b1"}, want: nil},
		{name: "host without the key sees none", host: "x1", keys: zone, eps: []string{"a1", "b1"}, want: nil},
		{name: "host without the key falls back to star", host: "x1", keys: zone + ",*", eps: []string{"a1"}, want: []string{"a1"}},
		{name: "endpoint on an unknown node is dropped", host: "a1", keys: zone, eps: []string{"a1", "ghost"}, want: []string{"a1"}},
		{name: "keys with spaces", host: "b1", keys: " zone , region ", eps: []string{"a1", "b1"}, want: []string{"b1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewStore(tt.host, 100, nil)
			feed(t, s, nodes...)
			feed(t, s, testService("web", tt.keys, tt.headless), testSlice("web-1", "web", tt.eps...))
			if got := servedNodes(t, s, "web-1"); !slices.Equal(got, tt.want) {
				t.Fatalf("served endpoints on %v, want %v", got, tt.want)
			}
		})
	}
}

// The key is chosen over all the Service's slices, not per slice: a host
// in A with A's endpoint in one slice sees none of the other slice's B
// endpoints.
func TestFilterAcrossSlices(t *testing.T) {
	s := NewStore("a1", 100, nil)
	feed(t, s, testNode("a1", map[string]string{zone: "A"}), testNode("b1", map[string]string{zone: "B"}),
		testService("web", zone, false), testSlice("web-1", "web", "a1"), testSlice("web-2", "web", "b1"))
	if got := servedNodes(t, s, "web-2"); len(got) != 0 {
		t.Fatalf("web-2 serves %v", got)
	}
	if got := servedNodes(t, s, "web-1"); !slices.Equal(got, []string{"a1"}) {
		t.Fatalf("web-1 serves %v", got)
	}
}

// collect drains the events of a watch so far.
func collect(ch <-chan Event) []Event {
	var out []Event
	for {
		select {
		case ev := <-ch:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// Relabeling the host from A to B switches the view with exactly one
// MODIFIED per affected object (the topology service's slice and
// Endpoints), nothing for the plain service; an unrelated annotation
// change on the host emits nothing for slices.
func TestRelabelHost(t *testing.T) {
	s := NewStore("h", 100, nil)
	host := testNode("h", map[string]string{zone: "A"})
	ep := &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"}, Subsets: []corev1.EndpointSubset{{
		Addresses: []corev1.EndpointAddress{{IP: "1.1.1.1", NodeName: ptr.To("a1")}, {IP: "2.2.2.2", NodeName: ptr.To("b1")}},
	}}}
	feed(t, s, host, testNode("a1", map[string]string{zone: "A"}), testNode("b1", map[string]string{zone: "B"}),
		testService("web", zone, false), testSlice("web-1", "web", "a1", "b1"), ep,
		testService("plain", "", false), testSlice("plain-1", "plain", "a1", "b1"))
	if got := servedNodes(t, s, "web-1"); !slices.Equal(got, []string{"a1"}) {
		t.Fatalf("in A: %v", got)
	}
	_, _, slicesCh, stop1, err := s.Watch(objectview.KindEndpointSlices, match{}, s.Rev(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer stop1()
	_, _, epCh, stop2, err := s.Watch(objectview.KindEndpoints, match{}, s.Rev(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer stop2()

	// An unrelated annotation on the host: nothing for slices or endpoints.
	h2 := host.DeepCopy()
	h2.Annotations = map[string]string{"unrelated": "x"}
	feed(t, s, h2)
	if evs := collect(slicesCh); len(evs) != 0 {
		t.Fatalf("unrelated change emitted %v", evs)
	}
	if evs := collect(epCh); len(evs) != 0 {
		t.Fatalf("unrelated change emitted %v", evs)
	}

	// Relabel to B: one MODIFIED for web-1, one for Endpoints web.
	h3 := h2.DeepCopy()
	h3.Labels[zone] = "B"
	feed(t, s, h3)
	evs := collect(slicesCh)
	if len(evs) != 1 || evs[0].Type != watch.Modified || evs[0].Obj.GetName() != "web-1" {
		t.Fatalf("relabel emitted %v, want one MODIFIED of web-1", evs)
	}
	if got := servedNodes(t, s, "web-1"); !slices.Equal(got, []string{"b1"}) {
		t.Fatalf("in B: %v", got)
	}
	evs = collect(epCh)
	if len(evs) != 1 || evs[0].Type != watch.Modified {
		t.Fatalf("relabel emitted %v for Endpoints, want one MODIFIED", evs)
	}
	if a := evs[0].Obj.(*corev1.Endpoints).Subsets[0].Addresses; len(a) != 1 || a[0].IP != "2.2.2.2" {
		t.Fatalf("Endpoints in B: %v", a)
	}
	// Resource versions only grow.
	if evs[0].RV <= 0 || evs[0].RV != s.Rev() {
		t.Fatalf("rv %d, store at %d", evs[0].RV, s.Rev())
	}
}

func kindOf(o objectview.Object) string {
	switch o.(type) {
	case *corev1.Node:
		return objectview.KindNodes
	case *corev1.Service:
		return objectview.KindServices
	case *discoveryv1.EndpointSlice:
		return objectview.KindEndpointSlices
	}
	return objectview.KindEndpoints
}
