package tunnel

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

func TestNodesResolve(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, n := range []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "edge-1"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}, {Type: corev1.NodeHostName, Address: "edge-1.site"}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "edge-2"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeExternalIP, Address: "192.0.2.2"}, {Type: corev1.NodeInternalDNS, Address: "edge-2.internal"}}}},
	} {
		if err := idx.Add(n); err != nil {
			t.Fatal(err)
		}
	}
	r := Nodes{Lister: corelisters.NewNodeLister(idx)}
	tests := []struct{ host, node string }{
		{"edge-1", "edge-1"},
		{"10.0.0.1", "edge-1"},
		{"edge-1.site", "edge-1"},
		{"192.0.2.2", "edge-2"},
		{"edge-2.internal", "edge-2"},
		{"10.0.0.9", ""},
	}
	for _, tt := range tests {
		got, ok := r.NodeFor(tt.host)
		if got != tt.node || ok != (tt.node != "") {
			t.Errorf("NodeFor(%q) = %q %v, want %q", tt.host, got, ok, tt.node)
		}
	}
}
