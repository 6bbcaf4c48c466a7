package objects

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/atoll-edge/atoll/internal/objectview"
)

// trim returns the copy of obj that a unit's view carries. Every kind
// loses its managed fields and resource version (the edge numbers its own
// versions; the apiserver's would make every no-op write a new view). A
// Node keeps its spec and status, without the heartbeat times, images and
// volumes that change without meaning anything to a proxy.
func trim(obj client.Object) objectview.Object {
	c := obj.DeepCopyObject().(client.Object)
	c.SetManagedFields(nil)
	c.SetResourceVersion("")
	n, ok := c.(*corev1.Node)
	if !ok {
		return c
	}
	n.Status.Images = nil
	n.Status.VolumesInUse = nil
	n.Status.VolumesAttached = nil
	for i := range n.Status.Conditions {
		n.Status.Conditions[i].LastHeartbeatTime = metav1.Time{}
	}
	return n
}
