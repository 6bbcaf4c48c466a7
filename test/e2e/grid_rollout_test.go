package e2e

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestGridRollout: a template change rolls out unit by unit
// (maxUnavailableUnits 1). Unit a's nodes are too small for the new
// template (the real scheduler leaves its new pod pending), so a is not
// Ready within the progress deadline: the rollout stops there
// (Progressing=False, a Warning Event) and b and c keep the old template.
// A resume (what `atoll grid resume` writes) passes a, and b and c get the
// new template one after the other.
func TestGridRollout(t *testing.T) {
	e := startGrids(t)
	ctx := t.Context()
	ns := "rollout"
	if err := e.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	nodes := map[string][]string{"a": e.addUnit(t, "a", 2, "1")}
	for _, u := range []string{"b", "c"} {
		nodes[u] = e.addUnit(t, u, 2, "")
	}
	tpl := webTemplate("web:v1", 1)
	tpl.Template.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}
	g := &appsv1alpha1.DeploymentGrid{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: appsv1alpha1.DeploymentGridSpec{
			Template: tpl,
			Rollout:  &appsv1alpha1.Rollout{MaxUnavailableUnits: ptr.To[int32](1), ProgressDeadlineSeconds: ptr.To[int32](15)},
		},
	}
	if err := e.c.Create(ctx, g); err != nil {
		t.Fatal(err)
	}
	grid := func() (*appsv1alpha1.DeploymentGrid, error) {
		var cur appsv1alpha1.DeploymentGrid
		return &cur, e.c.Get(ctx, client.ObjectKeyFromObject(g), &cur)
	}
	ready := func(units int) func() error {
		return func() error {
			cur, err := grid()
			if err != nil {
				return err
			}
			if cur.Status.ObservedGeneration != cur.Generation || int(cur.Status.ReadyUnits) != units {
				return fmt.Errorf("%d ready units at generation %d/%d", cur.Status.ReadyUnits, cur.Status.ObservedGeneration, cur.Generation)
			}
			return nil
		}
	}
	poll.Eventually(t, 60*time.Second, ready(3))
	poll.Eventually(t, 60*time.Second, e.placed(ns, "web", nodes))

	// images by unit, from the Deployments.
	images := func() (map[string]string, error) {
		ds, err := e.deployments(ns, "web")
		if err != nil {
			return nil, err
		}
		out := map[string]string{}
		for u, d := range ds {
			out[u] = d.Spec.Template.Spec.Containers[0].Image
		}
		return out, nil
	}

	// v2 asks for 2 CPUs: more than a's nodes have.
	patch := `{"spec":{"template":{"template":{"spec":{"containers":[{"name":"web","image":"web:v2","resources":{"requests":{"cpu":"2"}}}]}}}}}`
	if err := e.c.Patch(ctx, g, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 60*time.Second, func() error {
		cur, err := grid()
		if err != nil {
			return err
		}
		c := meta.FindStatusCondition(cur.Status.Conditions, appsv1alpha1.ConditionProgressing)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != "ProgressDeadlineExceeded" {
			return fmt.Errorf("Progressing %+v", c)
		}
		if r := cur.Status.Rollout; r == nil || !slices.Equal(r.Stalled, []string{"a"}) || !slices.Equal(r.Pending, []string{"b", "c"}) {
			return fmt.Errorf("rollout %+v", cur.Status.Rollout)
		}
		return nil
	})
	im, err := images()
	if err != nil {
		t.Fatal(err)
	}
	if im["a"] != "web:v2" || im["b"] != "web:v1" || im["c"] != "web:v1" {
		t.Fatalf("images after the stall %v: want a on v2, b and c on v1", im)
	}
	poll.Eventually(t, 30*time.Second, func() error {
		var evs corev1.EventList
		if err := e.c.List(ctx, &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Name == "web" && ev.Reason == "ProgressDeadlineExceeded" && ev.Type == corev1.EventTypeWarning {
				return nil
			}
		}
		return errors.New("no ProgressDeadlineExceeded Event")
	})

	// Resume: b, then c, get v2; a stays skipped.
	resume := fmt.Sprintf(`{"spec":{"rollout":{"resume":%q}}}`, time.Now().UTC().Format(time.RFC3339Nano))
	if err := e.c.Patch(ctx, g, client.RawPatch(types.MergePatchType, []byte(resume))); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 90*time.Second, func() error {
		im, err := images()
		if err != nil {
			return err
		}
		if im["b"] != "web:v2" || im["c"] != "web:v2" {
			return fmt.Errorf("images %v", im)
		}
		cur, err := grid()
		if err != nil {
			return err
		}
		if r := cur.Status.Rollout; r == nil || !slices.Equal(r.Skipped, []string{"a"}) || len(r.Pending) > 0 {
			return fmt.Errorf("rollout %+v", cur.Status.Rollout)
		}
		if cur.Status.ReadyUnits != 2 {
			return fmt.Errorf("%d ready units, want b and c", cur.Status.ReadyUnits)
		}
		return nil
	})
}
