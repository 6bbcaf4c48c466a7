package objects

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/objectview"
)

type params struct {
	fx.In
	Lifecycle fx.Lifecycle
	Config    Config
	Link      *hublink.Link
	Manager   *manager.Manager
	Log       *slog.Logger
	Registry  prometheus.Registerer
	// Signer, when the app provides it, signs every view (the edges
	// verify what a unit peer relays to them with it).
	Signer ViewSigner `optional:"true"`
}

// ViewSigner signs the views (identity.Issuer.ViewSigner).
type ViewSigner events.Signer

// Module runs the object views publisher with the app's Kubernetes
// manager: it reads from the manager's cache and is one controller per
// kind, on every replica (not only the leader: see the package doc).
var Module = fx.Module("objectviews",
	fx.Provide(newForApp),
	fx.Invoke(func(*Publisher) {}),
)

func newForApp(p params) (*Publisher, error) {
	pub, err := New(p.Config, p.Manager.GetClient(), p.Link, p.Log, newMetrics(p.Registry), p.Signer)
	if err != nil {
		return nil, err
	}
	if !p.Config.Enabled {
		return pub, nil
	}
	if err := pub.SetupWithManager(p.Manager); err != nil {
		return nil, err
	}
	fxrun.Background(p.Lifecycle, p.Log, "objectviews", pub.Run)
	return pub, nil
}

// SetupWithManager makes the publisher a controller of m for each kind:
// every event marks its object for the next pass.
func (p *Publisher) SetupWithManager(m *manager.Manager) error {
	for kind, obj := range map[string]client.Object{
		objectview.KindNodes:          &corev1.Node{},
		objectview.KindServices:       &corev1.Service{},
		objectview.KindEndpointSlices: &discoveryv1.EndpointSlice{},
		objectview.KindEndpoints:      &corev1.Endpoints{},
	} {
		err := builder.ControllerManagedBy(m).
			Named("objectviews-" + kind).
			For(obj).
			WithOptions(controller.Options{NeedLeaderElection: ptr.To(false), MaxConcurrentReconciles: 1}).
			Complete(reconcile.Func(func(_ context.Context, r reconcile.Request) (reconcile.Result, error) {
				p.Changed(kind, r.Namespace, r.Name)
				return reconcile.Result{}, nil
			}))
		if err != nil {
			return fmt.Errorf("objects: controller for %s: %w", kind, err)
		}
	}
	return nil
}
