package members

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/hublink"
)

type params struct {
	fx.In
	Lifecycle fx.Lifecycle
	Config    Config
	Link      *hublink.Link
	Manager   *manager.Manager `optional:"true"`
	Log       *slog.Logger
	Registry  prometheus.Registerer
	Events    *eventbus.Metrics
	Gate      EdgeGate `optional:"true"` // the identity service
	Keys      NodeKeys `optional:"true"` // the identity service
}

// Module runs the topology service with the app. With the kubernetes
// source it needs the *manager.Manager: it reads Nodes from the manager's
// cache and is one of its controllers; given an EdgeGate (the identity
// service), it suspends the hub link of an edge whose Node is deleted;
// given NodeKeys (the identity service), it publishes each member's
// identity key in its unit view.
var Module = fx.Module("members",
	fx.Provide(newForApp),
	fx.Invoke(func(*Service) {}),
)

func newForApp(p params) (*Service, error) {
	if p.Config.Source == SourceKubernetes && p.Manager == nil {
		return nil, fmt.Errorf("members: the %s membership source needs the Kubernetes manager", SourceKubernetes)
	}
	var s *Service
	if p.Config.Source == SourceKubernetes {
		svc, err := New(p.Config, p.Link, p.Manager.NodeLister(), p.Log, newMetrics(p.Registry), p.Events)
		if err != nil {
			return nil, err
		}
		if err := svc.SetupWithManager(p.Manager); err != nil {
			return nil, err
		}
		if p.Gate != nil {
			svc.SetEdgeGate(p.Gate)
		}
		s = svc
	} else {
		svc, err := New(p.Config, p.Link, nil, p.Log, newMetrics(p.Registry), p.Events)
		if err != nil {
			return nil, err
		}
		s = svc
	}
	p.Registry.MustRegister(s.AgentsBehind())
	p.Registry.MustRegister(s.UnitEventCollectors()...)
	if p.Keys != nil {
		s.SetNodeKeys(p.Keys)
	}
	fxrun.Background(p.Lifecycle, p.Log, "members", s.Run)
	return s, nil
}

// ControllerName names the topology controller (its workqueue metrics).
const ControllerName = "members"

// SetupWithManager makes the service a controller of m: every Node change
// recomputes that node's assignment and its units' views (NodeChanged),
// and republishes those that changed. It runs on every
// replica, not only the leader: views are content-addressed (their message
// id is their fingerprint), so replicas publishing the same view are
// deduplicated by the hub, and each replica keeps serving the edge while
// another one leads.
func (s *Service) SetupWithManager(m *manager.Manager) error {
	err := builder.ControllerManagedBy(m).
		Named(ControllerName).
		For(&corev1.Node{}).
		WithOptions(controller.Options{NeedLeaderElection: ptr.To(false), MaxConcurrentReconciles: 1}).
		Complete(reconcile.Func(func(_ context.Context, req reconcile.Request) (reconcile.Result, error) {
			s.NodeChanged(req.Name)
			return reconcile.Result{}, nil
		}))
	if err != nil {
		return fmt.Errorf("members: controller: %w", err)
	}
	return nil
}
