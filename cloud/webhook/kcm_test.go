package webhook

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/test/poll"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/test/edgesim"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// TestKeepsProtectedNodeAgainstControllerManager runs the real node
// lifecycle, taint-eviction, EndpointSlice and Endpoints controllers against
// the webhook. Two of three nodes lose their heartbeat: edge-1 (not
// protected) is tainted NoExecute, its pod evicted and its endpoints dropped,
// as usual. edge-0 (protected) keeps only unreachable:NoSchedule, its pods
// stay, and their endpoints stay ready although the controller marked the
// pods NotReady.
func TestKeepsProtectedNodeAgainstControllerManager(t *testing.T) {
	const toleration = 5 // seconds, unreachable and not-ready
	begin := time.Now()
	cluster := kubetest.Start(t, kubetest.WithControllerManager(), kubetest.WithTolerationSeconds(toleration, toleration))
	t.Logf("control plane with KCM ready in %s", time.Since(begin).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	client := cluster.Client()

	const (
		protected, lost, healthy = "edge-0", "edge-1", "edge-2"
		ns, app                  = "shop", "web"
	)
	certDir := t.TempDir()
	if err := cluster.WriteServingCert(certDir, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	srv, err := New(Config{Addr: "127.0.0.1:0", CertDir: certDir}, protecting(protected), testLogger(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })
	if err := Register(ctx, client, RegistrationConfig{URL: "https://" + srv.Addr() + DefaultPath, CABundle: cluster.CABundle()}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	waitEffective(t, ctx, client, ns, protected)

	sim := simulate(t, ctx, cluster, protected, lost, healthy)
	step(t, ctx, "nodes ready", func(ctx context.Context) error {
		for _, n := range []string{protected, lost, healthy} {
			node, err := client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if nodeCondition(node) != corev1.ConditionTrue || len(node.Spec.Taints) > 0 {
				return fmt.Errorf("%s: Ready=%s taints %v", n, nodeCondition(node), node.Spec.Taints)
			}
		}
		return nil
	})

	pods := map[string]string{"web-0a": protected, "web-0b": protected, "web-1": lost, "web-2": healthy}
	for name, node := range pods {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": app}},
			Spec: corev1.PodSpec{
				NodeName: node,
				Containers: []corev1.Container{{
					Name: "app", Image: "registry.example/web:1",
					Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
				}},
			},
		}
		if _, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": app},
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	if _, err := client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	step(t, ctx, "4 ready endpoints", func(ctx context.Context) error {
		eps, err := sliceEndpoints(ctx, client, ns, app)
		if err != nil {
			return err
		}
		ready := 0
		for _, ep := range eps {
			if isTrue(ep.Conditions.Ready) {
				ready++
			}
		}
		if ready != len(pods) {
			return fmt.Errorf("%d of %d endpoints ready", ready, len(eps))
		}
		return nil
	})

	partitioned := time.Now()
	for _, n := range []string{protected, lost} {
		if err := sim.Partition(n); err != nil {
			t.Fatal(err)
		}
	}
	// The unprotected node is the clock: once its pod is evicted, the
	// protected node has been unreachable longer than the toleration too.
	step(t, ctx, "unprotected node tainted unreachable:NoExecute", func(ctx context.Context) error {
		node, err := client.CoreV1().Nodes().Get(ctx, lost, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !hasTaint(node, unreachableNoExecute) {
			return fmt.Errorf("taints %v", node.Spec.Taints)
		}
		return nil
	})
	step(t, ctx, "unprotected node's pod evicted", func(ctx context.Context) error {
		pod, err := client.CoreV1().Pods(ns).Get(ctx, "web-1", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pod.DeletionTimestamp == nil {
			return errors.New("not deleted yet")
		}
		return nil
	})
	t.Logf("unprotected pod evicted %s after the partition", time.Since(partitioned).Round(100*time.Millisecond))

	node, err := client.CoreV1().Nodes().Get(ctx, protected, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if nodeCondition(node) != corev1.ConditionUnknown {
		t.Errorf("protected node Ready=%s, want Unknown (the webhook does not touch status)", nodeCondition(node))
	}
	if hasTaint(node, unreachableNoExecute) || !hasTaint(node, unreachableNoSchedule) {
		t.Errorf("protected node taints %v, want unreachable:NoSchedule only", node.Spec.Taints)
	}
	if n := counter(t, reg, kindNode, resultPatched); n == 0 {
		t.Error("the controller never tried to taint the protected node NoExecute")
	} else {
		t.Logf("node lifecycle controller's NoExecute taint stripped %v times", n)
	}
	for name, n := range pods {
		if n != protected {
			continue
		}
		pod, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.DeletionTimestamp != nil {
			t.Errorf("protected pod %s evicted", name)
		}
	}

	step(t, ctx, "protected pods marked NotReady by the controller", func(ctx context.Context) error {
		for name, n := range pods {
			if n != protected {
				continue
			}
			pod, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if podCondition(pod) != corev1.ConditionFalse {
				return fmt.Errorf("%s Ready=%s", name, podCondition(pod))
			}
		}
		return nil
	})
	step(t, ctx, "EndpointSlice: protected ready and serving, evicted not ready", func(ctx context.Context) error {
		eps, err := sliceEndpoints(ctx, client, ns, app)
		if err != nil {
			return err
		}
		got := map[string]discoveryv1.EndpointConditions{}
		for _, ep := range eps {
			got[ep.TargetRef.Name] = ep.Conditions
		}
		for name, n := range pods {
			c, ok := got[name]
			switch {
			case n == protected && (!ok || !isTrue(c.Ready) || !isTrue(c.Serving)):
				return fmt.Errorf("%s: ready=%v serving=%v", name, boolString(c.Ready), boolString(c.Serving))
			case n == lost && ok && isTrue(c.Ready):
				return fmt.Errorf("%s (evicted) still ready", name)
			}
		}
		if counter(t, reg, kindEndpointSlice, resultPatched) == 0 {
			return errors.New("webhook has not patched an EndpointSlice yet")
		}
		return nil
	})
	step(t, ctx, "Endpoints: protected addresses ready", func(ctx context.Context) error {
		e, err := client.CoreV1().Endpoints(ns).Get(ctx, app, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ready := map[string]string{}
		for _, s := range e.Subsets {
			for _, a := range s.Addresses {
				ready[a.TargetRef.Name] = *a.NodeName
			}
			for _, a := range s.NotReadyAddresses {
				if a.NodeName != nil && *a.NodeName == protected {
					return fmt.Errorf("%s not ready", a.TargetRef.Name)
				}
			}
		}
		for name, n := range pods {
			if _, ok := ready[name]; ok != (n != lost) {
				return fmt.Errorf("ready addresses %v", ready)
			}
		}
		if counter(t, reg, kindEndpoints, resultPatched) == 0 {
			return errors.New("webhook has not patched Endpoints yet")
		}
		return nil
	})
	for _, k := range []string{kindNode, kindEndpointSlice, kindEndpoints} {
		t.Logf("webhook requests %s: patched %v, unchanged %v, error %v", k,
			counter(t, reg, k, resultPatched), counter(t, reg, k, resultUnchanged), counter(t, reg, k, resultError))
	}
}

func step(t *testing.T, ctx context.Context, what string, check func(ctx context.Context) error) {
	t.Helper()
	begin := time.Now()
	if err := poll.Until(ctx, check); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	t.Logf("%s: after %s", what, time.Since(begin).Round(10*time.Millisecond))
}

func sliceEndpoints(ctx context.Context, client kubernetes.Interface, ns, svc string) ([]discoveryv1.Endpoint, error) {
	list, err := client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
	if err != nil {
		return nil, err
	}
	var eps []discoveryv1.Endpoint
	for _, s := range list.Items {
		eps = append(eps, s.Endpoints...)
	}
	return eps, nil
}

func nodeCondition(n *corev1.Node) corev1.ConditionStatus {
	if i := slices.IndexFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == corev1.NodeReady }); i >= 0 {
		return n.Status.Conditions[i].Status
	}
	return corev1.ConditionUnknown
}

func podCondition(p *corev1.Pod) corev1.ConditionStatus {
	if i := slices.IndexFunc(p.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == corev1.PodReady }); i >= 0 {
		return p.Status.Conditions[i].Status
	}
	return corev1.ConditionUnknown
}

func boolString(b *bool) string {
	if b == nil {
		return "nil"
	}
	return fmt.Sprint(*b)
}

// waitEffective waits until the apiserver calls the webhook (it loads
// configurations from an informer, some time after Register): an
// Endpoints object with a not-ready address on the protected node comes
// back ready. It probes with Endpoints rather than a Node: a Node without
// a heartbeat would count as unready and could push the zone into a
// disruption mode in which the controller stops evicting.
func waitEffective(t *testing.T, ctx context.Context, client kubernetes.Interface, ns, protected string) {
	t.Helper()
	step(t, ctx, "webhook effective", func(ctx context.Context) error {
		probe := &corev1.Endpoints{
			ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: ns},
			Subsets: []corev1.EndpointSubset{{
				NotReadyAddresses: addrs(addr("10.1.0.1", protected)),
				Ports:             []corev1.EndpointPort{{Port: 80, Protocol: corev1.ProtocolTCP}},
			}},
		}
		got, err := client.CoreV1().Endpoints(ns).Create(ctx, probe, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		_ = client.CoreV1().Endpoints(ns).Delete(ctx, "probe", metav1.DeleteOptions{})
		if len(got.Subsets) == 0 || len(got.Subsets[0].Addresses) == 0 {
			return errors.New("webhook not called yet")
		}
		return nil
	})
}

// simulate runs simulated kubelets for nodes of unit u1 until the test
// ends.
func simulate(t *testing.T, ctx context.Context, cluster *kubetest.Cluster, nodes ...string) *edgesim.Simulator {
	t.Helper()
	sim, err := edgesim.New(cluster.RESTConfig(), edgesim.Config{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sim.Stop)
	var specs []edgesim.NodeSpec
	for _, n := range nodes {
		specs = append(specs, edgesim.NodeSpec{Name: n, Labels: map[string]string{unitLabel: "u1"}})
	}
	if err := sim.AddNodes(ctx, specs...); err != nil {
		t.Fatal(err)
	}
	return sim
}
