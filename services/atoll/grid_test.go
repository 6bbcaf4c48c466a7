package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
	"github.com/atoll-edge/atoll/test/crds"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// TestGridCommands: against a real apiserver with the CRDs, `atoll grid
// resume` sets a new spec.rollout.resume each time, and `atoll grid
// status` prints the units and the rollout position from the status.
func TestGridCommands(t *testing.T) {
	cluster := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := crds.Install(ctx, cluster); err != nil {
		t.Fatal(err)
	}
	gf := &gridFlags{kubeconfig: cluster.KubeconfigPath(), namespace: "default", kind: "dg"}
	c, err := gf.client()
	if err != nil {
		t.Fatal(err)
	}
	g := &appsv1alpha1.DeploymentGrid{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: appsv1alpha1.DeploymentGridSpec{Template: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx"}}},
			},
		}},
	}
	if err := c.Create(ctx, g); err != nil {
		t.Fatal(err)
	}
	resume := func() string {
		t.Helper()
		var out bytes.Buffer
		if err := run(ctx, []string{"grid", "resume", "--kubeconfig", cluster.KubeconfigPath(), "web"}, nil, &out); err != nil {
			t.Fatal(err)
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(g), g); err != nil {
			t.Fatal(err)
		}
		if g.Spec.Rollout == nil || g.Spec.Rollout.Resume == "" || !strings.Contains(out.String(), g.Spec.Rollout.Resume) {
			t.Fatalf("resume: printed %q, spec.rollout %+v", out.String(), g.Spec.Rollout)
		}
		return g.Spec.Rollout.Resume
	}
	if first, second := resume(), resume(); first == second {
		t.Errorf("two resumes wrote the same value %q", first)
	}
	if err := run(ctx, []string{"grid", "resume", "--kubeconfig", cluster.KubeconfigPath(), "nope"}, nil, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("resume of a missing grid: %v", err)
	}

	g.Status = appsv1alpha1.GridStatus{
		ObservedGeneration: g.Generation, UnitCount: 2, ReadyUnits: 1,
		Units: []appsv1alpha1.UnitStatus{
			{Name: "a", Child: "web-a", Replicas: 1, ReadyReplicas: 0, UpdatedReplicas: 1},
			{Name: "b", Child: "web-b", Replicas: 1, ReadyReplicas: 1, UpdatedReplicas: 1, AvailableReplicas: 1, Ready: true},
		},
		Rollout:    &appsv1alpha1.RolloutStatus{Revision: "abc", Stalled: []string{"a"}, Pending: []string{"b"}},
		Conditions: []metav1.Condition{{Type: appsv1alpha1.ConditionProgressing, Status: metav1.ConditionFalse, Reason: "ProgressDeadlineExceeded", Message: "stopped", LastTransitionTime: metav1.Now()}},
	}
	if err := c.Status().Update(ctx, g); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"grid", "status", "--kubeconfig", cluster.KubeconfigPath(), "web"}, nil, &out); err != nil {
		t.Fatal(err)
	}
	for _, output := range []string{"json", "yaml"} {
		var out bytes.Buffer
		if err := run(ctx, []string{"grid", "status", "--kubeconfig", cluster.KubeconfigPath(), "-o", output, "web"}, nil, &out); err != nil {
			t.Fatal(err)
		}
		var got appsv1alpha1.DeploymentGrid
		if err := yaml.UnmarshalStrict(out.Bytes(), &got); err != nil { // JSON is YAML
			t.Fatalf("-o %s: %v in\n%s", output, err, out.String())
		}
		if got.Kind != "DeploymentGrid" || got.APIVersion != "apps.atoll.io/v1alpha1" || got.Name != "web" ||
			got.Status.Rollout == nil || got.Status.Rollout.Revision != "abc" || len(got.Status.Units) != 2 {
			t.Errorf("-o %s:\n%s", output, out.String())
		}
		if isJSON := strings.HasPrefix(out.String(), "{"); isJSON != (output == "json") {
			t.Errorf("-o %s printed\n%s", output, out.String())
		}
	}
	for _, want := range []string{"default/web: 1/2 units ready", "web-a", "stalled", "pending", "rollout abc: updated -; pending b; stalled a", "Progressing=False ProgressDeadlineExceeded: stopped"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
}
