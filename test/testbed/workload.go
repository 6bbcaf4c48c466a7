package testbed

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// WebPod is the name of the web pod DeployWeb puts on node.
func WebPod(node string) string { return "web-" + node }

// DeployWeb creates namespace ns with a Service "web" and one web pod
// bound to each node (by nodeName, so placement is exact).
func (b *Bed) DeployWeb(ctx context.Context, ns string, nodes []string) error {
	client := b.Cluster.Client()
	if err := b.Cluster.CreateNamespace(ctx, ns); err != nil {
		return err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	if _, err := client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("service %s/web: %w", ns, err)
	}
	for _, node := range nodes {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: WebPod(node), Namespace: ns, Labels: map[string]string{"app": "web"}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
				Name: "web", Image: "registry.example/web:1", Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
			}}},
		}
		if _, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("pod %s/%s: %w", ns, pod.Name, err)
		}
	}
	return nil
}

// EndpointReady reports whether pod's endpoint in the "web" Service's
// EndpointSlices of ns is ready (false when it is missing).
func (b *Bed) EndpointReady(ctx context.Context, ns, pod string) (bool, error) {
	list, err := b.Cluster.Client().DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=web"})
	if err != nil {
		return false, err
	}
	for _, s := range list.Items {
		for _, ep := range s.Endpoints {
			if ep.TargetRef != nil && ep.TargetRef.Name == pod {
				return ep.Conditions.Ready != nil && *ep.Conditions.Ready, nil
			}
		}
	}
	return false, nil
}
