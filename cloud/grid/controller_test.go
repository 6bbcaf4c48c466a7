package grid_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/atoll-edge/atoll/cloud/grid"
	atollmanager "github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/internal/wellknown"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
	"github.com/atoll-edge/atoll/test/crds"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
	"github.com/atoll-edge/atoll/test/promtest"
)

// installCRDs applies deploy/crds to the cluster.
func installCRDs(t *testing.T, cluster *kubetest.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := crds.Install(ctx, cluster); err != nil {
		t.Fatal(err)
	}
}

// running is one manager with the grid controllers.
type running struct {
	m   *atollmanager.Manager
	reg *prometheus.Registry
}

// writes sums atoll_grid_writes_total.
func (r running) writes(t *testing.T) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "atoll_grid_writes_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

func startControllers(t *testing.T, cluster *kubetest.Cluster, log *slog.Logger) running {
	t.Helper()
	mcfg := atollmanager.DefaultConfig()
	mcfg.LeaderElect = false
	m, err := atollmanager.New(mcfg, cluster.RESTConfig(), log)
	if err != nil {
		t.Fatal(err)
	}
	cfg := grid.DefaultConfig()
	cfg.Resync = 0 // only events drive the controllers
	reg := prometheus.NewRegistry()
	if _, err := grid.New(cfg, m, log, reg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Stop(context.Background()) })
	return running{m: m, reg: reg}
}

