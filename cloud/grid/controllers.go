package grid

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/internal/wellknown"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
)

// Controller names (workqueue metrics, logs).
const (
	DeploymentGridController  = "deploymentgrid"
	StatefulSetGridController = "statefulsetgrid"
	ServiceGridController     = "servicegrid"
)

var deploymentGrids = gridKind[appsv1.DeploymentSpec]{
	kindOf:      deploymentKind,
	GridKind:    "DeploymentGrid",
	NewGrid:     func() client.Object { return &appsv1alpha1.DeploymentGrid{} },
	NewGridList: func() client.ObjectList { return &appsv1alpha1.DeploymentGridList{} },
	GridItems: func(l client.ObjectList) []client.Object {
		items := l.(*appsv1alpha1.DeploymentGridList).Items
		out := make([]client.Object, len(items))
		for i := range items {
			out[i] = &items[i]
		}
		return out
	},
	Spec: func(o client.Object, def string) (spec[appsv1.DeploymentSpec], *appsv1alpha1.Rollout) {
		g := o.(*appsv1alpha1.DeploymentGrid)
		return deploymentSpec(g, keyOr(g.Spec.GridUniqKey, def)), g.Spec.Rollout
	},
	Status: func(o client.Object) *appsv1alpha1.GridStatus { return &o.(*appsv1alpha1.DeploymentGrid).Status },
	Revision: func(o client.Object) (string, error) {
		s := o.(*appsv1alpha1.DeploymentGrid).Spec.DeepCopy()
		s.Rollout = nil
		return revisionOf(s)
	},
	NewChild:     func() client.Object { return &appsv1.Deployment{} },
	NewChildList: func() client.ObjectList { return &appsv1.DeploymentList{} },
	Items: func(l client.ObjectList) []client.Object {
		items := l.(*appsv1.DeploymentList).Items
		out := make([]client.Object, len(items))
		for i := range items {
			out[i] = &items[i]
		}
		return out
	},
	Observe:   observeDeployment,
	Completed: deploymentCompleted,
}

var statefulSetGrids = gridKind[appsv1.StatefulSetSpec]{
	kindOf:      statefulSetKind,
	GridKind:    "StatefulSetGrid",
	NewGrid:     func() client.Object { return &appsv1alpha1.StatefulSetGrid{} },
	NewGridList: func() client.ObjectList { return &appsv1alpha1.StatefulSetGridList{} },
	GridItems: func(l client.ObjectList) []client.Object {
		items := l.(*appsv1alpha1.StatefulSetGridList).Items
		out := make([]client.Object, len(items))
		for i := range items {
			out[i] = &items[i]
		}
		return out
	},
	Spec: func(o client.Object, def string) (spec[appsv1.StatefulSetSpec], *appsv1alpha1.Rollout) {
		g := o.(*appsv1alpha1.StatefulSetGrid)
		return statefulSetSpec(g, keyOr(g.Spec.GridUniqKey, def)), g.Spec.Rollout
	},
	Status: func(o client.Object) *appsv1alpha1.GridStatus { return &o.(*appsv1alpha1.StatefulSetGrid).Status },
	Revision: func(o client.Object) (string, error) {
		s := o.(*appsv1alpha1.StatefulSetGrid).Spec.DeepCopy()
		s.Rollout = nil
		return revisionOf(s)
	},
	NewChild:     func() client.Object { return &appsv1.StatefulSet{} },
	NewChildList: func() client.ObjectList { return &appsv1.StatefulSetList{} },
	Items: func(l client.ObjectList) []client.Object {
		items := l.(*appsv1.StatefulSetList).Items
		out := make([]client.Object, len(items))
		for i := range items {
			out[i] = &items[i]
		}
		return out
	},
	Observe:   observeStatefulSet,
	Completed: statefulSetCompleted,
}

func keyOr(key, def string) string {
	if key == "" {
		return def
	}
	return key
}

func revisionOf(v any) (string, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("revision: %w", err)
	}
	var m any
	if err := json.Unmarshal(raw, &m); err != nil {
		return "", fmt.Errorf("revision: %w", err)
	}
	return revision(m)
}

// Controllers are the grid controllers of one manager.
type Controllers struct {
	cfg     Config
	log     *slog.Logger
	metrics *metrics
	// units receives the grids to reconcile because their units changed
	// (see EnqueueUnit).
	units map[string]chan event.GenericEvent
	// unitEventsOn: unit events drive the grids of the unit label, so
	// Node events do not (see ConsumeUnitEvents).
	unitEventsOn atomic.Bool
}

