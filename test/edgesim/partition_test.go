package edgesim_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/test/edgesim"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// Baseline, stock Kubernetes behaviour that Atoll is measured against: a
// partitioned node's lease expires, the node lifecycle controller marks it
// Ready=Unknown and taints it unreachable, its endpoints turn not ready, and
// after the toleration its pods are evicted and replaced elsewhere. Healing
// restores the node, and the simulated kubelet finishes the evicted pods.
func TestPartitionEvictsAndHeals(t *testing.T) {
	const toleration = 5 // seconds, for not-ready and unreachable
	c := kubetest.Start(t,
		kubetest.WithControllerManager(),
		kubetest.WithScheduler(),
		kubetest.WithTolerationSeconds(toleration, toleration))
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	client := c.Client()
	sim := startSim(t, c, edgesim.Config{})

	nodes := []string{"edge-0", "edge-1", "edge-2"}
	var specs []edgesim.NodeSpec
	for _, name := range nodes {
		specs = append(specs, edgesim.NodeSpec{Name: name, Labels: map[string]string{unitLabel: "u1"}})
	}
	if err := sim.AddNodes(ctx, specs...); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "nodes ready and untainted", nodesReady(client, nodes...))

	// Two pods per node, spread strictly; tainted nodes drop out of the skew
	// so replacements can land on the two healthy nodes.
	const ns, app, replicas = "partition", "web", 6
	if err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	d := deployment(app, replicas, func(spec *corev1.PodSpec) {
		honor := corev1.NodeInclusionPolicyHonor
		spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
			MaxSkew:           1,
			TopologyKey:       corev1.LabelHostname,
			WhenUnsatisfiable: corev1.DoNotSchedule,
			LabelSelector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
			NodeTaintsPolicy:  &honor,
		}}
	})
	if _, err := client.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Services(ns).Create(ctx, service(app), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "6 pods ready, 2 per node", runningPods(client, ns, app, map[string]int{"edge-0": 2, "edge-1": 2, "edge-2": 2}))
	eventually(t, ctx, "6 ready endpoints", endpoints(client, ns, app, func(eps []discoveryv1.Endpoint) error {
		if n := countReady(eps); n != replicas || len(eps) != replicas {
			return fmt.Errorf("%d endpoints, %d ready; want %d ready", len(eps), n, replicas)
		}
		return nil
	}))

	pods, err := appPods(ctx, client, ns, app)
	if err != nil {
		t.Fatal(err)
	}
	victim := "edge-0"
	victimPods := map[string]bool{}
	for _, pod := range pods {
		if pod.Spec.NodeName == victim {
			victimPods[pod.Name] = true
		}
		if got := unreachableToleration(&pod); got != toleration {
			t.Errorf("pod %s unreachable toleration %ds, want %d (DefaultTolerationSeconds)", pod.Name, got, toleration)
		}
	}

	partitioned := time.Now()
	if err := sim.Partition(victim); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "partitioned node Ready=Unknown", func(ctx context.Context) error {
		node, err := client.CoreV1().Nodes().Get(ctx, victim, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := nodeReady(node); got != corev1.ConditionUnknown {
			return fmt.Errorf("Ready=%s", got)
		}
		return nil
	})
	t.Logf("Ready=Unknown %s after partition", time.Since(partitioned).Round(100*time.Millisecond))
	eventually(t, ctx, "unreachable NoSchedule and NoExecute taints", func(ctx context.Context) error {
		node, err := client.CoreV1().Nodes().Get(ctx, victim, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, effect := range []corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectNoExecute} {
			if !hasTaint(node, corev1.TaintNodeUnreachable, effect) {
				return fmt.Errorf("no %s:%s taint in %v", corev1.TaintNodeUnreachable, effect, node.Spec.Taints)
			}
		}
		return nil
	})
	eventually(t, ctx, "partitioned node's endpoints not ready", endpoints(client, ns, app, func(eps []discoveryv1.Endpoint) error {
		for _, ep := range eps {
			if ep.TargetRef == nil || !victimPods[ep.TargetRef.Name] {
				continue
			}
			if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
				return fmt.Errorf("endpoint of %s ready=%v", ep.TargetRef.Name, ptrString(ep.Conditions.Ready))
			}
		}
		return nil
	}))
	eventually(t, ctx, "partitioned node's pods evicted", func(ctx context.Context) error {
		pods, err := appPods(ctx, client, ns, app)
		if err != nil {
			return err
		}
		for _, pod := range pods {
			if victimPods[pod.Name] && pod.DeletionTimestamp == nil {
				return fmt.Errorf("pod %s not evicted", pod.Name)
			}
		}
		return nil
	})
	t.Logf("pods evicted %s after partition", time.Since(partitioned).Round(100*time.Millisecond))
	eventually(t, ctx, "replacements running on the healthy nodes", runningPods(client, ns, app, map[string]int{"edge-1": 3, "edge-2": 3}))

	// Nobody finishes the evicted pods while the node is cut off: they stay
	// Terminating, as with a real kubelet behind a partition.
	pods, err = appPods(ctx, client, ns, app)
	if err != nil {
		t.Fatal(err)
	}
	terminating := 0
	for _, pod := range pods {
		if victimPods[pod.Name] && pod.DeletionTimestamp != nil {
			terminating++
		}
	}
	if terminating != len(victimPods) {
		t.Errorf("%d of the partitioned node's %d pods still Terminating, want all", terminating, len(victimPods))
	}

	healed := time.Now()
	if err := sim.Heal(victim); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "healed node ready and untainted", nodesReady(client, victim))
	t.Logf("node ready and untainted %s after heal", time.Since(healed).Round(100*time.Millisecond))
	eventually(t, ctx, "evicted pods gone", func(ctx context.Context) error {
		pods, err := appPods(ctx, client, ns, app)
		if err != nil {
			return err
		}
		for _, pod := range pods {
			if victimPods[pod.Name] {
				return fmt.Errorf("pod %s still exists", pod.Name)
			}
		}
		return nil
	})
	eventually(t, ctx, "6 ready endpoints after heal", endpoints(client, ns, app, func(eps []discoveryv1.Endpoint) error {
		if n := countReady(eps); n != replicas || len(eps) != replicas {
			return fmt.Errorf("%d endpoints, %d ready; want %d ready", len(eps), n, replicas)
		}
		return nil
	}))
	if st := sim.Stats(); st.LeaseErrors+st.StatusErrors+st.PodErrors > 0 {
		t.Errorf("simulator errors: %+v", st)
	}
}