// client is a client of cluster with the manager's scheme (the grids').
func (r running) client(t *testing.T, cluster *kubetest.Cluster) client.Client {
	t.Helper()
	c, err := client.New(cluster.RESTConfig(), client.Options{Scheme: r.m.GetScheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func node(name string, labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func webGrid(ns string) *appsv1alpha1.DeploymentGrid {
	return &appsv1alpha1.DeploymentGrid{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: appsv1alpha1.DeploymentGridSpec{
			Template: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](1),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx:1"}}},
				},
			},
			Overrides: []appsv1alpha1.Override{{Units: []string{"b"}, Replicas: ptr.To[int32](3), Images: map[string]string{"web": "nginx:2"}}},
		},
	}
}

// reconciles counts the reconciles of the grid controllers so far
// (controller-runtime's metric, shared by every manager of the process).
func reconciles(t *testing.T) float64 {
	t.Helper()
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && (l.GetValue() == grid.DeploymentGridController || l.GetValue() == grid.ServiceGridController) {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// TestDeploymentGridLifecycle runs the controllers against a real
// apiserver and KCM (its garbage collector): one Deployment per unit with
// its overrides, a new unit's copy, a vanished unit's copy deleted, a
// hand-deleted copy recreated, a hand-scaled copy scaled back, an orphan
// adopted, a relabeled copy
// released (and its name then reported taken), the grid's deletion
// collecting its children, and a restart that writes nothing.
func TestDeploymentGridLifecycle(t *testing.T) {
	cluster := kubetest.Start(t, kubetest.WithControllerManager())
	installCRDs(t, cluster)
	log := natstest.Logger(t, slog.LevelWarn)
	ctx := t.Context()
	ns := "default"
	r := startControllers(t, cluster, log)
	c := r.client(t, cluster)
	for _, n := range []*corev1.Node{
		node("n1", map[string]string{wellknown.LabelUnit: "a"}),
		node("n2", map[string]string{wellknown.LabelUnit: "a"}),
		node("n3", map[string]string{wellknown.LabelUnit: "b"}),
		node("cloud", nil),
	} {
		if err := c.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	g := webGrid(ns)
	if err := c.Create(ctx, g); err != nil {
		t.Fatal(err)
	}
	sg := &appsv1alpha1.ServiceGrid{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec:       appsv1alpha1.ServiceGridSpec{Template: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Port: 80}}}},
	}
	if err := c.Create(ctx, sg); err != nil {
		t.Fatal(err)
	}

	children := func() (map[string]appsv1.Deployment, error) {
		var list appsv1.DeploymentList
		if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return nil, err
		}
		out := map[string]appsv1.Deployment{}
		for _, d := range list.Items {
			out[d.Name] = d
		}
		return out, nil
	}
	want := func(names ...string) func() error {
		return func() error {
			got, err := children()
			if err != nil {
				return err
			}
			var have []string
			for n, d := range got {
				if ref := metav1.GetControllerOf(&d); ref != nil && ref.Kind == "DeploymentGrid" {
					have = append(have, n)
				}
			}
			slices.Sort(have)
			if !slices.Equal(have, names) {
				return fmt.Errorf("grid children %v, want %v", have, names)
			}
			return nil
		}
	}
	poll.Eventually(t, 30*time.Second, want("web-a", "web-b"))
	got, _ := children()
	a, b := got["web-a"], got["web-b"]
	if a.Spec.Template.Spec.NodeSelector[wellknown.LabelUnit] != "a" || *a.Spec.Replicas != 1 || a.Spec.Template.Spec.Containers[0].Image != "nginx:1" {
		t.Errorf("web-a: nodeSelector %v, replicas %d, image %s", a.Spec.Template.Spec.NodeSelector, *a.Spec.Replicas, a.Spec.Template.Spec.Containers[0].Image)
	}
	if b.Spec.Template.Spec.NodeSelector[wellknown.LabelUnit] != "b" || *b.Spec.Replicas != 3 || b.Spec.Template.Spec.Containers[0].Image != "nginx:2" {
		t.Errorf("web-b (overridden): nodeSelector %v, replicas %d, image %s", b.Spec.Template.Spec.NodeSelector, *b.Spec.Replicas, b.Spec.Template.Spec.Containers[0].Image)
	}
	for _, d := range []appsv1.Deployment{a, b} {
		if !slices.ContainsFunc(d.ManagedFields, func(f metav1.ManagedFieldsEntry) bool {
			return f.Manager == wellknown.FieldManager && f.Operation == metav1.ManagedFieldsOperationApply
		}) {
			t.Errorf("%s: not applied by %s", d.Name, wellknown.FieldManager)
		}
	}
	// The Service of the ServiceGrid, with its topology keys.
	poll.Eventually(t, 30*time.Second, func() error {
		var svc corev1.Service
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web-svc"}, &svc); err != nil {
			return err
		}
		if got := svc.Annotations[wellknown.TopologyKeysAnnotation]; got != "atoll.io/unit" {
			return fmt.Errorf("topology keys %q", got)
		}
		return nil
	})
	// Status: two units, conditions.
	poll.Eventually(t, 30*time.Second, func() error {
		var cur appsv1alpha1.DeploymentGrid
		if err := c.Get(ctx, client.ObjectKeyFromObject(g), &cur); err != nil {
			return err
		}
		if cur.Status.UnitCount != 2 || len(cur.Status.Units) != 2 || cur.Status.ObservedGeneration != cur.Generation {
			return fmt.Errorf("status %+v", cur.Status)
		}
		if meta.FindStatusCondition(cur.Status.Conditions, appsv1alpha1.ConditionProgressing) == nil {
			return errors.New("no Progressing condition")
		}
		return nil
	})

	// A new unit's first node: its copy appears.
	if err := c.Create(ctx, node("n4", map[string]string{wellknown.LabelUnit: "c"})); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, want("web-a", "web-b", "web-c"))

	// The last node of b relabeled: b's copy goes.
	n3 := node("n3", nil)
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error { // KCM taints nodes meanwhile
		if err := c.Get(ctx, client.ObjectKeyFromObject(n3), n3); err != nil {
			return err
		}
		n3.Labels[wellknown.LabelUnit] = "a"
		return c.Update(ctx, n3)
	}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, want("web-a", "web-c"))

	// A copy deleted by hand comes back.
	if err := c.Delete(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-c"}}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, func() error {
		got, err := children()
		if err != nil {
			return err
		}
		if d, ok := got["web-c"]; !ok || d.DeletionTimestamp != nil || metav1.GetControllerOf(&d) == nil {
			return errors.New("web-c not recreated")
		}
		return nil
	})

	// A copy scaled by hand is scaled back (this process applied it).
	scale := client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"replicas":5}}`))
	if err := c.Patch(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-a"}}, scale); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, func() error {
		var d appsv1.Deployment
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web-a"}, &d); err != nil {
			return err
		}
		if *d.Spec.Replicas != 1 {
			return fmt.Errorf("web-a has %d replicas", *d.Spec.Replicas)
		}
		return nil
	})

	// An orphan labeled for the grid is adopted when its unit appears.
	orphan := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-d", Labels: map[string]string{wellknown.LabelGrid: "web", wellknown.LabelGridUnit: "d"}},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web", wellknown.LabelGrid: "web", wellknown.LabelGridUnit: "d"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web", wellknown.LabelGrid: "web", wellknown.LabelGridUnit: "d"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "old"}}},
			},
		},
	}
	if err := c.Create(ctx, orphan); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, node("n5", map[string]string{wellknown.LabelUnit: "d"})); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, want("web-a", "web-c", "web-d"))
	got, _ = children()
	if d := got["web-d"]; d.UID != orphan.UID || d.Spec.Template.Spec.Containers[0].Image != "nginx:1" {
		t.Errorf("web-d: uid %s (orphan %s), image %s", d.UID, orphan.UID, d.Spec.Template.Spec.Containers[0].Image)
	}

	// A copy relabeled away from the grid is released, and its name is
	// reported taken rather than overwritten.
	// The deployment controller writes its status meanwhile: re-read on
	// a conflict.
	var d appsv1.Deployment
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, client.ObjectKey{Namespace: got["web-d"].Namespace, Name: "web-d"}, &d); err != nil {
			return err
		}
		d.Labels[wellknown.LabelGrid] = "mine"
		return c.Update(ctx, &d)
	}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, want("web-a", "web-c"))
	poll.Eventually(t, 30*time.Second, func() error {
		var cur appsv1alpha1.DeploymentGrid
		if err := c.Get(ctx, client.ObjectKeyFromObject(g), &cur); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(cur.Status.Conditions, appsv1alpha1.ConditionInvalid)
		if cond == nil || cond.Status != metav1.ConditionTrue {
			return fmt.Errorf("InvalidSpec %+v", cond)
		}
		return nil
	})
	if err := c.Delete(ctx, &d); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, want("web-a", "web-c", "web-d"))

	// Restart: the new controllers reconcile every grid and write nothing.
	settled := func() map[string]string {
		t.Helper()
		rv := map[string]string{}
		var ds appsv1.DeploymentList
		var gs appsv1alpha1.DeploymentGridList
		var ss appsv1alpha1.ServiceGridList
		var svcs corev1.ServiceList
		for _, l := range []client.ObjectList{&ds, &gs, &ss, &svcs} {
			if err := c.List(ctx, l, client.InNamespace(ns)); err != nil {
				t.Fatal(err)
			}
		}
		for _, o := range ds.Items {
			rv["deployment/"+o.Name] = o.ResourceVersion
		}
		for _, o := range gs.Items {
			rv["dg/"+o.Name] = o.ResourceVersion
		}
		for _, o := range ss.Items {
			rv["sg/"+o.Name] = o.ResourceVersion
		}
		for _, o := range svcs.Items {
			rv["service/"+o.Name] = o.ResourceVersion
		}
		return rv
	}
	// Wait for quiet: the grid's status stops moving (the Deployments'
	// status does not change without pods).
	var before map[string]string
	poll.Eventually(t, 30*time.Second, func() error {
		now := settled()
		defer func() { before = now }()
		if before == nil || fmt.Sprint(now) != fmt.Sprint(before) {
			return errors.New("still changing")
		}
		return nil
	})
	if err := r.m.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	start := reconciles(t)
	r2 := startControllers(t, cluster, log)
	// Every grid reconciled at least once by the new controllers.
	poll.Eventually(t, 30*time.Second, func() error {
		if n := reconciles(t) - start; n < 2 {
			return fmt.Errorf("%v reconciles since the restart", n)
		}
		return nil
	})
	if w := r2.writes(t); w != 0 {
		t.Errorf("%v writes after the restart, want 0", w)
	}
	if after := settled(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("objects changed after the restart:\nbefore %v\nafter  %v", before, after)
	}

	// Deleting the grid: KCM's garbage collector takes its children.
	if err := c.Delete(ctx, g); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 60*time.Second, func() error {
		got, err := children()
		if err != nil {
			return err
		}
		if len(got) > 0 {
			return fmt.Errorf("%d Deployments left", len(got))
		}
		return nil
	})
	if err := c.Get(ctx, client.ObjectKeyFromObject(g), g); !apierrors.IsNotFound(err) {
		t.Errorf("grid: %v", err)
	}
}

// threeUnitGrid starts the controllers on a bare apiserver (no KCM) with
// units a, b and c of one node each, and creates webGrid there.
func threeUnitGrid(t *testing.T) (running, client.Client, *appsv1alpha1.DeploymentGrid) {
	t.Helper()
	cluster := kubetest.Start(t)
	installCRDs(t, cluster)
	ctx := t.Context()
	r := startControllers(t, cluster, natstest.Logger(t, slog.LevelWarn))
	c := r.client(t, cluster)
	for _, n := range []*corev1.Node{
		node("n1", map[string]string{wellknown.LabelUnit: "a"}),
		node("n2", map[string]string{wellknown.LabelUnit: "b"}),
		node("n3", map[string]string{wellknown.LabelUnit: "c"}),
	} {
		if err := c.Create(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	g := webGrid("default")
	if err := c.Create(ctx, g); err != nil {
		t.Fatal(err)
	}
	return r, c, g
}

// TestNewGridOneStatusWrite: a new grid's children are applied and its
// status written once, saying its units are updating; the children's
// events that follow find nothing to change (no KCM: the children's
// status stays as created).
func TestNewGridOneStatusWrite(t *testing.T) {
	ctx := t.Context()
	r, c, g := threeUnitGrid(t)
	poll.Eventually(t, 30*time.Second, func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(g), g); err != nil {
			return err
		}
		if len(g.Status.Units) != 3 {
			return fmt.Errorf("status lists %d units", len(g.Status.Units))
		}
		return nil
	})
	// The children's Added events reconcile the grid again meanwhile.
	time.Sleep(3 * time.Second)
	statusWrites := promtest.Counter(t, r.reg, "atoll_grid_writes_total", map[string]string{"kind": "Deployment", "op": "status"})
	if statusWrites != 1 {
		t.Errorf("%v status writes, want 1", statusWrites)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(g), g); err != nil {
		t.Fatal(err)
	}
	if p := meta.FindStatusCondition(g.Status.Conditions, appsv1alpha1.ConditionProgressing); p == nil || p.Message != "3 units updating, 0 pending" {
		t.Errorf("Progressing %+v, want 3 units updating", p)
	}
}

// TestTemplateChangeWritesEachChildOnce: a new image in a grid's template
// applies the child of each unit it changes once (every unit at once: no
// maxUnavailableUnits); unit b, whose override sets its own image, is
// not written.
func TestTemplateChangeWritesEachChildOnce(t *testing.T) {
	ctx := t.Context()
	r, c, g := threeUnitGrid(t)
	applies := func() float64 {
		return promtest.Counter(t, r.reg, "atoll_grid_writes_total", map[string]string{"kind": "Deployment", "op": "apply"})
	}
	poll.Eventually(t, 30*time.Second, func() error {
		if n := applies(); n != 3 {
			return fmt.Errorf("%v children applied", n)
		}
		return nil
	})
	time.Sleep(2 * time.Second) // the children's events reconcile the grid again
	before := applies()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(g), g); err != nil {
			return err
		}
		g.Spec.Template.Template.Spec.Containers[0].Image = "nginx:3"
		return c.Update(ctx, g)
	}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, func() error {
		var d appsv1.Deployment
		for _, u := range []string{"a", "c"} { // b overrides the image
			if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "web-" + u}, &d); err != nil {
				return err
			}
			if img := d.Spec.Template.Spec.Containers[0].Image; img != "nginx:3" {
				return fmt.Errorf("web-%s runs %s", u, img)
			}
		}
		return nil
	})
	time.Sleep(3 * time.Second) // the children's events reconcile the grid again
	if n := applies() - before; n != 2 {
		t.Errorf("%v child writes for one template change of units a and c, want 2", n)
	}
	var b appsv1.Deployment
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "web-b"}, &b); err != nil {
		t.Fatal(err)
	}
	if img := b.Spec.Template.Spec.Containers[0].Image; img != "nginx:2" {
		t.Errorf("web-b runs %s, want its override nginx:2", img)
	}
}
