package webhook

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

func protecting(names ...string) nodeSet {
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
)

func testNode(name string, taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Taints: taints}}
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

func addr(ip, node string) corev1.EndpointAddress {
	a := corev1.EndpointAddress{IP: ip}
	if node != "" {
		a.NodeName = ptr(node)
	}
	return a
}

func addrs(a ...corev1.EndpointAddress) []corev1.EndpointAddress { return a }

func isTrue(b *bool) bool { return b != nil && *b }

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
