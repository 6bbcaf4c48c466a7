package tunnel

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
)

// Nodes resolves a CONNECT host through the Nodes the cloud already caches:
// a node's name, or any of its addresses (IP, DNS or Hostname)
// (kube-apiserver dials the address chosen by --kubelet-preferred-address-types).
type Nodes struct{ Lister corelisters.NodeLister }

// NodeFor implements Resolver.
func (n Nodes) NodeFor(host string) (string, bool) {
	if node, err := n.Lister.Get(host); err == nil {
		return node.Name, true
	}
	nodes, err := n.Lister.List(labels.Everything())
	if err != nil {
		return "", false
	}
	for _, node := range nodes {
		for _, a := range node.Status.Addresses {
			switch a.Type {
			case corev1.NodeInternalIP, corev1.NodeExternalIP, corev1.NodeHostName, corev1.NodeInternalDNS, corev1.NodeExternalDNS:
				if a.Address == host {
					return node.Name, true
				}
			}
		}
	}
	return "", false
}