// New registers the DeploymentGrid, StatefulSetGrid and ServiceGrid
// controllers with m (and the apps.atoll.io types with its scheme). They
// run on the leader only (see the package doc).
func New(cfg Config, m *manager.Manager, log *slog.Logger, reg prometheus.Registerer) (*Controllers, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	met, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("grid: metrics: %w", err)
	}
	c := &Controllers{
		cfg: cfg, log: log.With("component", "grid"), metrics: met,
		units: map[string]chan event.GenericEvent{
			DeploymentGridController:  make(chan event.GenericEvent, 1024),
			StatefulSetGridController: make(chan event.GenericEvent, 1024),
		},
	}
	if err := appsv1alpha1.AddToScheme(m.GetScheme()); err != nil {
		return nil, fmt.Errorf("grid: scheme: %w", err)
	}
	ctx := context.Background()
	idx := m.GetFieldIndexer()
	for _, o := range []client.Object{&appsv1.Deployment{}, &appsv1.StatefulSet{}, &corev1.Service{}} {
		if err := idx.IndexField(ctx, o, ownerIndex, func(o client.Object) []string {
			if ref := metav1.GetControllerOf(o); ref != nil && ref.APIVersion == appsv1alpha1.GroupVersion.String() {
				return []string{ref.Name}
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("grid: index %T: %w", o, err)
		}
	}
	cl, err := newClient(m, cfg)
	if err != nil {
		return nil, err
	}
	if err := setupWorkload(c, m, cl, DeploymentGridController, deploymentGrids, &appsv1alpha1.DeploymentGrid{}, &appsv1alpha1.DeploymentGridList{}, &appsv1.Deployment{}); err != nil {
		return nil, err
	}
	if err := setupWorkload(c, m, cl, StatefulSetGridController, statefulSetGrids, &appsv1alpha1.StatefulSetGrid{}, &appsv1alpha1.StatefulSetGridList{}, &appsv1.StatefulSet{}); err != nil {
		return nil, err
	}
	sr := &serviceReconciler{c: cl, cfg: cfg, log: c.log, rec: m.GetEventRecorderFor("atoll-grid"), metrics: met}
	err = builder.ControllerManagedBy(m).
		Named(ServiceGridController).
		For(&appsv1alpha1.ServiceGrid{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&corev1.Service{}).
		WatchesRawSource(m.TermSource(&appsv1alpha1.ServiceGridList{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: cfg.Workers}).
		Complete(m.LeaderOnly(sr))
	if err != nil {
		return nil, fmt.Errorf("grid: %s controller: %w", ServiceGridController, err)
	}
	return c, nil
}

// newClient is the controllers' client: reads from m's cache, writes
// within cfg's budget of their own.
func newClient(m *manager.Manager, cfg Config) (client.Client, error) {
	rc := rest.CopyConfig(m.GetConfig())
	rc.QPS, rc.Burst, rc.RateLimiter = cfg.QPS, cfg.Burst, nil
	cl, err := client.New(rc, client.Options{Scheme: m.GetScheme(), Mapper: m.GetRESTMapper(), Cache: &client.CacheOptions{Reader: m.GetCache()}})
	if err != nil {
		return nil, fmt.Errorf("grid: client: %w", err)
	}
	return cl, nil
}

func setupWorkload[S any](c *Controllers, m *manager.Manager, cl client.Client, name string, k gridKind[S], grid client.Object, grids client.ObjectList, child client.Object) error {
	r := &reconciler[S]{
		k: k, c: cl, cfg: c.cfg, log: c.log.With("controller", name),
		rec: m.GetEventRecorderFor("atoll-grid"), metrics: c.metrics,
		now: time.Now, applied: map[types.UID]int64{},
	}
	// What this replica applied is not known once another may lead.
	m.OnTerm(func(ctx context.Context) {
		<-ctx.Done()
		r.mu.Lock()
		clear(r.applied)
		r.mu.Unlock()
	})
	err := builder.ControllerManagedBy(m).
		Named(name).
		For(grid, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// Children it controls: status (readiness), hand edits and deletes.
		Owns(child).
		// Orphans labeled for a grid (adopted), objects in a child's way.
		Watches(child, handler.EnqueueRequestsFromMapFunc(r.orphanRequests)).
		// Pods of its children that come, go or change their reason not
		// to be ready: a unit's problem, which no child shows.
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(podGrid), builder.WithPredicates(podEvents)).
		// Units: nodes that join or leave a unit of a grid's key.
		Watches(&corev1.Node{}, nodeHandler(m.GetClient(), k, c.cfg.UnitLabel, &c.unitEventsOn, r.log)).
		// NodeUnits whose labels change: grids selecting units by them.
		Watches(&appsv1alpha1.NodeUnit{}, nodeUnitHandler(m.GetClient(), k, c.cfg.UnitLabel, r.log)).
		// Unit lifecycle events from the hub (EnqueueUnit).
		WatchesRawSource(source.Channel(c.units[name], &handler.EnqueueRequestForObject{})).
		// A new term: every grid, as a new leader's controller would.
		WatchesRawSource(m.TermSource(grids)).
		WithOptions(controller.Options{MaxConcurrentReconciles: c.cfg.Workers}).
		Complete(m.LeaderOnly(r))
	if err != nil {
		return fmt.Errorf("grid: %s controller: %w", name, err)
	}
	return nil
}

// nodeHandler enqueues the grids of kind k whose units a node event may
// change: a node that appears or goes with a grid's key, or whose value
// of the key changes.
func nodeHandler[S any](cl client.Reader, k gridKind[S], def string, unitEvents *atomic.Bool, log *slog.Logger) handler.EventHandler {
	enqueue := func(ctx context.Context, q queue, changed0 func(key string) bool) {
		changed := func(key string) bool {
			if key == def && unitEvents.Load() {
				return false // the unit events bring these
			}
			return changed0(key)
		}
		list := k.NewGridList()
		if err := cl.List(ctx, list); err != nil {
			log.Warn("node event: list grids", "kind", k.GridKind, "err", err)
			return
		}
		for _, g := range k.GridItems(list) {
			if s, _ := k.Spec(g, def); changed(s.Key) {
				q.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(g)})
			}
		}
	}
	has := func(o client.Object) func(string) bool {
		return func(key string) bool { return o.GetLabels()[key] != "" }
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q queue) { enqueue(ctx, q, has(e.Object)) },
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q queue) { enqueue(ctx, q, has(e.Object)) },
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q queue) {
			ol, nl := e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()
			if maps.Equal(ol, nl) {
				return
			}
			enqueue(ctx, q, func(key string) bool { return ol[key] != nl[key] })
		},
	}
}

