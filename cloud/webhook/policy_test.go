package webhook

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// TestPolicyKeepsPodsReadyWithNoReplica: with no atoll-cloud replica at
// all (no webhook), the pod readiness policy alone keeps the pods of a
// node in the protected set ready while the real node lifecycle
// controller loses it, and so their endpoints: every poll from the
// partition on sees them ready, while the pod of a lost node outside the
// set goes not ready. Once the node leaves the set, the controller's next
// attempt goes through. A kubelet's own readiness is never refused.
func TestPolicyKeepsPodsReadyWithNoReplica(t *testing.T) {
	cluster := kubetest.Start(t, kubetest.WithControllerManager())
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	rc := cluster.RESTConfig()
	client := cluster.Client()
	const (
		protected, lost = "edge-0", "edge-1"
		ns, app, system = "shop", "web", "atoll-system"
	)
	for _, n := range []string{ns, system} {
		if err := cluster.CreateNamespace(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := RegisterPodReadinessPolicy(ctx, client, RegistrationConfig{}, system); err != nil {
		t.Fatal(err)
	}
	setProtected := func(nodes ...string) {
		t.Helper()
		data := map[string]string{}
		for _, n := range nodes {
			data[n] = wellknown.VerdictHealthy
		}
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: wellknown.ProtectedNodesPrefix + "u1", Namespace: system,
				Labels: map[string]string{wellknown.ProtectedNodesLabel: "true"}},
			Data: data,
		}
		_, err := client.CoreV1().ConfigMaps(system).Update(ctx, cm, metav1.UpdateOptions{})
		if apierrors.IsNotFound(err) {
			_, err = client.CoreV1().ConfigMaps(system).Create(ctx, cm, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	setProtected(protected)

	sim := simulate(t, ctx, cluster, protected, lost)
	pods := map[string]string{"web-0a": protected, "web-0b": protected, "web-1": lost}
	for name, node := range pods {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": app}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
				Name: "app", Image: "registry.example/web:1", Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
			}}},
		}
		if _, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": app},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	if _, err := client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ready := func(ctx context.Context) (map[string]bool, error) {
		eps, err := sliceEndpoints(ctx, client, ns, app)
		if err != nil {
			return nil, err
		}
		out := map[string]bool{}
		for _, ep := range eps {
			out[ep.TargetRef.Name] = isTrue(ep.Conditions.Ready)
		}
		return out, nil
	}
	step(t, ctx, "3 ready endpoints", func(ctx context.Context) error {
		got, err := ready(ctx)
		if err != nil {
			return err
		}
		for name := range pods {
			if !got[name] {
				return fmt.Errorf("endpoints %v", got)
			}
		}
		return nil
	})

	// The policy is in force once the apiserver refuses the controller's
	// write (impersonated, dry run) for a pod of the protected node.
	asController := rest.CopyConfig(rc)
	asController.Impersonate = rest.ImpersonationConfig{UserName: DefaultGuardUsers[0]}
	controller, err := kubernetes.NewForConfig(asController)
	if err != nil {
		t.Fatal(err)
	}
	markNotReady := func(ctx context.Context, as kubernetes.Interface, name string) error {
		p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for i, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				p.Status.Conditions[i].Status = corev1.ConditionFalse
			}
		}
		_, err = as.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	step(t, ctx, "policy in force", func(ctx context.Context) error {
		if err := markNotReady(ctx, controller, "web-0a"); !apierrors.IsForbidden(err) {
			return fmt.Errorf("controller marking web-0a not ready: err = %v, want forbidden", err)
		}
		return nil
	})
	if err := markNotReady(ctx, controller, "web-1"); err != nil {
		t.Fatalf("controller marking web-1 (node not protected) not ready: %v", err)
	}
	// The kubelet's own readiness (here the admin's, as the simulator
	// writes it) is never refused.
	if err := markNotReady(ctx, client, "web-0a"); err != nil {
		t.Fatalf("marking web-0a not ready as the kubelet would: %v", err)
	}

	partitioned := time.Now()
	for _, n := range []string{protected, lost} {
		if err := sim.Partition(n); err != nil {
			t.Fatal(err)
		}
	}
	// Every poll, from the partition until the unprotected pod has been
	// not ready for three monitor periods (the controller retries the
	// protected node's pods at each).
	var notReadySince time.Time
	polls := 0
	for notReadySince.IsZero() || time.Since(notReadySince) < 3*cluster.Config().NodeMonitorPeriod+2*time.Second {
		got, err := ready(ctx)
		if err != nil {
			t.Fatal(err)
		}
		polls++
		for name, node := range pods {
			if node == protected && !got[name] {
				t.Fatalf("%s (protected) not ready %s after the partition: endpoints %v", name, time.Since(partitioned).Round(100*time.Millisecond), got)
			}
		}
		if notReadySince.IsZero() && !got["web-1"] {
			notReadySince = time.Now()
			t.Logf("unprotected endpoint not ready %s after the partition", notReadySince.Sub(partitioned).Round(100*time.Millisecond))
		}
		if time.Since(partitioned) > 2*time.Minute {
			t.Fatal("the unprotected endpoint never went not ready")
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	for name, node := range pods {
		p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]corev1.ConditionStatus{true: corev1.ConditionTrue, false: corev1.ConditionFalse}[node == protected]; podCondition(p) != want {
			t.Errorf("pod %s Ready=%s, want %s", name, podCondition(p), want)
		}
	}
	t.Logf("%d polls, protected endpoints ready in each", polls)

	// Out of the set, the controller's next pass marks them.
	setProtected()
	step(t, ctx, "pods of a node out of the set marked not ready", func(ctx context.Context) error {
		got, err := ready(ctx)
		if err != nil {
			return err
		}
		if got["web-0a"] || got["web-0b"] {
			return fmt.Errorf("endpoints %v", got)
		}
		return nil
	})
}
