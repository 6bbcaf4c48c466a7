package edgesim_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/atoll-edge/atoll/test/edgesim"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// Many simulated nodes register and stay Ready in the eyes of the real node
// lifecycle controller for several lease periods.
func TestScaleNodesStayReady(t *testing.T) {
	const (
		nodeCount = 500
		renew     = 2 * time.Second
		periods   = 4
	)
	c := kubetest.Start(t, kubetest.WithControllerManager())
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	client := c.Client()
	sim := startSim(t, c, edgesim.Config{RenewInterval: renew})

	specs := make([]edgesim.NodeSpec, nodeCount)
	names := make([]string, nodeCount)
	for i := range specs {
		names[i] = fmt.Sprintf("edge-%04d", i)
		specs[i] = edgesim.NodeSpec{Name: names[i], Labels: map[string]string{unitLabel: fmt.Sprintf("u%02d", i%20)}}
	}
	begin := time.Now()
	if err := sim.AddNodes(ctx, specs...); err != nil {
		t.Fatal(err)
	}
	t.Logf("registered %d nodes in %s", nodeCount, time.Since(begin).Round(time.Millisecond))
	eventually(t, ctx, "all nodes ready and untainted", nodesReady(client, names...))

	// Hold for several lease periods: every check must pass, none may
	// flip a node to Unknown or taint it.
	hold := time.Now()
	for time.Since(hold) < periods*renew {
		checkCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := nodesReady(client, names...)(checkCtx)
		if err == nil {
			err = leasesFresh(checkCtx, c, names, 3*renew)
		}
		cancel()
		if err != nil {
			t.Fatalf("after %s: %v", time.Since(hold).Round(time.Millisecond), err)
		}
		// Pace the checks without waiting for any state.
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
	st := sim.Stats()
	t.Logf("simulator stats: %+v", st)
	if st.LeaseErrors+st.StatusErrors > 0 {
		t.Errorf("simulator errors: %+v", st)
	}
	if least := int64(nodeCount * (periods - 1)); st.LeaseRenewals < least {
		t.Errorf("%d lease renewals, want at least %d", st.LeaseRenewals, least)
	}
}

// leasesFresh checks that every node's Lease was renewed within maxAge.
func leasesFresh(ctx context.Context, c *kubetest.Cluster, names []string, maxAge time.Duration) error {
	list, err := c.Client().CoordinationV1().Leases(corev1.NamespaceNodeLease).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	byName := map[string]*coordinationv1.Lease{}
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}
	for _, name := range names {
		l, ok := byName[name]
		if !ok || l.Spec.RenewTime == nil {
			return fmt.Errorf("lease %s missing", name)
		}
		if age := time.Since(l.Spec.RenewTime.Time); age > maxAge {
			return fmt.Errorf("lease %s renewed %s ago", name, age.Round(time.Millisecond))
		}
	}
	return nil
}
