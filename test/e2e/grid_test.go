package e2e

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/atoll-edge/atoll/cloud/cloudapp"
	"github.com/atoll-edge/atoll/deploy"
	"github.com/atoll-edge/atoll/internal/wellknown"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
	"github.com/atoll-edge/atoll/test/edgesim"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/poll"
	"github.com/atoll-edge/atoll/test/testbed"
)

// gridEnv is a bed with the grid controllers and a client that knows the
// apps.atoll.io types.
type gridEnv struct {
	bed      *testbed.Bed
	c        client.Client
	auditDir string
	logPath  string
}

// startGrids brings up a bed with the grid CRDs and RBAC, atoll-cloud as
// its ServiceAccount (audited) on a hub cluster (so it can restart), and
// the grids' periodic resync off (unless resync, at most one, says
// otherwise): only events drive them.
func startGrids(t testing.TB, resync ...time.Duration) *gridEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	logDir := os.Getenv("ATOLL_E2E_LOG_DIR") // keep the log after the test
	if logDir == "" {
		logDir = t.TempDir()
	}
	logFile, err := os.Create(filepath.Join(logDir, "atoll-grids.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = logFile.Close() })
	auditDir := t.TempDir()
	flags, err := kubetest.Audit(auditDir, testbed.CloudUser)
	if err != nil {
		t.Fatal(err)
	}
	bed, err := testbed.Start(ctx, testbed.Options{
		Dir:            t.TempDir(),
		Net:            6,
		HubCluster:     true,
		Grids:          true,
		ServiceAccount: true,
		Logger:         slog.New(slog.NewJSONHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Kube:           kubetest.Config{ExtraAPIServerFlags: flags},
		Cloud: func(c *cloudapp.Config) {
			c.Grid.Resync = 0
			if len(resync) > 0 {
				c.Grid.Resync = resync[0]
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("atoll log: %s\n%s", logFile.Name(), bed.Cluster.LogTails(40))
		}
		bed.Stop()
	})
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := appsv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(bed.Cluster.RESTConfig(), client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return &gridEnv{bed: bed, c: c, auditDir: auditDir, logPath: logFile.Name()}
}

// addUnit registers n simulated nodes of unit (cpu CPUs each; 0: 4).
func (e *gridEnv) addUnit(t testing.TB, unit string, n int, cpu string) []string {
	t.Helper()
	var specs []edgesim.NodeSpec
	var names []string
	for i := 1; i <= n; i++ {
		s := edgesim.NodeSpec{Name: fmt.Sprintf("%s-%d", unit, i), Labels: map[string]string{wellknown.LabelUnit: unit}}
		if cpu != "" {
			s.CPU = resource.MustParse(cpu)
		}
		specs = append(specs, s)
		names = append(names, s.Name)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := e.bed.Kubelet.AddNodes(ctx, specs...); err != nil {
		t.Fatal(err)
	}
	return names
}

// relabel moves node to unit.
func (e *gridEnv) relabel(t *testing.T, node, unit string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, wellknown.LabelUnit, unit)
	if err := e.c.Patch(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// children returns the Deployments a grid controls, by unit.
func (e *gridEnv) deployments(ns, grid string) (map[string]appsv1.Deployment, error) {
	var list appsv1.DeploymentList
	if err := e.c.List(context.Background(), &list, client.InNamespace(ns), client.MatchingLabels{wellknown.LabelGrid: grid}); err != nil {
		return nil, err
	}
	out := map[string]appsv1.Deployment{}
	for _, d := range list.Items {
		if ref := metav1.GetControllerOf(&d); ref != nil && ref.Name == grid && d.DeletionTimestamp == nil {
			out[d.Labels[wellknown.LabelGridUnit]] = d
		}
	}
	return out, nil
}

func (e *gridEnv) wantUnits(ns, grid string, units ...string) func() error {
	return func() error {
		got, err := e.deployments(ns, grid)
		if err != nil {
			return err
		}
		have := slices.Sorted(maps.Keys(got))
		if !slices.Equal(have, units) {
			return fmt.Errorf("%s's copies in units %v, want %v", grid, have, units)
		}
		return nil
	}
}

// placed checks that grid's pods in every unit run, as many as the
// copy's replicas, only on that unit's nodes (the real scheduler placed
// them by the merged nodeSelector).
func (e *gridEnv) placed(ns, grid string, nodes map[string][]string) func() error {
	return func() error {
		ds, err := e.deployments(ns, grid)
		if err != nil {
			return err
		}
		for unit, d := range ds {
			var pods corev1.PodList
			if err := e.c.List(context.Background(), &pods, client.InNamespace(ns), client.MatchingLabels{wellknown.LabelGrid: grid, wellknown.LabelGridUnit: unit}); err != nil {
				return err
			}
			running := 0
			for _, p := range pods.Items {
				if p.Spec.NodeName == "" || p.Status.Phase != corev1.PodRunning {
					continue
				}
				if !slices.Contains(nodes[unit], p.Spec.NodeName) {
					return fmt.Errorf("pod %s of unit %s runs on %s, not on %v", p.Name, unit, p.Spec.NodeName, nodes[unit])
				}
				running++
			}
			if want := int(ptr.Deref(d.Spec.Replicas, 1)); running != want {
				return fmt.Errorf("unit %s: %d pods running, want %d", unit, running, want)
			}
		}
		return nil
	}
}

func webTemplate(image string, replicas int32) appsv1.DeploymentSpec {
	return appsv1.DeploymentSpec{
		Replicas: ptr.To(replicas),
		Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
		Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: image}}},
		},
	}
}

// gridWrites counts atoll-cloud's successful writes of grid objects and
// their children in the audit log.
func (e *gridEnv) gridWrites() (map[string]int, error) {
	events, err := kubetest.ReadAudit(kubetest.AuditLog(e.auditDir))
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for obj, n := range kubetest.Writes(events, wellknown.FieldManager) {
		res, _, _ := strings.Cut(obj, "/")
		switch res {
		case "deployments", "statefulsets", "services", "deploymentgrids", "statefulsetgrids", "servicegrids":
			out[obj] = n
		}
	}
	return out, nil
}

// TestGrids runs the grid controllers in a whole installation (real
// apiserver, KCM with its garbage collector, scheduler, simulated nodes,
// the hub and atoll-cloud as its ServiceAccount, no periodic resync):
//
//   - 3 units × 2 nodes: a DeploymentGrid yields 3 Deployments whose pods
//     the scheduler places only on their unit's nodes, with the per-unit
//     overrides (replicas, image, a JSON patch);
//   - a 4th unit's first node: its copy appears (from the topology's unit
//     event: Node events do not reach grids of the unit label, and nothing
//     resyncs);
//   - a unit's last node relabeled: its copy is deleted;
//   - a SuperEdge-style grid (templatePool/templates) and the same grid
//     written with overrides yield the same children;
//   - a StatefulSetGrid with a ServiceGrid: StatefulSets <grid>-<unit>
//     whose serviceName is the grid's Service, which carries the topology
//     keys;
//   - an invalid spec: InvalidSpec and a Warning Event;
//   - atoll-cloud restarted: no write to any grid object or child;
//   - the grids deleted: the garbage collector takes their children
//     (Deployments, StatefulSets, the Service);
//   - deploy/base/grids.yaml: atoll-cloud is refused nothing and uses every
//     rule.
func TestGrids(t *testing.T) {
	e := startGrids(t)
	ctx := t.Context()
	ns := "grids"
	if err := e.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	nodes := map[string][]string{}
	for _, u := range []string{"a", "b", "c"} {
		nodes[u] = e.addUnit(t, u, 2, "")
	}

	web := &appsv1alpha1.DeploymentGrid{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: appsv1alpha1.DeploymentGridSpec{
			Template: webTemplate("nginx:1", 1),
			Overrides: []appsv1alpha1.Override{{
				Units: []string{"b"}, Replicas: ptr.To[int32](2), Images: map[string]string{"web": "nginx:2"},
				Patches: []appsv1alpha1.JSONPatchOperation{{Op: "add", Path: "/spec/template/spec/containers/0/args", Value: jsonValue(`["--site","b"]`)}},
			}},
		},
	}
	if err := e.c.Create(ctx, web); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, e.wantUnits(ns, "web", "a", "b", "c"))
	poll.Eventually(t, 60*time.Second, e.placed(ns, "web", nodes))
	ds, err := e.deployments(ns, "web")
	if err != nil {
		t.Fatal(err)
	}
	for unit, d := range ds {
		c := d.Spec.Template.Spec.Containers[0]
		wantImage, wantReplicas, wantArgs := "nginx:1", int32(1), []string(nil)
		if unit == "b" {
			wantImage, wantReplicas, wantArgs = "nginx:2", 2, []string{"--site", "b"}
		}
		if d.Name != "web-"+unit || c.Image != wantImage || *d.Spec.Replicas != wantReplicas || !slices.Equal(c.Args, wantArgs) {
			t.Errorf("unit %s: %s image %s replicas %d args %v; want web-%s %s %d %v", unit, d.Name, c.Image, *d.Spec.Replicas, c.Args, unit, wantImage, wantReplicas, wantArgs)
		}
	}
	poll.Eventually(t, 60*time.Second, func() error {
		var g appsv1alpha1.DeploymentGrid
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(web), &g); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(g.Status.Conditions, appsv1alpha1.ConditionReady) || g.Status.ReadyUnits != 3 {
			return fmt.Errorf("web not Ready: %d ready units, %v", g.Status.ReadyUnits, g.Status.Conditions)
		}
		return nil
	})

	// Topology keeps a NodeUnit per unit.
	poll.Eventually(t, 30*time.Second, func() error {
		var nu appsv1alpha1.NodeUnit
		if err := e.c.Get(ctx, client.ObjectKey{Name: "a"}, &nu); err != nil {
			return err
		}
		if !slices.Equal(nu.Status.Members, nodes["a"]) || nu.Status.ReadyNodes != 2 || nu.Spec.UnitLabel != wellknown.LabelUnit {
			return fmt.Errorf("NodeUnit a: %+v %+v", nu.Spec, nu.Status)
		}
		return nil
	})

	// A 4th unit's first node: its copy comes from the unit event.
	start := time.Now()
	nodes["d"] = e.addUnit(t, "d", 1, "")
	poll.Eventually(t, 20*time.Second, e.wantUnits(ns, "web", "a", "b", "c", "d"))
	t.Logf("the 4th unit's copy appeared %v after its first node", time.Since(start).Round(time.Millisecond))

	// Unit c's nodes move to a, one by one: the copy goes with the last.
	e.relabel(t, nodes["c"][0], "a")
	e.relabel(t, nodes["c"][1], "a")
	poll.Eventually(t, 20*time.Second, e.wantUnits(ns, "web", "a", "b", "d"))
	poll.Eventually(t, 20*time.Second, func() error {
		err := e.c.Get(ctx, client.ObjectKey{Name: "c"}, &appsv1alpha1.NodeUnit{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("NodeUnit c still there (%v)", err)
	})
	nodes["a"] = append(nodes["a"], nodes["c"]...)
	delete(nodes, "c")

	// SuperEdge's templatePool/templates and Atoll's overrides: the same
	// children.
	superEdge := &appsv1alpha1.DeploymentGrid{
		ObjectMeta: metav1.ObjectMeta{Name: "se", Namespace: ns},
		Spec: appsv1alpha1.DeploymentGridSpec{
			Template:     webTemplate("echo:1", 1),
			TemplatePool: map[string]appsv1.DeploymentSpec{"big": webTemplate("echo:2", 2)},
			Templates:    map[string]string{"b": "big"},
		},
	}
	atoll := &appsv1alpha1.DeploymentGrid{
		ObjectMeta: metav1.ObjectMeta{Name: "at", Namespace: ns},
		Spec: appsv1alpha1.DeploymentGridSpec{
			Template:  webTemplate("echo:1", 1),
			Overrides: []appsv1alpha1.Override{{Units: []string{"b"}, Replicas: ptr.To[int32](2), Images: map[string]string{"web": "echo:2"}}},
		},
	}
	for _, g := range []*appsv1alpha1.DeploymentGrid{superEdge, atoll} {
		if err := e.c.Create(ctx, g); err != nil {
			t.Fatal(err)
		}
		poll.Eventually(t, 30*time.Second, e.wantUnits(ns, g.Name, "a", "b", "d"))
	}
	seDs, _ := e.deployments(ns, "se")
	atDs, _ := e.deployments(ns, "at")
	for unit := range seDs {
		sd, ad := seDs[unit], atDs[unit]
		s, a := sd.Spec.DeepCopy(), ad.Spec.DeepCopy()
		// Only the grid label differs.
		for _, sp := range []*appsv1.DeploymentSpec{s, a} {
			delete(sp.Selector.MatchLabels, wellknown.LabelGrid)
			delete(sp.Template.Labels, wellknown.LabelGrid)
		}
		if !equality.Semantic.DeepEqual(s, a) {
			t.Errorf("unit %s: the SuperEdge-style child differs:\n%+v\n%+v", unit, s, a)
		}
	}

	// A StatefulSetGrid with its ServiceGrid.
	sg := &appsv1alpha1.ServiceGrid{
		ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: ns},
		Spec: appsv1alpha1.ServiceGridSpec{Template: corev1.ServiceSpec{
			Selector: map[string]string{"app": "db"}, ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Port: 5432}},
		}},
	}
	ssg := &appsv1alpha1.StatefulSetGrid{
		ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: ns},
		Spec: appsv1alpha1.StatefulSetGridSpec{Template: appsv1.StatefulSetSpec{
			ServiceName: "db-svc",
			Selector:    &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "db"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "db", Image: "postgres"}}},
			},
		}},
	}
	for _, o := range []client.Object{sg, ssg} {
		if err := e.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	poll.Eventually(t, 30*time.Second, func() error {
		var svc corev1.Service
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "db-svc"}, &svc); err != nil {
			return err
		}
		if svc.Annotations[wellknown.TopologyKeysAnnotation] != "atoll.io/unit" {
			return fmt.Errorf("db-svc topology keys %q", svc.Annotations[wellknown.TopologyKeysAnnotation])
		}
		var list appsv1.StatefulSetList
		if err := e.c.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return err
		}
		var names []string
		for _, s := range list.Items {
			if s.Spec.ServiceName != "db-svc" {
				return fmt.Errorf("%s: serviceName %q", s.Name, s.Spec.ServiceName)
			}
			if s.Spec.Template.Spec.NodeSelector[wellknown.LabelUnit] != s.Labels[wellknown.LabelGridUnit] {
				return fmt.Errorf("%s: nodeSelector %v", s.Name, s.Spec.Template.Spec.NodeSelector)
			}
			names = append(names, s.Name)
		}
		slices.Sort(names)
		if want := []string{"db-a", "db-b", "db-d"}; !slices.Equal(names, want) {
			return fmt.Errorf("StatefulSets %v, want %v", names, want)
		}
		return nil
	})

	// An invalid spec the schema cannot see: a condition and an Event.
	bad := &appsv1alpha1.DeploymentGrid{
		ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: ns},
		Spec: appsv1alpha1.DeploymentGridSpec{
			Template:  webTemplate("x", 1),
			Overrides: []appsv1alpha1.Override{{Units: []string{"a"}, Images: map[string]string{"nope": "x"}}},
		},
	}
	if err := e.c.Create(ctx, bad); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, func() error {
		var g appsv1alpha1.DeploymentGrid
		if err := e.c.Get(ctx, client.ObjectKeyFromObject(bad), &g); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(g.Status.Conditions, appsv1alpha1.ConditionInvalid) {
			return errors.New("bad: no InvalidSpec condition")
		}
		var evs corev1.EventList
		if err := e.c.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Name == "bad" && ev.Reason == "InvalidSpec" && ev.Type == corev1.EventTypeWarning {
				return nil
			}
		}
		return errors.New("bad: no InvalidSpec Event")
	})

	// Quiet, then a restart: the new atoll-cloud writes nothing.
	var settled map[string]int
	quietSince := time.Now()
	poll.Eventually(t, 60*time.Second, func() error {
		w, err := e.gridWrites()
		if err != nil {
			return err
		}
		if !maps.Equal(w, settled) {
			settled, quietSince = w, time.Now()
		}
		if time.Since(quietSince) < 5*time.Second {
			return fmt.Errorf("atoll-cloud still writing grids: %d objects", len(w))
		}
		return nil
	})
	// One Warning for the invalid spec, however many reconciles saw it.
	var evs corev1.EventList
	if err := e.c.List(ctx, &evs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	warned := int32(0)
	for _, ev := range evs.Items {
		if ev.InvolvedObject.Name == "bad" && ev.Reason == "InvalidSpec" {
			warned += max(ev.Count, 1)
		}
	}
	if warned != 1 {
		t.Errorf("bad got %d InvalidSpec Events, want 1", warned)
	}
	gridWatches := func() (int, error) {
		events, err := kubetest.ReadAudit(kubetest.AuditLog(e.auditDir))
		if err != nil {
			return 0, err
		}
		n := 0
		for _, ev := range events {
			if ev.User.Username == testbed.CloudUser && ev.ObjectRef.Resource == "deploymentgrids" && ev.Verb == "watch" {
				n++
			}
		}
		return n, nil
	}
	watchesBefore, err := gridWatches()
	if err != nil {
		t.Fatal(err)
	}
	restartCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := e.bed.StopCloud(restartCtx); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	if err := e.bed.StartCloud(restartCtx); err != nil {
		t.Fatal(err)
	}
	// The new process watches the grids: its controllers started, and
	// reconcile every grid from their initial listing.
	poll.Eventually(t, 60*time.Second, func() error {
		n, err := gridWatches()
		if err != nil {
			return err
		}
		if n <= watchesBefore {
			return errors.New("the restarted atoll-cloud has not watched the grids yet")
		}
		return nil
	})
	holdsFor(t, 10*time.Second, func() error {
		w, err := e.gridWrites()
		if err != nil {
			return err
		}
		if !maps.Equal(w, settled) {
			return fmt.Errorf("atoll-cloud wrote grid objects after its restart at %s: %v, was %v", restarted.Format(time.TimeOnly), w, settled)
		}
		return nil
	})

	// The grid deleted: the garbage collector takes its children.
	if err := e.c.Delete(ctx, web); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 60*time.Second, func() error {
		var list appsv1.DeploymentList
		if err := e.c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{wellknown.LabelGrid: "web"}); err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return fmt.Errorf("%d Deployments of web left", len(list.Items))
		}
		return nil
	})
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(web), &appsv1alpha1.DeploymentGrid{}); !apierrors.IsNotFound(err) {
		t.Errorf("web: %v", err)
	}
	// So do the StatefulSetGrid's StatefulSets and the ServiceGrid's
	// Service.
	for _, o := range []client.Object{ssg, sg} {
		if err := e.c.Delete(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	poll.Eventually(t, 60*time.Second, func() error {
		var list appsv1.StatefulSetList
		if err := e.c.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{wellknown.LabelGrid: "db"}); err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return fmt.Errorf("%d StatefulSets of db left", len(list.Items))
		}
		err := e.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "db-svc"}, &corev1.Service{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("Service db-svc still there (%v)", err)
		}
		return nil
	})

	e.checkGridPrivilege(t)
}

