package protect

import (
	"encoding/json"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// nodeSet is a Policy protecting the nodes it holds.
type nodeSet map[string]bool

func (s nodeSet) Protected(node string) bool { return s[node] }

func protect(names ...string) nodeSet {
	s := nodeSet{}
	for _, n := range names {
		s[n] = true
	}
	return s
}

func taint(key string, effect corev1.TaintEffect) corev1.Taint {
	return corev1.Taint{Key: key, Effect: effect}
}

var (
	unreachableNoExecute  = taint(corev1.TaintNodeUnreachable, corev1.TaintEffectNoExecute)
	unreachableNoSchedule = taint(corev1.TaintNodeUnreachable, corev1.TaintEffectNoSchedule)
	notReadyNoExecute     = taint(corev1.TaintNodeNotReady, corev1.TaintEffectNoExecute)
	customNoExecute       = taint("example.com/maintenance", corev1.TaintEffectNoExecute)
)

func testNode(name string, taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Taints: taints}}
}

// withReady gives n a Ready condition of status s.
func withReady(n *corev1.Node, s corev1.ConditionStatus) *corev1.Node {
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeReady, Status: s})
	return n
}

func TestNode(t *testing.T) {
	tests := []struct {
		name    string
		node    *corev1.Node
		policy  nodeSet
		want    []corev1.Taint
		changed bool
	}{
		{
			name:    "protected: NoExecute removed, NoSchedule and unrelated taints kept in order",
			node:    testNode("a", customNoExecute, unreachableNoSchedule, unreachableNoExecute, notReadyNoExecute),
			policy:  protect("a"),
			want:    []corev1.Taint{customNoExecute, unreachableNoSchedule, notReadyNoExecute},
			changed: true,
		},
		{
			name:    "protected: the only taint removed",
			node:    testNode("a", unreachableNoExecute),
			policy:  protect("a"),
			want:    nil,
			changed: true,
		},
		{
			name:    "protected: duplicate NoExecute taints all removed",
			node:    testNode("a", unreachableNoExecute, unreachableNoSchedule, unreachableNoExecute),
			policy:  protect("a"),
			want:    []corev1.Taint{unreachableNoSchedule},
			changed: true,
		},
		{
			name:   "protected: NoSchedule alone is kept",
			node:   testNode("a", unreachableNoSchedule),
			policy: protect("a"),
			want:   []corev1.Taint{unreachableNoSchedule},
		},
		{
			name:   "protected: no taints",
			node:   testNode("a"),
			policy: protect("a"),
		},
		{
			name:   "protected: not-ready NoExecute is not ours to remove",
			node:   testNode("a", notReadyNoExecute),
			policy: protect("a"),
			want:   []corev1.Taint{notReadyNoExecute},
		},
		{
			name:   "unprotected node untouched",
			node:   testNode("b", unreachableNoSchedule, unreachableNoExecute),
			policy: protect("a"),
			want:   []corev1.Taint{unreachableNoSchedule, unreachableNoExecute},
		},
		{
			// The node lifecycle controller's cache had the loss; the
			// kubelet had reported since.
			name:    "unprotected node that reports itself Ready: NoExecute removed",
			node:    withReady(testNode("b", unreachableNoSchedule, unreachableNoExecute), corev1.ConditionTrue),
			policy:  protect("a"),
			want:    []corev1.Taint{unreachableNoSchedule},
			changed: true,
		},
		{
			name:   "unprotected node lost by the cloud keeps NoExecute",
			node:   withReady(testNode("b", unreachableNoExecute), corev1.ConditionUnknown),
			policy: protect("a"),
			want:   []corev1.Taint{unreachableNoExecute},
		},
		{
			name:   "unprotected node not ready keeps NoExecute",
			node:   withReady(testNode("b", unreachableNoExecute), corev1.ConditionFalse),
			policy: protect("a"),
			want:   []corev1.Taint{unreachableNoExecute},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.node.DeepCopy()
			got, changed := Node(tt.node, tt.policy)
			if changed != tt.changed {
				t.Errorf("changed = %v, want %v", changed, tt.changed)
			}
			checkEqual(t, "taints", tt.want, got.Spec.Taints)
			checkEqual(t, "input (must not be modified)", before, tt.node)
			if !changed && got != tt.node {
				t.Error("no-op did not return its input")
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func endpoint(ip, node string, c discoveryv1.EndpointConditions) discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: c}
	if node != "" {
		ep.NodeName = ptr(node)
	}
	return ep
}

func conds(ready, serving, terminating *bool) discoveryv1.EndpointConditions {
	return discoveryv1.EndpointConditions{Ready: ready, Serving: serving, Terminating: terminating}
}

func TestEndpointSlice(t *testing.T) {
	var (
		yes, no = ptr(true), ptr(false)
		ready   = conds(yes, yes, nil)
	)
	tests := []struct {
		name    string
		in      []discoveryv1.Endpoint
		want    []discoveryv1.Endpoint
		changed bool
	}{
		{
			name: "protected not ready becomes ready and serving; unprotected stays",
			in: []discoveryv1.Endpoint{
				endpoint("10.0.0.1", "a", conds(no, no, no)),
				endpoint("10.0.0.2", "b", conds(no, no, no)),
				endpoint("10.0.0.3", "a", conds(no, yes, nil)),
			},
			want: []discoveryv1.Endpoint{
				endpoint("10.0.0.1", "a", conds(yes, yes, no)),
				endpoint("10.0.0.2", "b", conds(no, no, no)),
				endpoint("10.0.0.3", "a", ready),
			},
			changed: true,
		},
		{
			name:    "nil conditions of a protected node are set",
			in:      []discoveryv1.Endpoint{endpoint("10.0.0.1", "a", conds(nil, nil, nil))},
			want:    []discoveryv1.Endpoint{endpoint("10.0.0.1", "a", ready)},
			changed: true,
		},
		{
			name: "terminating endpoint of a protected node untouched",
			in:   []discoveryv1.Endpoint{endpoint("10.0.0.1", "a", conds(no, no, yes))},
			want: []discoveryv1.Endpoint{endpoint("10.0.0.1", "a", conds(no, no, yes))},
		},
		{
			name: "endpoint without node name untouched",
			in:   []discoveryv1.Endpoint{endpoint("10.0.0.1", "", conds(no, no, nil))},
			want: []discoveryv1.Endpoint{endpoint("10.0.0.1", "", conds(no, no, nil))},
		},
		{
			name: "already ready and serving: no-op",
			in:   []discoveryv1.Endpoint{endpoint("10.0.0.1", "a", ready), endpoint("10.0.0.2", "b", conds(no, no, nil))},
			want: []discoveryv1.Endpoint{endpoint("10.0.0.1", "a", ready), endpoint("10.0.0.2", "b", conds(no, no, nil))},
		},
		{
			name: "empty slice",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Name: "web-abc", Namespace: "ns"},
				AddressType: discoveryv1.AddressTypeIPv4,
				Endpoints:   tt.in,
			}
			before := in.DeepCopy()
			got, changed := EndpointSlice(in, protect("a"))
			if changed != tt.changed {
				t.Errorf("changed = %v, want %v", changed, tt.changed)
			}
			checkEqual(t, "endpoints", tt.want, got.Endpoints)
			checkEqual(t, "input (must not be modified)", before, in)
			if !changed && got != in {
				t.Error("no-op did not return its input")
			}
		})
	}
}

