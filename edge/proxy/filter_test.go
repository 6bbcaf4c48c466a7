package proxy

import (
	"fmt"
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
		notReady []string // nodes whose endpoints are not ready
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
		// Fallback: a key counts only with a ready endpoint near.
		{name: "some near ready: only the near ones", host: "a1", keys: zone + ",*", eps: []string{"a1", "a2", "b1"}, notReady: []string{"a1"}, want: []string{"a1", "a2"}},
		{name: "none near ready: star serves every endpoint", host: "a1", keys: zone + ",*", eps: []string{"a1", "a2", "b1"}, notReady: []string{"a1", "a2"}, want: []string{"a1", "a2", "b1"}},
		{name: "none near ready: the next key with a ready one", host: "a1", keys: zone + ",region", eps: []string{"a1", "b1"}, notReady: []string{"a1"}, want: []string{"a1", "b1"}},
		{name: "none near ready, no star: the near ones, not ready", host: "a1", keys: zone, eps: []string{"a1", "b1"}, notReady: []string{"a1"}, want: []string{"a1"}},
		{name: "none ready anywhere, star: every endpoint", host: "a1", keys: zone + ",*", eps: []string{"a1", "b1"}, notReady: []string{"a1", "b1"}, want: []string{"a1", "b1"}},
		{name: "none ready under any key: the first key's", host: "a1", keys: zone + ",region", eps: []string{"a1", "b1"}, notReady: []string{"a1", "b1"}, want: []string{"a1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewStore(tt.host, 100, nil)
			feed(t, s, nodes...)
			sl := testSlice("web-1", "web", tt.eps...)
			ep := &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"}, Subsets: []corev1.EndpointSubset{{}}}
			for i, e := range sl.Endpoints {
				a := corev1.EndpointAddress{IP: e.Addresses[0], NodeName: e.NodeName}
				if slices.Contains(tt.notReady, *e.NodeName) {
					sl.Endpoints[i].Conditions.Ready = ptr.To(false)
					ep.Subsets[0].NotReadyAddresses = append(ep.Subsets[0].NotReadyAddresses, a)
				} else {
					ep.Subsets[0].Addresses = append(ep.Subsets[0].Addresses, a)
				}
			}
			feed(t, s, testService("web", tt.keys, tt.headless), sl, ep)
			if got := servedNodes(t, s, "web-1"); !slices.Equal(got, tt.want) {
				t.Fatalf("served endpoints on %v, want %v", got, tt.want)
			}
			// Endpoints the same.
			o, _ := s.Get(objectview.KindEndpoints, "default", "web")
			var got []string
			for _, ss := range o.(*corev1.Endpoints).Subsets {
				for _, a := range append(ss.Addresses, ss.NotReadyAddresses...) {
					got = append(got, *a.NodeName)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("Endpoints serve addresses on %v, want %v", got, tt.want)
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

// TestRelabelEitherOrder: the cloud publishes a relabelled Node (the
// unit's space) and the endpoints' views with their new topology (the
// shared space) as separate messages, in either order, one of them
// late, or moves the host to another unit (its Node leaves the unit's
// space, the proxy reads the new unit's). The proxy judges its unit's
// nodes by their Nodes, so what it serves changes once, when the host's
// Node arrives, never through a wrong or empty list in between.
func TestRelabelEitherOrder(t *testing.T) {
	withTopo := func(sl *discoveryv1.EndpointSlice, topo string) *atollv1.ObjectView {
		sl.SetAnnotations(map[string]string{wellknown.EndpointTopologyAnnotation: topo})
		return view(t, objectview.KindEndpointSlices, sl)
	}
	// web has endpoints on the host h, its unit peer a1 and the far b1;
	// solo only on h.
	web := func(hz string) *atollv1.ObjectView {
		return withTopo(testSlice("web-1", "web", "h", "a1", "b1"), fmt.Sprintf(`{"h":{"zone":%q},"a1":{"zone":"A"},"b1":{"zone":"B"}}`, hz))
	}
	solo := func(hz string) *atollv1.ObjectView {
		return withTopo(testSlice("solo-1", "solo", "h"), fmt.Sprintf(`{"h":{"zone":%q}}`, hz))
	}
	node := func(name, z string) *atollv1.ObjectView {
		return view(t, objectview.KindNodes, testNode(name, map[string]string{zone: z}))
	}
	for _, order := range []string{"node first", "slices first", "moved to another unit"} {
		t.Run(order, func(t *testing.T) {
			s := NewStore("h", 100, nil)
			apply := func(sp Space, vs ...*atollv1.ObjectView) {
				t.Helper()
				for _, v := range vs {
					if err := s.Apply(sp, v, s.Seq()+1); err != nil {
						t.Fatal(err)
					}
				}
			}
			apply(UnitSpace, node("h", "A"), node("a1", "A"))
			apply(SharedSpace, view(t, objectview.KindServices, testService("web", zone, false)),
				view(t, objectview.KindServices, testService("solo", zone, false)), web("A"), solo("A"))
			if got := servedNodes(t, s, "web-1"); fmt.Sprint(got) != "[a1 h]" {
				t.Fatalf("web-1 serves %v in zone A", got)
			}
			_, _, ch, stop, err := s.Watch(objectview.KindEndpointSlices, match{}, s.Rev(), false)
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			once := func(step string) {
				t.Helper()
				evs := collect(ch)
				if len(evs) != 1 || evs[0].Type != watch.Modified || evs[0].Obj.GetName() != "web-1" {
					t.Fatalf("%s: events %v, want one MODIFIED of web-1", step, eventNames(evs))
				}
				if got := servedNodes(t, s, "web-1"); fmt.Sprint(got) != "[b1 h]" {
					t.Fatalf("%s: web-1 serves %v in zone B", step, got)
				}
			}
			none := func(step string) {
				t.Helper()
				if evs := collect(ch); len(evs) != 0 {
					t.Fatalf("%s: events %v, want none", step, eventNames(evs))
				}
			}
			switch order {
			case "node first":
				apply(UnitSpace, node("h", "B"))
				once("the Node")
				apply(SharedSpace, web("B"), solo("B"))
				none("the slices after it")
			case "slices first":
				apply(SharedSpace, web("B"), solo("B"))
				none("the slices")
				apply(UnitSpace, node("h", "B"))
				once("the Node after them")
			case "moved to another unit":
				apply(UnitSpace, &atollv1.ObjectView{Kind: objectview.KindNodes, Name: "h", Deleted: true})
				none("the Node leaving the old unit")
				s.Reset("u2")
				s.BeginReload(UnitSpace)
				none("the new unit")
				apply(UnitSpace, node("h", "B"), node("b2", "B"))
				once("the Node in the new unit")
				s.EndReload(UnitSpace, 1)
				apply(SharedSpace, web("B"), solo("B"))
				none("the old unit's Nodes gone, the slices")
			}
			if got := servedNodes(t, s, "solo-1"); fmt.Sprint(got) != "[h]" {
				t.Fatalf("solo-1 serves %v", got)
			}
		})
	}
}