// gridsNotInE2E are the rules of deploy/base/grids.yaml TestGrids does not
// exercise, with the reason.
var gridsNotInE2E = map[grant]string{
	{verb: "list", group: "apps.atoll.io", resource: "deploymentgrids"}:  listFallback,
	{verb: "list", group: "apps.atoll.io", resource: "statefulsetgrids"}: listFallback,
	{verb: "list", group: "apps.atoll.io", resource: "servicegrids"}:     listFallback,
	{verb: "list", group: "apps.atoll.io", resource: "nodeunits"}:        listFallback,
	{verb: "list", group: "apps", resource: "deployments"}:               listFallback,
	{verb: "list", group: "apps", resource: "statefulsets"}:              listFallback,
	{verb: "list", group: "", resource: "services"}:                      listFallback,
	{verb: "create", group: "apps", resource: "deployments"}:             applyCreates,
	{verb: "create", group: "apps.atoll.io", resource: "nodeunits"}:      applyCreates,
	{verb: "create", group: "apps", resource: "statefulsets"}:            applyCreates,
	{verb: "create", group: "", resource: "services"}:                    applyCreates,
	{verb: "delete", group: "apps", resource: "statefulsets"}:            "a StatefulSetGrid's unit vanishing is the same code as a DeploymentGrid's (cloud/grid/workload.go)",
	{verb: "patch", group: "", resource: "events"}:                       "the event recorder patches an Event only when it repeats",
}

