package edgesim_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/atoll-edge/atoll/test/edgesim"
	"github.com/atoll-edge/atoll/test/kubetest"
)

const unitLabel = "atoll.dev/unit"

// The real scheduler places a Deployment with a nodeSelector only on the
// matching simulated nodes, and the simulator runs the pods there.
func TestSchedulerHonoursNodeSelector(t *testing.T) {
	c := kubetest.Start(t, kubetest.WithControllerManager(), kubetest.WithScheduler())
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	client := c.Client()
	sim := startSim(t, c, edgesim.Config{})

	var names []string
	var specs []edgesim.NodeSpec
	for _, unit := range []string{"north", "south"} {
		for i := range 2 {
			name := fmt.Sprintf("%s-%d", unit, i)
			names = append(names, name)
			specs = append(specs, edgesim.NodeSpec{Name: name, Labels: map[string]string{unitLabel: unit}})
		}
	}
	if err := sim.AddNodes(ctx, specs...); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "nodes ready and untainted", nodesReady(client, names...))

	const ns, app, replicas = "sched", "north-app", 6
	if err := c.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	d := deployment(app, replicas, func(spec *corev1.PodSpec) {
		spec.NodeSelector = map[string]string{unitLabel: "north"}
	})
	if _, err := client.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "deployment available", func(ctx context.Context) error {
		got, err := client.AppsV1().Deployments(ns).Get(ctx, app, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got.Status.ReadyReplicas != replicas || got.Status.AvailableReplicas != replicas {
			return fmt.Errorf("ready %d available %d, want %d", got.Status.ReadyReplicas, got.Status.AvailableReplicas, replicas)
		}
		return nil
	})

	pods, err := appPods(ctx, client, ns, app)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != replicas {
		t.Fatalf("%d pods, want %d", len(pods), replicas)
	}
	podIPs := map[string]string{}
	perNode := map[string]int{}
	for _, pod := range pods {
		node, ok := sim.Node(pod.Spec.NodeName)
		if !ok {
			t.Errorf("pod %s on %q, not a simulated node", pod.Name, pod.Spec.NodeName)
			continue
		}
		perNode[node.Name]++
		if unit := specs[indexOf(names, node.Name)].Labels[unitLabel]; unit != "north" {
			t.Errorf("pod %s on %s (unit %s), want a north node", pod.Name, node.Name, unit)
		}
		if !podReady(&pod) {
			t.Errorf("pod %s not Running and Ready: %+v", pod.Name, pod.Status)
		}
		if pod.Status.HostIP != node.InternalIP.String() {
			t.Errorf("pod %s hostIP %s, want node IP %s", pod.Name, pod.Status.HostIP, node.InternalIP)
		}
		ip, err := netip.ParseAddr(pod.Status.PodIP)
		if err != nil || !node.PodCIDR.Contains(ip) {
			t.Errorf("pod %s podIP %q not in node pod CIDR %s", pod.Name, pod.Status.PodIP, node.PodCIDR)
		}
		if other, dup := podIPs[pod.Status.PodIP]; dup {
			t.Errorf("pods %s and %s share IP %s", pod.Name, other, pod.Status.PodIP)
		}
		podIPs[pod.Status.PodIP] = pod.Name
		if len(pod.Status.ContainerStatuses) != 1 || !pod.Status.ContainerStatuses[0].Ready {
			t.Errorf("pod %s container statuses %+v, want one ready", pod.Name, pod.Status.ContainerStatuses)
		}
	}
	t.Logf("pods per node: %v", perNode)
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}
