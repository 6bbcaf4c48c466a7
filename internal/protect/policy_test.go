package protect

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// richPolicy judges nodes by their own Ready condition and pods by a set.
type richPolicy struct{ serving map[string]bool }

func (richPolicy) Protected(node string) bool { return node == "x" }
func (richPolicy) ProtectedNode(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionUnknown
		}
	}
	return false
}
func (p richPolicy) Serving(ns, pod string) bool { return p.serving[ns+"/"+pod] }

func TestNodePolicyJudgesTheWrittenObject(t *testing.T) {
	taints := []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}}
	for _, tt := range []struct {
		status corev1.ConditionStatus
		want   bool
	}{{corev1.ConditionUnknown, true}, {corev1.ConditionFalse, false}} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "not-x-by-name"}, Spec: corev1.NodeSpec{Taints: taints},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: tt.status}}}}
		if _, changed := Node(n, richPolicy{}); changed != tt.want {
			t.Errorf("Ready=%s: changed=%v, want %v", tt.status, changed, tt.want)
		}
	}
}

func TestPodPolicyKeepsFailingPodsNotReady(t *testing.T) {
	no := false
	x := "x"
	ep := func(pod string) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}, NodeName: &x,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: pod},
			Conditions: discoveryv1.EndpointConditions{Ready: &no, Serving: &no}}
	}
	s := &discoveryv1.EndpointSlice{Endpoints: []discoveryv1.Endpoint{ep("serving"), ep("failing")}}
	out, changed := EndpointSlice(s, richPolicy{serving: map[string]bool{"ns/serving": true}})
	if !changed || !isTrue(out.Endpoints[0].Conditions.Ready) || isTrue(out.Endpoints[1].Conditions.Ready) {
		t.Fatalf("changed=%v endpoints=%+v", changed, out.Endpoints)
	}
	e := &corev1.Endpoints{Subsets: []corev1.EndpointSubset{{NotReadyAddresses: []corev1.EndpointAddress{
		{IP: "10.0.0.1", NodeName: &x, TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "failing"}},
		{IP: "10.0.0.2", NodeName: &x, TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "serving"}},
	}}}}
	oute, changed := Endpoints(e, richPolicy{serving: map[string]bool{"ns/serving": true}})
	if !changed || len(oute.Subsets[0].Addresses) != 1 || oute.Subsets[0].Addresses[0].IP != "10.0.0.2" {
		t.Fatalf("changed=%v subsets=%+v", changed, oute.Subsets)
	}
}

// returningPolicy protects node x and keeps the endpoints of x and of y,
// a node that came back.
type returningPolicy struct{}

func (returningPolicy) Protected(node string) bool      { return node == "x" }
func (returningPolicy) KeepsEndpoints(node string) bool { return node == "x" || node == "y" }

// An EndpointPolicy decides the endpoints, for both kinds, and only them:
// a node whose endpoints it keeps keeps no taint.
func TestEndpointPolicyKeepsEndpoints(t *testing.T) {
	no := false
	nodes := []string{"x", "y", "z"}
	var eps []discoveryv1.Endpoint
	var addrs []corev1.EndpointAddress
	for _, n := range nodes {
		eps = append(eps, discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}, NodeName: &n,
			Conditions: discoveryv1.EndpointConditions{Ready: &no, Serving: &no}})
		addrs = append(addrs, corev1.EndpointAddress{IP: "10.0.0.1", NodeName: &n})
	}
	out, _ := EndpointSlice(&discoveryv1.EndpointSlice{Endpoints: eps}, returningPolicy{})
	for i, want := range []bool{true, true, false} {
		if got := isTrue(out.Endpoints[i].Conditions.Ready); got != want {
			t.Errorf("slice endpoint on %s ready: %v, want %v", nodes[i], got, want)
		}
	}
	oute, _ := Endpoints(&corev1.Endpoints{Subsets: []corev1.EndpointSubset{{NotReadyAddresses: addrs}}}, returningPolicy{})
	if sub := oute.Subsets[0]; len(sub.Addresses) != 2 || len(sub.NotReadyAddresses) != 1 || *sub.NotReadyAddresses[0].NodeName != "z" {
		t.Errorf("endpoints: %+v, want x and y ready, z not", sub)
	}
	taints := []corev1.Taint{{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "y"}, Spec: corev1.NodeSpec{Taints: taints}}
	if _, changed := Node(n, returningPolicy{}); changed {
		t.Error("the taint of a node whose endpoints are kept was removed: only protection does that")
	}
}
