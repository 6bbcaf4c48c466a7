package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
)

// gridNamespace holds the demo's grid.
const gridNamespace = "demo"

// newGridClient is a client that knows the apps.atoll.io types.
func newGridClient(rc *rest.Config) (client.Client, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := appsv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return client.New(rc, client.Options{Scheme: scheme})
}

// createGrid makes the DeploymentGrid and ServiceGrid "hello" of image
// (empty: hello:1, for the simulated nodes; on real ones, an image that
// serves HTTP on 8080): one copy per site, site-b's with two replicas,
// behind hello-svc, whose traffic stays in the client's site.
func createGrid(ctx context.Context, c client.Client, image string) error {
	port := corev1.ServicePort{Port: 80}
	if image == "" {
		image = "hello:1"
	} else {
		port.TargetPort = intstr.FromInt32(8080)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: gridNamespace}}); err != nil {
		return fmt.Errorf("grid namespace: %w", err)
	}
	labels := map[string]string{"app": "hello"}
	dg := &appsv1alpha1.DeploymentGrid{
		ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: gridNamespace},
		Spec: appsv1alpha1.DeploymentGridSpec{
			Template: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](1),
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "hello", Image: image}}},
				},
			},
			Overrides: []appsv1alpha1.Override{{Units: []string{"site-b"}, Replicas: ptr.To[int32](2)}},
		},
	}
	sg := &appsv1alpha1.ServiceGrid{
		ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: gridNamespace},
		Spec:       appsv1alpha1.ServiceGridSpec{Template: corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{port}}},
	}
	for _, o := range []client.Object{dg, sg} {
		if err := c.Create(ctx, o); err != nil {
			return fmt.Errorf("grid: %w", err)
		}
	}
	return nil
}

// printGrids prints the grid's per-site copies, from its status.
func printGrids(ctx context.Context, out io.Writer, c client.Client) {
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var g appsv1alpha1.DeploymentGrid
	if err := c.Get(lctx, client.ObjectKey{Namespace: gridNamespace, Name: "hello"}, &g); err != nil {
		return
	}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "GRID %s/%s (Service hello-svc, traffic kept in the site)\nSITE\tCOPY\tREADY\tPODS READY\n", g.Namespace, g.Name)
	for _, u := range g.Status.Units {
		ready := "-"
		if u.Ready {
			ready = "yes"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d/%d\n", u.Name, u.Child, ready, u.ReadyReplicas, u.Replicas)
	}
	_ = w.Flush()
}
