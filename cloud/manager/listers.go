package manager

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// NodeLister lists Nodes from the manager's cache, for components written
// against client-go's lister interface (topology, status, the console,
// the tunnel's resolver). Reads never reach the apiserver; the cache must
// hold Nodes (a controller for Nodes, or GetInformer before the manager
// starts). As with client-go's listers, what it returns is the cache's
// own data, not a copy: read it, never modify it (a deep copy of every
// Node per list would cost more than everything else the lister's
// callers do).
func (m *Manager) NodeLister() corelisters.NodeLister { return nodeLister{m.GetClient()} }

type nodeLister struct{ r client.Reader }

func (l nodeLister) List(sel labels.Selector) ([]*corev1.Node, error) {
	var list corev1.NodeList
	if err := l.r.List(context.Background(), &list, client.MatchingLabelsSelector{Selector: sel}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	out := make([]*corev1.Node, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}

func (l nodeLister) Get(name string) (*corev1.Node, error) {
	var n corev1.Node
	if err := l.r.Get(context.Background(), client.ObjectKey{Name: name}, &n, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	return &n, nil
}
