package edgesim_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/test/poll"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/atoll-edge/atoll/test/edgesim"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// startSim starts a simulator against c and stops it in t.Cleanup (before
// the cluster stops, since Start registered the cluster's cleanup first).
func startSim(t *testing.T, c *kubetest.Cluster, cfg edgesim.Config) *edgesim.Simulator {
	t.Helper()
	sim, err := edgesim.New(c.RESTConfig(), cfg)
	if err != nil {
		t.Fatalf("edgesim.New: %v", err)
	}
	if err := sim.Start(t.Context()); err != nil {
		t.Fatalf("edgesim start: %v", err)
	}
	t.Cleanup(sim.Stop)
	return sim
}

// eventually fails t unless check passes before ctx ends.
func eventually(t *testing.T, ctx context.Context, what string, check func(ctx context.Context) error) {
	t.Helper()
	begin := time.Now()
	if err := poll.Until(ctx, check); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	t.Logf("%s: after %s", what, time.Since(begin).Round(10*time.Millisecond))
}

// nodesReady checks that every named node is Ready=True and carries none of
// the not-ready or unreachable taints (the node lifecycle controller
// removed the not-ready taint that admission adds at registration).
func nodesReady(client kubernetes.Interface, names ...string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		byName := map[string]*corev1.Node{}
		for i := range list.Items {
			byName[list.Items[i].Name] = &list.Items[i]
		}
		for _, name := range names {
			node, ok := byName[name]
			if !ok {
				return fmt.Errorf("node %s missing", name)
			}
			if got := nodeReady(node); got != corev1.ConditionTrue {
				return fmt.Errorf("node %s Ready=%s", name, got)
			}
			for _, taint := range node.Spec.Taints {
				if taint.Key == corev1.TaintNodeNotReady || taint.Key == corev1.TaintNodeUnreachable {
					return fmt.Errorf("node %s has taint %s", name, taint.ToString())
				}
			}
		}
		return nil
	}
}

func nodeReady(node *corev1.Node) corev1.ConditionStatus {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return corev1.ConditionUnknown
}

func podReady(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// deployment is a Deployment of replicas pods labelled app=name.
func deployment(name string, replicas int32, mutate func(*corev1.PodSpec)) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	spec := corev1.PodSpec{
		Containers: []corev1.Container{{
			Name:  "app",
			Image: "registry.example/" + name + ":1",
			Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
		}},
	}
	if mutate != nil {
		mutate(&spec)
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       spec,
			},
		},
	}
}

// service is a ClusterIP Service in front of app=name.
func service(name string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": name},
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
}

// appPods lists the pods labelled app=name.
func appPods(ctx context.Context, client kubernetes.Interface, ns, name string) ([]corev1.Pod, error) {
	list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}