// applyCreates: without create, the first apply of a child is refused
// ("cannot create resource"), though the audit log records it as a patch.
const applyCreates = "a server-side apply that creates the object is audited as patch but authorized as create too"

// checkGridPrivilege: atoll-cloud was refused nothing, and it used every
// rule of deploy/base/grids.yaml (but gridsNotInE2E).
func (e *gridEnv) checkGridPrivilege(t *testing.T) {
	t.Helper()
	data, err := deploy.Read(testbed.GridsManifest)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.DecodeManifests(testbed.GridsManifest, data)
	if err != nil {
		t.Fatal(err)
	}
	var grants []grant
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" {
			continue
		}
		var r rbacv1.ClusterRole
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &r); err != nil {
			t.Fatal(err)
		}
		for _, rule := range r.Rules {
			for _, g := range rule.APIGroups {
				for _, res := range rule.Resources {
					for _, v := range rule.Verbs {
						grants = append(grants, grant{verb: v, group: g, resource: res})
					}
				}
			}
		}
	}
	events, err := kubetest.ReadAudit(kubetest.AuditLog(e.auditDir))
	if err != nil {
		t.Fatal(err)
	}
	usedGrants := map[grant]int{}
	var denied []string
	for _, ev := range events {
		if ev.User.Username != testbed.CloudUser || ev.ObjectRef.Resource == "" {
			continue
		}
		res := ev.ObjectRef.Resource
		if ev.ObjectRef.Subresource != "" {
			res += "/" + ev.ObjectRef.Subresource
		}
		r := grant{verb: ev.Verb, group: ev.ObjectRef.APIGroup, resource: res, namespace: ev.ObjectRef.Namespace, name: ev.ObjectRef.Name}
		if ev.ResponseStatus.Code == 403 {
			denied = append(denied, r.String())
			continue
		}
		for _, g := range grants {
			if g.covers(r) {
				usedGrants[g]++
			}
		}
	}
	slices.Sort(denied)
	for _, d := range slices.Compact(denied) {
		t.Errorf("atoll-cloud's ServiceAccount was refused: %s", d)
	}
	for _, line := range forbiddenLines(t, e.logPath) {
		t.Errorf("atoll-cloud logged a refusal: %s", line)
	}
	for _, g := range grants {
		switch {
		case usedGrants[g] > 0:
			t.Logf("used %d times: %s", usedGrants[g], g)
		case gridsNotInE2E[g] != "":
			t.Logf("not used in the e2e: %s: %s", g, gridsNotInE2E[g])
		default:
			t.Errorf("deploy/%s grants %s, which atoll-cloud never used: drop it", testbed.GridsManifest, g)
		}
	}
}

func jsonValue(s string) *apiextensionsv1.JSON { return &apiextensionsv1.JSON{Raw: []byte(s)} }
