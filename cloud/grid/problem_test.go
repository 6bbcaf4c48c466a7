package grid_test

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/atoll-edge/atoll/internal/wellknown"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestGridSaysWhyPodsAreNotReady: a unit whose pod cannot pull its image
// is shown with the kubelet's reason and message in the unit's status and
// in the grid's Ready condition, although no child changed (the pod's
// status is written as a kubelet writes it: the pod's events bring the
// grid back); while the kubelet retries the pull (ImagePullBackOff
// quoting the same error) the grid is not written at all; once the pod is
// ready the reason is gone.
func TestGridSaysWhyPodsAreNotReady(t *testing.T) {
	const settle = 5 * time.Second // a quiet period, not waiting for a state
	cluster := kubetest.Start(t)
	installCRDs(t, cluster)
	ctx := t.Context()
	c := startControllers(t, cluster, natstest.Logger(t, slog.LevelWarn)).client(t, cluster)
	if err := c.Create(ctx, node("n1", map[string]string{wellknown.LabelUnit: "a"})); err != nil {
		t.Fatal(err)
	}
	g := webGrid("default")
	g.Spec.Overrides = nil
	if err := c.Create(ctx, g); err != nil {
		t.Fatal(err)
	}
	// The pod the Deployment web-a would run, as the kubelet reports it
	// (no KCM here: its ServiceAccount is made by hand).
	if err := c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "default"}}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-a-5d8f7c-x2x9q", Namespace: "default",
		Labels: map[string]string{"app": "web", wellknown.LabelGrid: "web", wellknown.LabelGridUnit: "a"}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "web", Image: "nginx:1"}}}}
	if err := c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	const msg = `failed to pull and unpack image "docker.io/library/nginx:1": not found`
	pod.Status = corev1.PodStatus{Phase: corev1.PodPending,
		Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
			{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady"}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "web", Image: "nginx:1",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: msg}}}}}
	if err := c.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	want := "1/1 pods ErrImagePull: " + msg
	status := func() (*appsv1alpha1.GridStatus, error) {
		var got appsv1alpha1.DeploymentGrid
		if err := c.Get(ctx, client.ObjectKeyFromObject(g), &got); err != nil {
			return nil, err
		}
		return &got.Status, nil
	}
	poll.Eventually(t, 30*time.Second, func() error {
		st, err := status()
		if err != nil {
			return err
		}
		if len(st.Units) != 1 || st.Units[0].Problem != want {
			return fmt.Errorf("units %+v, want unit a's problem %q", st.Units, want)
		}
		ready := meta.FindStatusCondition(st.Conditions, appsv1alpha1.ConditionReady)
		if ready == nil || !strings.Contains(ready.Message, "unit a: "+want) {
			return fmt.Errorf("Ready condition %+v does not say why", ready)
		}
		return nil
	})

	// The rollout settles first (its unit moves to updating): a grid not
	// written for a while.
	var before appsv1alpha1.DeploymentGrid
	poll.Eventually(t, time.Minute, func() error {
		var first appsv1alpha1.DeploymentGrid
		if err := c.Get(ctx, client.ObjectKeyFromObject(g), &first); err != nil {
			return err
		}
		time.Sleep(settle)
		if err := c.Get(ctx, client.ObjectKeyFromObject(g), &before); err != nil {
			return err
		}
		if before.ResourceVersion != first.ResourceVersion {
			return errors.New("the grid is still changing")
		}
		return nil
	})
	pod.Status.ContainerStatuses[0].State.Waiting = &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff",
		Message: `Back-off pulling image "nginx:1": ErrImagePull: ` + msg}
	if err := c.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	time.Sleep(settle)
	var after appsv1alpha1.DeploymentGrid
	if err := c.Get(ctx, client.ObjectKeyFromObject(g), &after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != before.ResourceVersion {
		t.Errorf("the grid was written while its pod's pull was retried:\nbefore %+v\nafter  %+v", before.Status, after.Status)
	}

	pod.Status.Conditions[1] = corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue}
	pod.Status.ContainerStatuses[0].State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	pod.Status.ContainerStatuses[0].Ready = true
	pod.Status.Phase = corev1.PodRunning
	if err := c.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, func() error {
		st, err := status()
		if err != nil {
			return err
		}
		if len(st.Units) != 1 || st.Units[0].Problem != "" {
			return fmt.Errorf("units %+v, want no problem once the pod is ready", st.Units)
		}
		return nil
	})
}
