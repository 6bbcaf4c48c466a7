package hostrecords

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/wellknown"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
)

// GridsServed tells the module whether the apiserver serves the grid API
// (cloudapp: the grid controllers run). Without it the publisher does not
// run (there is nothing to watch).
type GridsServed bool

type params struct {
	fx.In
	Lifecycle fx.Lifecycle
	Config    Config
	Served    GridsServed
	Link      *hublink.Link
	Manager   *manager.Manager
	Log       *slog.Logger
	Registry  prometheus.Registerer
}

// Module runs the host records publisher with the app's Kubernetes
// manager, on every replica (active-active, see the package doc), when
// Config.Enabled and the grid API is served. It provides *Publisher, nil
// when it does not run.
var Module = fx.Module("hostrecords",
	fx.Provide(newForApp),
	fx.Invoke(func(*Publisher) {}),
)

func newForApp(p params) (*Publisher, error) {
	if !p.Config.Enabled || !bool(p.Served) {
		return nil, nil
	}
	pub, err := New(p.Config, p.Manager.GetClient(), p.Link, p.Log, p.Registry)
	if err != nil {
		return nil, err
	}
	if err := pub.SetupWithManager(p.Manager); err != nil {
		return nil, err
	}
	fxrun.Background(p.Lifecycle, p.Log, "hostrecords", pub.Run)
	return pub, nil
}

// SetupWithManager makes the publisher a controller of m: any change of a
// StatefulSetGrid, of a pod labeled for a grid, or of a Node's labels
// (units appear and go) asks for a pass.
func (p *Publisher) SetupWithManager(m *manager.Manager) error {
	if err := appsv1alpha1.AddToScheme(m.GetScheme()); err != nil {
		return fmt.Errorf("hostrecords: scheme: %w", err)
	}
	all := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{}}
	})
	err := builder.ControllerManagedBy(m).
		Named("hostrecords").
		For(&appsv1alpha1.StatefulSetGrid{}).
		Watches(&corev1.Pod{}, all, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			_, ok := o.GetLabels()[wellknown.LabelGrid]
			return ok
		}))).
		Watches(&corev1.Node{}, all, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		WithOptions(controller.Options{NeedLeaderElection: ptr.To(false), MaxConcurrentReconciles: 1}).
		Complete(reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
			p.Changed()
			return reconcile.Result{}, nil
		}))
	if err != nil {
		return fmt.Errorf("hostrecords: controller: %w", err)
	}
	return nil
}