func addr(ip, node string) corev1.EndpointAddress {
	a := corev1.EndpointAddress{IP: ip}
	if node != "" {
		a.NodeName = ptr(node)
	}
	return a
}

func addrs(a ...corev1.EndpointAddress) []corev1.EndpointAddress { return a }

func TestEndpoints(t *testing.T) {
	httpPorts := []corev1.EndpointPort{{Name: "http", Port: 8080, Protocol: corev1.ProtocolTCP}}
	dnsPorts := []corev1.EndpointPort{{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}}
	tests := []struct {
		name    string
		in      []corev1.EndpointSubset
		want    []corev1.EndpointSubset
		changed bool
	}{
		{
			// a and c are protected, b is not. SuperEdge removed moved
			// addresses by index while iterating and skipped or dropped
			// the wrong ones in exactly this shape.
			name: "interleaved addresses across two subsets",
			in: []corev1.EndpointSubset{
				{
					Addresses: addrs(addr("10.0.0.1", "b")),
					NotReadyAddresses: addrs(addr("10.0.1.1", "a"), addr("10.0.1.2", "b"), addr("10.0.1.3", "a"),
						addr("10.0.1.4", "c"), addr("10.0.1.5", "b"), addr("10.0.1.6", "c")),
					Ports: httpPorts,
				},
				{
					NotReadyAddresses: addrs(addr("10.0.2.1", "b"), addr("10.0.2.2", "c"), addr("10.0.2.3", "b")),
					Ports:             dnsPorts,
				},
			},
			want: []corev1.EndpointSubset{
				{
					Addresses: addrs(addr("10.0.0.1", "b"), addr("10.0.1.1", "a"), addr("10.0.1.3", "a"),
						addr("10.0.1.4", "c"), addr("10.0.1.6", "c")),
					NotReadyAddresses: addrs(addr("10.0.1.2", "b"), addr("10.0.1.5", "b")),
					Ports:             httpPorts,
				},
				{
					Addresses:         addrs(addr("10.0.2.2", "c")),
					NotReadyAddresses: addrs(addr("10.0.2.1", "b"), addr("10.0.2.3", "b")),
					Ports:             dnsPorts,
				},
			},
			changed: true,
		},
		{
			name: "all not-ready addresses move; the list becomes empty",
			in: []corev1.EndpointSubset{{
				NotReadyAddresses: addrs(addr("10.0.1.1", "a"), addr("10.0.1.2", "c")),
				Ports:             httpPorts,
			}},
			want: []corev1.EndpointSubset{{
				Addresses: addrs(addr("10.0.1.1", "a"), addr("10.0.1.2", "c")),
				Ports:     httpPorts,
			}},
			changed: true,
		},
		{
			name: "only the second subset changes",
			in: []corev1.EndpointSubset{
				{NotReadyAddresses: addrs(addr("10.0.1.1", "b")), Ports: httpPorts},
				{Addresses: addrs(addr("10.0.2.1", "b")), NotReadyAddresses: addrs(addr("10.0.2.2", "a")), Ports: dnsPorts},
			},
			want: []corev1.EndpointSubset{
				{NotReadyAddresses: addrs(addr("10.0.1.1", "b")), Ports: httpPorts},
				{Addresses: addrs(addr("10.0.2.1", "b"), addr("10.0.2.2", "a")), Ports: dnsPorts},
			},
			changed: true,
		},
		{
			name: "addresses without node name stay not ready",
			in: []corev1.EndpointSubset{{
				NotReadyAddresses: addrs(addr("10.0.1.1", ""), addr("10.0.1.2", "a")),
				Ports:             httpPorts,
			}},
			want: []corev1.EndpointSubset{{
				Addresses:         addrs(addr("10.0.1.2", "a")),
				NotReadyAddresses: addrs(addr("10.0.1.1", "")),
				Ports:             httpPorts,
			}},
			changed: true,
		},
		{
			name: "no protected not-ready address: no-op",
			in: []corev1.EndpointSubset{{
				Addresses:         addrs(addr("10.0.0.1", "a")),
				NotReadyAddresses: addrs(addr("10.0.1.1", "b")),
				Ports:             httpPorts,
			}},
			want: []corev1.EndpointSubset{{
				Addresses:         addrs(addr("10.0.0.1", "a")),
				NotReadyAddresses: addrs(addr("10.0.1.1", "b")),
				Ports:             httpPorts,
			}},
		},
		{
			name: "no subsets",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns"}, Subsets: tt.in}
			before := in.DeepCopy()
			got, changed := Endpoints(in, protect("a", "c"))
			if changed != tt.changed {
				t.Errorf("changed = %v, want %v", changed, tt.changed)
			}
			checkEqual(t, "subsets", tt.want, got.Subsets)
			checkEqual(t, "input (must not be modified)", before, in)
			if !changed && got != in {
				t.Error("no-op did not return its input")
			}
		})
	}
}

func TestProtectNil(t *testing.T) {
	p := protect("a")
	if n, ok := Node(nil, p); n != nil || ok {
		t.Error("Node(nil) changed something")
	}
	if s, ok := EndpointSlice(nil, p); s != nil || ok {
		t.Error("EndpointSlice(nil) changed something")
	}
	if e, ok := Endpoints(nil, p); e != nil || ok {
		t.Error("Endpoints(nil) changed something")
	}
}

// checkEqual fails t when got differs from want, showing both as JSON.
func checkEqual[T any](t *testing.T, what string, want, got T) {
	t.Helper()
	if reflect.DeepEqual(want, got) {
		return
	}
	w, _ := json.MarshalIndent(want, "", "  ")
	g, _ := json.MarshalIndent(got, "", "  ")
	t.Errorf("%s:\nwant %s\ngot  %s", what, w, g)
}
