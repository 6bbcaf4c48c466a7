package kubelet

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/atoll-edge/atoll/deploy/images"
	"github.com/atoll-edge/atoll/test/kubenode"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestImagesRunOnRealNode builds atoll-cloud's and atoll-edge's images
// (deploy/images), pushes them to the fleet's registry, and runs each on
// a real node (containerd pulls it, runc starts it as the images' non-root
// user): the binary answers --help and the pod succeeds.
func TestImagesRunOnRealNode(t *testing.T) {
	cluster, fleet, node := kubenode.StartWithNode(t, kubenode.Config{Net: 3}, "edge-1")
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	if err := cluster.WaitForServiceAccount(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	pods := cluster.Client().CoreV1().Pods("default")
	for _, img := range images.All {
		built, err := images.Build(ctx, img, images.Options{Version: "test"})
		if err != nil {
			t.Fatal(err)
		}
		ref := img.Name + ":test"
		if err := fleet.PushOCI(ctx, ref, built); err != nil {
			t.Fatal(err)
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: img.Name},
			Spec: corev1.PodSpec{NodeName: node.Name, RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: img.Name, Image: fleet.Registry() + "/" + ref, Args: []string{"--help"}}}}}
		if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := poll.Until(ctx, func(ctx context.Context) error {
			p, err := pods.Get(ctx, img.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Status.Phase != corev1.PodSucceeded {
				return fmt.Errorf("pod %s: %s %v", img.Name, p.Status.Phase, p.Status.ContainerStatuses)
			}
			return nil
		}); err != nil {
			t.Fatalf("%v\n%s", err, node.LogTails(20))
		}
		logs, err := pods.GetLogs(img.Name, &corev1.PodLogOptions{}).Stream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(logs)
		logs.Close()
		t.Logf("%s ran on %s as %s; --help: %d bytes", img.Name, node.Name, images.User, len(out))
	}
}
