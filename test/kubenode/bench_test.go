package kubenode_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/test/kubenode"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/poll"
)

// BenchmarkNodeBoot measures a real node's start (go tool task
// bench:nodes): cold, from an empty disk to the Node Ready and to a pod
// pulled from the registry Ready (cold-node-s, cold-pod-s); then each
// iteration cuts the power and boots the node on the same disk, to the
// pod Ready again with one more restart (boot-pod-s, the mean). The Node
// itself stays Ready through a short power cut (the node lifecycle
// controller's grace is 5 s), so its Ready says nothing of a boot.
func BenchmarkNodeBoot(b *testing.B) {
	if err := kubenode.Prerequisites(); err != nil {
		b.Skip(err)
	}
	cluster := kubetest.Start(b, kubenode.ClusterOptions(4)...)
	fleet := kubenode.StartForTest(b, cluster, kubenode.Config{Net: 4})
	ctx, cancel := context.WithTimeout(b.Context(), 10*time.Minute)
	defer cancel()
	client := cluster.Client()
	if err := cluster.WaitForServiceAccount(ctx, "default"); err != nil {
		b.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: "edge-1", Containers: []corev1.Container{{Name: "hello", Image: fleet.Image("hello")}}}}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	node, err := fleet.Add(ctx, "edge-1")
	if err != nil {
		b.Fatal(err)
	}
	coldNode := time.Since(start)
	podReady(ctx, b, client, 0)
	coldPod := time.Since(start)

	var podTotal time.Duration
	restarts := int32(0)
	for b.Loop() {
		node.PowerCut()
		restarts++
		begin := time.Now()
		if err := node.Boot(ctx); err != nil {
			b.Fatal(err)
		}
		podReady(ctx, b, client, restarts)
		podTotal += time.Since(begin)
	}
	// Reported after the loop: b.Loop's first call deletes the metrics
	// reported before it.
	b.ReportMetric(coldNode.Seconds(), "cold-node-s")
	b.ReportMetric(coldPod.Seconds(), "cold-pod-s")
	b.ReportMetric(podTotal.Seconds()/float64(b.N), "boot-pod-s")
}

// podReady waits until pod hello is Ready with at least restarts
// restarts.
func podReady(ctx context.Context, b *testing.B, client kubernetes.Interface, restarts int32) {
	b.Helper()
	if err := poll.Until(ctx, func(ctx context.Context) error {
		p, err := client.CoreV1().Pods("default").Get(ctx, "hello", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue &&
				len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].RestartCount >= restarts {
				return nil
			}
		}
		return fmt.Errorf("pod hello not Ready (restarts %d)", restarts)
	}); err != nil {
		b.Fatal(err)
	}
}
