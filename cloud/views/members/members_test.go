package members

import (
	"log/slog"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/internal/wellknown"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

func kubeNode(name string, labels map[string]string, ip string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: ip}}},
	}
}

// TestKubernetesMembership: units come from the unit label, control-plane
// and cloud nodes are left out, a label value that cannot name a unit puts
// the node in no unit, and route URLs come from the agents' reports.
func TestKubernetesMembership(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, n := range []*corev1.Node{
		kubeNode("edge-1.example", map[string]string{wellknown.LabelUnit: "u1"}, "10.0.0.1"),
		kubeNode("edge-2", map[string]string{wellknown.LabelUnit: "u1"}, "10.0.0.2"),
		kubeNode("edge-3", map[string]string{wellknown.LabelUnit: "u2"}, "10.0.0.3"),
		kubeNode("edge-4", nil, "10.0.0.4"),
		kubeNode("edge-5", map[string]string{wellknown.LabelUnit: "atoll-hub"}, "10.0.0.5"),
		kubeNode("master", map[string]string{wellknown.LabelUnit: "u1", "node-role.kubernetes.io/control-plane": ""}, "10.0.9.1"),
		kubeNode("cloud-1", map[string]string{wellknown.LabelUnit: "u1", wellknown.LabelCloud: "true"}, "10.0.9.2"),
	} {
		if err := idx.Add(n); err != nil {
			t.Fatal(err)
		}
	}
	s, err := New(DefaultConfig(), nil, corelisters.NewNodeLister(idx), slog.New(slog.DiscardHandler), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.observe(&atollv1.TopologyUpdate{Node: "edge-2", RouteUrl: "nats-route://10.0.0.2:6222"}, time.Now())

	got := s.membership()
	want := map[string]member{
		"edge-1.example": {unit: "u1", ip: "10.0.0.1"},
		"edge-2":         {unit: "u1", ip: "10.0.0.2", routeURL: "nats-route://10.0.0.2:6222"},
		"edge-3":         {unit: "u2", ip: "10.0.0.3"},
		"edge-4":         {unit: "", ip: "10.0.0.4"},
		"edge-5":         {unit: "", ip: "10.0.0.5"}, // reserved unit name
	}
	if len(got) != len(want) {
		t.Fatalf("members = %v, want %d nodes", got, len(want))
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok || g.unit != w.unit || g.ip != w.ip || g.routeURL != w.routeURL {
			t.Errorf("%s = %+v, want unit %q ip %q route %q", name, g, w.unit, w.ip, w.routeURL)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	c := DefaultConfig()
	c.Source = "guess"
	if err := c.Validate(); err == nil {
		t.Fatal("accepted an unknown source")
	}
	if _, err := New(DefaultConfig(), nil, nil, slog.New(slog.DiscardHandler), nil, nil); err == nil {
		t.Fatal("kubernetes source without a node lister")
	}
}
