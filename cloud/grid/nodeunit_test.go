package grid_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/atoll-edge/atoll/internal/wellknown"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestUnitSelectorFollowsNodeUnitLabels: an override that selects units
// by their NodeUnit's labels follows the labels as they change, with no
// resync and no Node event.
func TestUnitSelectorFollowsNodeUnitLabels(t *testing.T) {
	cluster := kubetest.Start(t)
	installCRDs(t, cluster)
	log := natstest.Logger(t, slog.LevelWarn)
	run := startControllers(t, cluster, log)
	ctx := t.Context()
	c := run.client(t, cluster)
	for _, u := range []string{"a", "b"} {
		if err := c.Create(ctx, node(u+"-1", map[string]string{wellknown.LabelUnit: u})); err != nil {
			t.Fatal(err)
		}
		if err := c.Create(ctx, &appsv1alpha1.NodeUnit{ObjectMeta: metav1.ObjectMeta{Name: u}, Spec: appsv1alpha1.NodeUnitSpec{UnitLabel: wellknown.LabelUnit}}); err != nil {
			t.Fatal(err)
		}
	}
	g := webGrid("default")
	g.Spec.Overrides = []appsv1alpha1.Override{{
		UnitSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "gold"}},
		Images:       map[string]string{"web": "nginx:gold"},
	}}
	if err := c.Create(ctx, g); err != nil {
		t.Fatal(err)
	}
	images := func(want map[string]string) func() error {
		return func() error {
			for unit, image := range want {
				var d appsv1.Deployment
				if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "web-" + unit}, &d); err != nil {
					return err
				}
				if got := d.Spec.Template.Spec.Containers[0].Image; got != image {
					return fmt.Errorf("web-%s runs %s, want %s", unit, got, image)
				}
			}
			return nil
		}
	}
	poll.Eventually(t, 30*time.Second, images(map[string]string{"a": "nginx:1", "b": "nginx:1"}))
	label := func(unit, value string) {
		t.Helper()
		v := "null"
		if value != "" {
			v = fmt.Sprintf("%q", value)
		}
		patch := client.RawPatch(types.MergePatchType, []byte(fmt.Sprintf(`{"metadata":{"labels":{"tier":%s}}}`, v)))
		if err := c.Patch(ctx, &appsv1alpha1.NodeUnit{ObjectMeta: metav1.ObjectMeta{Name: unit}}, patch); err != nil {
			t.Fatal(err)
		}
	}
	label("b", "gold")
	poll.Eventually(t, 20*time.Second, images(map[string]string{"a": "nginx:1", "b": "nginx:gold"}))
	label("b", "")
	label("a", "gold")
	poll.Eventually(t, 20*time.Second, images(map[string]string{"a": "nginx:gold", "b": "nginx:1"}))
}