type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]

// podGrid maps a pod of a grid's child (it carries the grid's labels) to
// the grid.
func podGrid(_ context.Context, o client.Object) []reconcile.Request {
	g, unit := o.GetLabels()[wellknown.LabelGrid], o.GetLabels()[wellknown.LabelGridUnit]
	if g == "" || unit == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: g}}}
}

// podEvents passes the pod events that may change a unit's problem: a
// pod created or deleted, or one whose reason not to be ready changed
// (its other status changes, a kubelet's retries of one failure
// included, change nothing in the grid).
var podEvents = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*corev1.Pod)
		n, ok2 := e.ObjectNew.(*corev1.Pod)
		if !ok1 || !ok2 {
			return true
		}
		or, om := podReason(o)
		nr, nm := podReason(n)
		return or != nr || om != nm || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil)
	},
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// nodeUnitHandler enqueues the grids of kind k, of the unit label, with an
// override selecting units by label (unitSelector), when a NodeUnit
// appears, goes, or has its labels changed: their children render from
// the NodeUnits' labels.
func nodeUnitHandler[S any](cl client.Reader, k gridKind[S], def string, log *slog.Logger) handler.EventHandler {
	enqueue := func(ctx context.Context, q queue) {
		list := k.NewGridList()
		if err := cl.List(ctx, list); err != nil {
			log.Warn("nodeunit event: list grids", "kind", k.GridKind, "err", err)
			return
		}
		for _, g := range k.GridItems(list) {
			if s, _ := k.Spec(g, def); s.Key == def && selectsUnits(s.Overrides) {
				q.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(g)})
			}
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, _ event.CreateEvent, q queue) { enqueue(ctx, q) },
		DeleteFunc: func(ctx context.Context, _ event.DeleteEvent, q queue) { enqueue(ctx, q) },
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q queue) {
			if !maps.Equal(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()) {
				enqueue(ctx, q)
			}
		},
	}
}

// selectsUnits reports whether an override selects units by label.
func selectsUnits(overrides []appsv1alpha1.Override) bool {
	for _, o := range overrides {
		if o.UnitSelector != nil {
			return true
		}
	}
	return false
}
