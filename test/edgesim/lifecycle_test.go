package edgesim_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/atoll-edge/atoll/test/edgesim"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// Registration writes the Node, its status and its Lease; a second simulator
// can take over the same nodes; RemoveNode deletes Node and Lease.
func TestRegisterRestartRemove(t *testing.T) {
	c := kubetest.Start(t) // apiserver only: no controller touches the nodes
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	client := c.Client()

	spec := edgesim.NodeSpec{Name: "edge-x", Labels: map[string]string{unitLabel: "x"}, InternalIP: "192.168.50.7"}
	first := startSim(t, c, edgesim.Config{RenewInterval: 500 * time.Millisecond})
	if err := first.AddNodes(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := first.AddNodes(ctx, spec); !errors.Is(err, edgesim.ErrNodeExists) {
		t.Errorf("adding %s twice: err = %v, want ErrNodeExists", spec.Name, err)
	}
	node, err := client.CoreV1().Nodes().Get(ctx, spec.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if node.Labels[unitLabel] != "x" || node.Labels[corev1.LabelHostname] != spec.Name {
		t.Errorf("labels = %v", node.Labels)
	}
	if nodeReady(node) != corev1.ConditionTrue || len(node.Status.Addresses) == 0 || node.Status.Addresses[0].Address != "192.168.50.7" {
		t.Errorf("status = %+v, want Ready with InternalIP 192.168.50.7", node.Status)
	}
	if node.Spec.PodCIDR == "" || node.Status.Allocatable.Pods().Value() != 110 {
		t.Errorf("podCIDR %q allocatable %v", node.Spec.PodCIDR, node.Status.Allocatable)
	}
	lease, err := client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, spec.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(lease.OwnerReferences) != 1 || lease.OwnerReferences[0].UID != node.UID {
		t.Errorf("lease owners %v, want the Node", lease.OwnerReferences)
	}
	eventually(t, ctx, "lease renewed", leaseRenewedAfter(c, spec.Name, lease.Spec.RenewTime.Time))

	// A restarted simulator re-registers the same node and takes over its
	// existing Lease.
	first.Stop()
	stopped := time.Now()
	second := startSim(t, c, edgesim.Config{RenewInterval: 500 * time.Millisecond})
	if err := second.AddNodes(ctx, spec); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "lease renewed by the second simulator", leaseRenewedAfter(c, spec.Name, stopped))

	if err := second.RemoveNode(ctx, spec.Name); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Get(ctx, spec.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("node after RemoveNode: err = %v, want NotFound", err)
	}
	if _, err := client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, spec.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("lease after RemoveNode: err = %v, want NotFound", err)
	}
	if err := second.Partition(spec.Name); !errors.Is(err, edgesim.ErrUnknownNode) {
		t.Errorf("Partition of a removed node: err = %v, want ErrUnknownNode", err)
	}
	if st := second.Stats(); st.LeaseErrors+st.StatusErrors > 0 {
		t.Errorf("simulator errors: %+v", st)
	}
}

func leaseRenewedAfter(c *kubetest.Cluster, name string, after time.Time) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		l, err := c.Client().CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Spec.RenewTime == nil || !l.Spec.RenewTime.After(after) {
			return fmt.Errorf("lease renewed at %v, want after %v", l.Spec.RenewTime, after.Format(time.RFC3339Nano))
		}
		return nil
	}
}