// runningPods checks that the app's live (not terminating) pods are Running
// and Ready with want[node] of them on each node.
func runningPods(client kubernetes.Interface, ns, app string, want map[string]int) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		pods, err := appPods(ctx, client, ns, app)
		if err != nil {
			return err
		}
		got := map[string]int{}
		for _, pod := range pods {
			if pod.DeletionTimestamp != nil {
				continue
			}
			if !podReady(&pod) {
				return fmt.Errorf("pod %s on %q not ready", pod.Name, pod.Spec.NodeName)
			}
			got[pod.Spec.NodeName]++
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("ready pods per node %v, want %v", got, want)
		}
		return nil
	}
}

// endpoints runs check on all endpoints of the Service's EndpointSlices.
func endpoints(client kubernetes.Interface, ns, svc string, check func([]discoveryv1.Endpoint) error) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		slices, err := client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{
			LabelSelector: discoveryv1.LabelServiceName + "=" + svc,
		})
		if err != nil {
			return err
		}
		var eps []discoveryv1.Endpoint
		for _, s := range slices.Items {
			eps = append(eps, s.Endpoints...)
		}
		return check(eps)
	}
}

func countReady(eps []discoveryv1.Endpoint) int {
	n := 0
	for _, ep := range eps {
		if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
			n++
		}
	}
	return n
}

func hasTaint(node *corev1.Node, key string, effect corev1.TaintEffect) bool {
	for _, t := range node.Spec.Taints {
		if t.Key == key && t.Effect == effect {
			return true
		}
	}
	return false
}

// unreachableToleration is the pod's tolerationSeconds for the unreachable
// NoExecute taint, or -1 without one.
func unreachableToleration(pod *corev1.Pod) int64 {
	for _, tol := range pod.Spec.Tolerations {
		if tol.Key == corev1.TaintNodeUnreachable && tol.Effect == corev1.TaintEffectNoExecute && tol.TolerationSeconds != nil {
			return *tol.TolerationSeconds
		}
	}
	return -1
}

func ptrString(b *bool) string {
	if b == nil {
		return "nil"
	}
	return fmt.Sprint(*b)
}
